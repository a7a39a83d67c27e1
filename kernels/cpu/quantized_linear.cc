#include "kernels/cpu/quantized_linear.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/host_memory.h"
#include "kernels/cpu/linear_dispatch.h"
#include "kernels/cpu/panel_split.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/quantized_panels.h"
#include "kernels/dtype.h"

namespace kiln::cpu {
namespace {

using quantized::kInt4GroupBytes;
using quantized::kInt4GroupWeightBytes;
using quantized::kInt4PanelColumns;
using quantized::kInt8PanelColumns;
using quantized::kKAlign;
using quantized::kMaxK;
using quantized::kMaxRowsPerPass;
using quantized::kQuadBytesInt8;
using quantized::PackedView;
using quantized::PrefetchPanelStarts;
using quantized::QuantizeActivations;
using quantized::QuantizedActivations;
using quantized::RunPanelGroup;

// A thread gets at least this many weight bytes to read (counted once per pass of rows): below
// it the fork/join costs more than the second core saves. Lower than the small-M kernel's: at
// 512 KiB the 0.45-1 MB quantized qkv and o projections ran on one thread, 30-40 % slower.
constexpr int64_t kMinBytesPerThread = int64_t{128} << 10;

int64_t PanelColumns(Quantization kind) {
  return kind == Quantization::kInt8 ? kInt8PanelColumns : kInt4PanelColumns;
}

// The names of the two layouts as PackedImage keeps them; a change to either layout changes its
// version, so an old image is unpacked and packed again rather than misread.
constexpr absl::string_view kInt8Layout = "cpu.int8.panel64.v1";
constexpr absl::string_view kInt4Layout = "cpu.int4.panel32.group32.v1";
absl::string_view LayoutName(Quantization kind) {
  return kind == Quantization::kInt8 ? kInt8Layout : kInt4Layout;
}

// One call's quantized activations, per calling thread (they only grow).
thread_local QuantizedActivations tls_activations;

// ---- Packing --------------------------------------------------------------------------------

// Output row `n` of the stacked row blocks, as fp32 (K values) in `out`.
void ReadRow(const LinearPackSpec& spec, int64_t n, float* out) {
  for (const WeightView& block : spec.row_blocks) {
    if (n < block.rows) {
      const size_t row_bytes = static_cast<size_t>(block.cols) * DTypeSize(block.dtype);
      ConvertToF32(block.dtype, block.data + static_cast<size_t>(n) * row_bytes, block.cols, out);
      return;
    }
    n -= block.rows;
  }
}

KILN_VNNI_TARGET uint16_t ToF16(float value) { return _cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT); }

// One int8 panel: per column the scale max|w| / 127 and q = round(w / scale), stored q + 128.
void PackInt8Panel(const LinearPackSpec& spec, int64_t k, int64_t k_padded, int64_t n, int64_t p,
                   uint8_t* panel, float* scales, std::vector<float>& row) {
  std::memset(panel, 128, static_cast<size_t>(k_padded * kInt8PanelColumns));
  for (int64_t c = 0; c < kInt8PanelColumns; ++c) {
    const int64_t column = p * kInt8PanelColumns + c;
    scales[c] = 0.0f;
    if (column >= n) continue;
    ReadRow(spec, column, row.data());
    float max_abs = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < k; ++i) {
      max_abs = std::max(max_abs, std::fabs(row[i]));
      finite = finite && std::isfinite(row[i]);
    }
    if (!finite) max_abs = std::numeric_limits<float>::quiet_NaN();  // the outputs become NaN
    scales[c] = max_abs / 127.0f;
    if (!(max_abs > 0.0f)) continue;  // zero or NaN: q stays 0
    const float inverse = 127.0f / max_abs;
    const int64_t b = c / 16, lane = c % 16;
    for (int64_t i = 0; i < k; ++i) {
      const float q = std::clamp(std::nearbyint(row[i] * inverse), -127.0f, 127.0f);
      panel[(i / 4) * kQuadBytesInt8 + b * 64 + lane * 4 + i % 4] =
          static_cast<uint8_t>(static_cast<int>(q) + 128);
    }
  }
}

// One int4 panel: per column and group of 32 the scale d = w_max / -8 (w_max the value of largest
// magnitude, as q4_0 does, so all 16 levels are used), rounded to fp16 before q = round(w / d) is
// taken against it, q in [-8, 7], stored q + 8.
void PackInt4Panel(const LinearPackSpec& spec, int64_t k, int64_t k_padded, int64_t n, int64_t p,
                   uint8_t* panel, std::vector<float>& row) {
  const int64_t groups = k_padded / kInt4GroupSize;
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* block = panel + g * kInt4GroupBytes;
    std::memset(block, 0x88, kInt4GroupWeightBytes);  // q = 0 in both nibbles
    std::memset(block + kInt4GroupWeightBytes, 0, kInt4GroupBytes - kInt4GroupWeightBytes);
  }
  for (int64_t c = 0; c < kInt4PanelColumns; ++c) {
    const int64_t column = p * kInt4PanelColumns + c;
    if (column >= n) continue;
    ReadRow(spec, column, row.data());
    const int64_t b = c / 16, lane = c % 16;
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* block = panel + g * kInt4GroupBytes;
      const int64_t first = g * kInt4GroupSize;
      const int64_t last = std::min(k, first + kInt4GroupSize);
      float extreme = 0.0f;
      for (int64_t i = first; i < last; ++i) {
        if (std::fabs(row[i]) > std::fabs(extreme) || std::isnan(row[i])) extreme = row[i];
      }
      const uint16_t scale_bits = ToF16(extreme / -8.0f);
      std::memcpy(block + kInt4GroupWeightBytes + 2 * c, &scale_bits, sizeof(scale_bits));
      const float scale = F16ToF32(scale_bits);
      if (!(scale != 0.0f) || !std::isfinite(scale)) continue;
      const float inverse = 1.0f / scale;
      for (int64_t i = first; i < last; ++i) {
        const int q = static_cast<int>(std::clamp(std::nearbyint(row[i] * inverse), -8.0f, 7.0f));
        const int64_t within = i - first;  // 8 quads: load within / 8, nibble (within / 4) % 2
        uint8_t& byte = block[(b * 4 + within / 8) * 64 + lane * 4 + within % 4];
        const int shift = (within / 4) % 2 == 0 ? 0 : 4;
        byte = static_cast<uint8_t>((byte & ~(0x0f << shift)) | ((q + 8) << shift));
      }
    }
  }
}

class QuantizedLinear final : public PackedLinear {
 public:
  QuantizedLinear(const LinearPackSpec& spec, Quantization kind, int64_t k, int64_t n)
      : name_(spec.name), compute_dtype_(spec.compute_dtype) {
    view_.kind = kind;
    view_.k = k;
    view_.n = n;
    view_.k_padded = (k + kKAlign - 1) / kKAlign * kKAlign;
    const int64_t columns = PanelColumns(view_.kind);
    view_.panels = (n + columns - 1) / columns;
    view_.panel_bytes = view_.kind == Quantization::kInt8
                            ? view_.k_padded * kInt8PanelColumns
                            : view_.k_padded / kInt4GroupSize * kInt4GroupBytes;
  }

  size_t data_bytes() const { return static_cast<size_t>(view_.panels * view_.panel_bytes); }
  size_t scale_bytes() const {
    return view_.kind == Quantization::kInt8
               ? static_cast<size_t>(view_.panels * kInt8PanelColumns) * sizeof(float)
               : 0;
  }

  // Throws std::bad_alloc.
  void Pack(const LinearPackSpec& spec, int threads) {
    data_ = AllocateWeights(data_bytes());
    if (view_.kind == Quantization::kInt8) scales_ = AllocateWeights(scale_bytes());
    SetBias(spec);
    auto* data = reinterpret_cast<uint8_t*>(data_.mutable_data());
    auto* scales = reinterpret_cast<float*>(scales_.mutable_data());
#pragma omp parallel num_threads(std::max(threads, 1))
    {
      std::vector<float> row(static_cast<size_t>(view_.k));
#pragma omp for schedule(dynamic, 4)
      for (int64_t p = 0; p < view_.panels; ++p) {
        uint8_t* panel = data + p * view_.panel_bytes;
        if (view_.kind == Quantization::kInt8) {
          PackInt8Panel(spec, view_.k, view_.k_padded, view_.n, p, panel,
                        scales + p * kInt8PanelColumns, row);
        } else {
          PackInt4Panel(spec, view_.k, view_.k_padded, view_.n, p, panel, row);
        }
      }
    }
    view_.data = data;
    view_.scales = scales;
  }

  // Why spec.prepacked cannot be adopted (empty when it can).
  std::string AdoptRefusal(const PackedImage& image) const {
    if (image.layout != LayoutName(view_.kind)) {
      return absl::StrCat("layout ", image.layout, " is not ", LayoutName(view_.kind));
    }
    const PackedImage::Part* weights = image.Find("weights");
    const PackedImage::Part* scales = image.Find("scales");
    const size_t parts = view_.kind == Quantization::kInt8 ? 2 : 1;
    if (image.parts.size() != parts || weights == nullptr || weights->bytes != data_bytes() ||
        (view_.kind == Quantization::kInt8 &&
         (scales == nullptr || scales->bytes != scale_bytes()))) {
      return absl::StrCat("the image's parts are not those of ", LayoutName(view_.kind), " [",
                          view_.n, ", ", view_.k, "]");
    }
    return "";
  }

  // Takes an accepted image's bytes, where they lie or copied on up to `threads` threads
  // (AdoptPart). Throws std::bad_alloc.
  void Adopt(const LinearPackSpec& spec, int threads) {
    const PackedImage& image = *spec.prepacked;
    data_ = AdoptPart(image, *image.Find("weights"), threads);
    view_.data = reinterpret_cast<const uint8_t*>(data_.data());
    if (view_.kind == Quantization::kInt8) {
      scales_ = AdoptPart(image, *image.Find("scales"), threads);
      view_.scales = reinterpret_cast<const float*>(scales_.data());
    }
    SetBias(spec);
    adopted_ = true;
  }

  std::optional<PackedImage> Image() const override {
    PackedImage image;
    image.layout = std::string(LayoutName(view_.kind));
    image.dtype = compute_dtype_;
    image.quantization = view_.kind;
    image.rows = view_.n;
    image.cols = view_.k;
    image.parts.push_back(
        {"weights", reinterpret_cast<const std::byte*>(view_.data), data_bytes()});
    if (view_.kind == Quantization::kInt8) {
      image.parts.push_back(
          {"scales", reinterpret_cast<const std::byte*>(view_.scales), scale_bytes()});
    }
    return image;
  }
  bool adopted() const override { return adopted_; }
  bool adopted_in_place() const override { return data_.in_place(); }

  // Points the view at an accepted image's bytes where they lie, unowned, for Dequantize only
  // (the kernels' aligned loads need Adopt's copies).
  void ViewInPlace(const PackedImage& image) {
    view_.data = reinterpret_cast<const uint8_t*>(image.Find("weights")->data);
    if (view_.kind == Quantization::kInt8) {
      view_.scales = reinterpret_cast<const float*>(image.Find("scales")->data);
    }
  }

  // W[n, k] as fp32: q · scale, the weights the kernels multiply by. Reads the view at any
  // alignment.
  void Dequantize(float* out) const {
#pragma omp parallel for schedule(static)
    for (int64_t column = 0; column < view_.n; ++column) {
      const int64_t p = column / PanelColumns(view_.kind);
      const int64_t c = column % PanelColumns(view_.kind);
      const int64_t b = c / 16, lane = c % 16;
      const uint8_t* panel = view_.data + p * view_.panel_bytes;
      float* row = out + column * view_.k;
      for (int64_t i = 0; i < view_.k; ++i) {
        if (view_.kind == Quantization::kInt8) {
          const int q = panel[(i / 4) * kQuadBytesInt8 + b * 64 + lane * 4 + i % 4] - 128;
          float scale;
          std::memcpy(&scale, view_.scales + p * kInt8PanelColumns + c, sizeof(scale));
          row[i] = static_cast<float>(q) * scale;
        } else {
          const uint8_t* block = panel + (i / kInt4GroupSize) * kInt4GroupBytes;
          const int64_t within = i % kInt4GroupSize;
          const uint8_t byte = block[(b * 4 + within / 8) * 64 + lane * 4 + within % 4];
          const int q = ((within / 4) % 2 == 0 ? byte & 0x0f : byte >> 4) - 8;
          uint16_t scale_bits;
          std::memcpy(&scale_bits, block + kInt4GroupWeightBytes + 2 * c, sizeof(scale_bits));
          row[i] = static_cast<float>(q) * F16ToF32(scale_bits);
        }
      }
    }
  }

  const std::string& name() const override { return name_; }
  int64_t in_features() const override { return view_.k; }
  int64_t out_features() const override { return view_.n; }
  DType compute_dtype() const override { return compute_dtype_; }
  Quantization quantization() const override { return view_.kind; }
  size_t packed_bytes() const override { return packed_bytes_; }
  std::string kernel_name() const override {
    return view_.kind == Quantization::kInt8 ? "vnni int8 (per channel)" : "vnni int4 (group 32)";
  }

  LinearShape shape() const {
    return LinearShape{view_.k, view_.n, compute_dtype_, view_.bias != nullptr, view_.kind};
  }
  void set_max_streams(int streams) { max_streams_ = streams; }
  int max_streams() const { return max_streams_; }

  void Forward(const float* x, int64_t m, float* y, int threads) const {
    // Each pass of up to 4 rows reads the weight once (from cache after the first): prefill is
    // worth the fork even for a small weight.
    const int64_t passes = (m + kMaxRowsPerPass - 1) / kMaxRowsPerPass;
    const int64_t useful_threads =
        std::clamp<int64_t>(view_.panels * view_.panel_bytes * passes / kMinBytesPerThread, 1,
                            std::min<int64_t>(threads, view_.panels));
    if (m > kMaxRowsPerPass) {
      // More than 4 rows take passes of 4 over one panel at a time, from activations quantized
      // once.
      QuantizedActivations& a = tls_activations;
      QuantizeActivations(view_, x, m, a);
      ForPanelStreams(
          view_.panels, 1, static_cast<int>(useful_threads),
          [&](const int64_t* first, int count) { RunPanelGroup(view_, a, m, first, count, y); });
      return;
    }
    // A decode's few rows: every thread quantizes them for itself as soon as it has the job,
    // while the first lines of its panels are on their way, rather than the others waiting for
    // the calling thread to quantize them (0.4-3.9 µs of a 13-70 µs int4 call). The rows' lines
    // are asked for at once first: the other thread wrote them, on another CCD a cache-line
    // transfer takes about 150 ns, and the quantizing loop alone kept too few in flight
    // (alternating in one process, a layer's four int4 linears took 1-2 % less).
    const int64_t streams = std::min<int64_t>(max_streams_, StreamsForRows(m));
    ForPanelStreams(
        view_.panels, static_cast<int>(streams), static_cast<int>(useful_threads),
        [&](const int64_t* first, int count) {
          PrefetchRangeToL2(x, m * view_.k * static_cast<int64_t>(sizeof(float)));
          PrefetchPanelStarts(view_, first, count);
          QuantizeActivations(view_, x, m, tls_activations);
        },
        [&](const int64_t* first, int count) {
          RunPanelGroup(view_, tls_activations, m, first, count, y);
        });
  }

 private:
  static std::byte* Allocate(size_t bytes) {
    void* p = AllocateHost(std::max<size_t>(bytes, 64));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<std::byte*>(p);
  }

  void SetBias(const LinearPackSpec& spec) {
    packed_bytes_ = data_bytes() + scale_bytes();
    if (spec.bias.empty()) return;
    bias_.reset(Allocate(spec.bias.size() * sizeof(float)));
    std::memcpy(bias_.get(), spec.bias.data(), spec.bias.size() * sizeof(float));
    packed_bytes_ += spec.bias.size() * sizeof(float);
    view_.bias = reinterpret_cast<const float*>(bias_.get());
  }

  const std::string name_;
  const DType compute_dtype_;
  PackedView view_;
  WeightBytes data_;    // the packed (or adopted) weights
  WeightBytes scales_;  // int8's per-column scales
  HostBytes bias_;
  size_t packed_bytes_ = 0;
  bool adopted_ = false;
  int max_streams_ = 2;  // ChooseQuantizedStreams (kStreamCounts[0] until then)
};

// The quantization and shape of an image in one of the two layouts; InvalidArgument otherwise.
absl::Status CheckImage(const PackedImage& image) {
  if ((image.layout != kInt8Layout && image.layout != kInt4Layout) ||
      image.quantization !=
          (image.layout == kInt8Layout ? Quantization::kInt8 : Quantization::kInt4)) {
    return absl::InvalidArgumentError(absl::StrCat("packed layout ", image.layout, " with ",
                                                   QuantizationName(image.quantization),
                                                   " weights is not a quantized CPU layout"));
  }
  if (image.rows <= 0 || image.cols <= 0 || image.cols > kMaxK ||
      image.rows > (int64_t{1} << 40) / image.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed image of shape [", image.rows, ", ", image.cols, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

bool QuantizedKernelSupported() {
  return Avx512Supported() && __builtin_cpu_supports("avx512vnni") &&
         __builtin_cpu_supports("f16c");
}

std::string QuantizedPackRefusal(const LinearPackSpec& spec) {
  if (spec.quantization == Quantization::kNone) return "no quantization asked for";
  if (!QuantizedKernelSupported()) return "this CPU has no AVX-512 VNNI";
  if (!spec.row_blocks.empty() && spec.row_blocks.front().cols > kMaxK) {
    return absl::StrCat("K = ", spec.row_blocks.front().cols, " is above ", kMaxK,
                        ", where int32 sums could overflow");
  }
  return "";
}

absl::StatusOr<std::unique_ptr<PackedLinear>> PackQuantizedLinear(const LinearPackSpec& spec,
                                                                  int threads) {
  auto invalid = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("PackLinear(", spec.name, "): ", parts...));
  };
  if (const std::string refusal = QuantizedPackRefusal(spec); !refusal.empty()) {
    return invalid("cannot quantize to ", QuantizationName(spec.quantization), ": ", refusal);
  }
  if (spec.row_blocks.empty()) return invalid("no row blocks");
  const int64_t k = spec.row_blocks.front().cols;
  int64_t n = 0;
  for (size_t i = 0; i < spec.row_blocks.size(); ++i) {
    const WeightView& block = spec.row_blocks[i];
    if (block.cols != k || block.rows <= 0 || block.cols <= 0 || block.data == nullptr) {
      return invalid("row block ", i, " is [", block.rows, ", ", block.cols,
                     "]; every block needs rows, data and ", k, " cols");
    }
    n += block.rows;
  }
  if (!spec.bias.empty() && static_cast<int64_t>(spec.bias.size()) != n) {
    return invalid("bias has ", spec.bias.size(), " values for ", n, " output rows");
  }
  auto linear = std::make_unique<QuantizedLinear>(spec, spec.quantization, k, n);
  try {
    linear->Pack(spec, threads);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("PackLinear(", spec.name, "): out of memory"));
  }
  return std::unique_ptr<PackedLinear>(std::move(linear));
}

std::string QuantizedAdoptRefusal(const LinearPackSpec& spec) {
  const PackedImage& image = *spec.prepacked;
  if (!QuantizedKernelSupported()) return "this CPU has no AVX-512 VNNI";
  if (absl::Status valid = CheckImage(image); !valid.ok()) return std::string(valid.message());
  if (spec.quantization != image.quantization) {
    return absl::StrCat("the image holds ", QuantizationName(image.quantization), " weights, ",
                        QuantizationName(spec.quantization), " were asked for");
  }
  return QuantizedLinear(spec, image.quantization, image.cols, image.rows).AdoptRefusal(image);
}

absl::StatusOr<std::unique_ptr<PackedLinear>> AdoptQuantizedLinear(const LinearPackSpec& spec,
                                                                   int threads) {
  if (const std::string refusal = QuantizedAdoptRefusal(spec); !refusal.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("PackLinear(", spec.name, "): cannot adopt the packed image: ", refusal));
  }
  const PackedImage& image = *spec.prepacked;
  if (!spec.bias.empty() && static_cast<int64_t>(spec.bias.size()) != image.rows) {
    return absl::InvalidArgumentError(absl::StrCat("PackLinear(", spec.name, "): bias has ",
                                                   spec.bias.size(), " values for ", image.rows,
                                                   " output rows"));
  }
  auto linear = std::make_unique<QuantizedLinear>(spec, image.quantization, image.cols, image.rows);
  try {
    linear->Adopt(spec, threads);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("PackLinear(", spec.name, "): out of memory"));
  }
  return std::unique_ptr<PackedLinear>(std::move(linear));
}

absl::StatusOr<std::vector<float>> DequantizeImage(const PackedImage& image) {
  KILN_RETURN_IF_ERROR(CheckImage(image));
  LinearPackSpec spec;
  spec.name = "unpack";
  QuantizedLinear linear(spec, image.quantization, image.cols, image.rows);
  if (const std::string refusal = linear.AdoptRefusal(image); !refusal.empty()) {
    return absl::InvalidArgumentError(refusal);
  }
  linear.ViewInPlace(image);
  try {
    std::vector<float> plain(static_cast<size_t>(image.rows * image.cols));
    linear.Dequantize(plain.data());
    return plain;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("unpacking a quantized image: out of memory");
  }
}

bool IsQuantizedLinear(const PackedLinear& linear) {
  return dynamic_cast<const QuantizedLinear*>(&linear) != nullptr;
}

absl::Status RunQuantizedLinear(const PackedLinear& linear, const float* x, int64_t m, float* y,
                                int threads) {
  const auto* quantized = dynamic_cast<const QuantizedLinear*>(&linear);
  if (quantized == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(linear.name(), " is not a quantized linear"));
  }
  if (m < 0 || (m > 0 && (x == nullptr || y == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat(linear.name(), ": bad input or output"));
  }
  if (m > 0) quantized->Forward(x, m, y, threads);
  return absl::OkStatus();
}

void ChooseQuantizedStreams(absl::Span<PackedLinear* const> linears, int threads) {
  std::vector<StreamShape> shapes;
  std::vector<std::vector<QuantizedLinear*>> members;
  for (PackedLinear* linear : linears) {
    auto* quantized = dynamic_cast<QuantizedLinear*>(linear);
    if (quantized == nullptr) continue;
    const LinearShape shape = quantized->shape();
    size_t i = 0;
    while (i < shapes.size() && !(shapes[i].shape == shape)) ++i;
    if (i == shapes.size()) {
      shapes.push_back(StreamShape{shape, quantized->packed_bytes(), 0, nullptr});
      members.emplace_back();
    }
    shapes[i].total_bytes += quantized->packed_bytes();
    members[i].push_back(quantized);
  }
  // One input row and output row, sized for the widest shape.
  std::vector<float> x;
  std::vector<float> y;
  for (size_t i = 0; i < shapes.size(); ++i) {
    x.resize(std::max(x.size(), static_cast<size_t>(shapes[i].shape.k)), 0.5f);
    y.resize(std::max(y.size(), static_cast<size_t>(shapes[i].shape.n)));
    shapes[i].round = [&x, &y, &group = members[i], threads](int streams) {
      size_t bytes = 0;
      for (QuantizedLinear* linear : group) {
        linear->set_max_streams(streams);
        linear->Forward(x.data(), 1, y.data(), threads);
        bytes += linear->packed_bytes();
        if (bytes >= kStreamRoundBytes) break;
      }
    };
  }
  const std::vector<int> streams = ChooseStreamsForShapes(shapes);
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (QuantizedLinear* linear : members[i]) linear->set_max_streams(streams[i]);
  }
}

int QuantizedStreams(const PackedLinear& linear) {
  return dynamic_cast<const QuantizedLinear&>(linear).max_streams();
}

void SetQuantizedStreams(PackedLinear& linear, int streams) {
  dynamic_cast<QuantizedLinear&>(linear).set_max_streams(streams);
}

}  // namespace kiln::cpu
