#include "kernels/cpu/onednn_linear.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <numeric>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "kernels/cpu/host_memory.h"
#include "kernels/cpu/linear_dispatch.h"
#include "kernels/cpu/onednn_images.h"
#include "kernels/cpu/onednn_primitives.h"
#include "kernels/cpu/quantized_linear.h"
#include "kernels/cpu/small_m_linear.h"
#include "kernels/cpu/step_team.h"

namespace kiln::cpu {
namespace {

using dnnl::memory;
using onednn::AllocAligned;
using onednn::ConvertBlock;
using onednn::F32BytesToBF16;
using onednn::PrimEntry;
using onednn::PrimitiveCache;
using onednn::PrimKey;
using onednn::ThisThreadState;
using onednn::ThreadState;
using onednn::ThreadStream;
using onednn::ToDnnl;
using Tag = memory::format_tag;
using Dt = memory::data_type;

// The packed layout is the one oneDNN's first-choice implementation picks for M = 1, so batch-1
// decode always runs its own primitive on it. Measured here: brgemm wants the same layout for
// every M from 1 to 1024 (BA16a64b2a for bf16 with or without AMX, BA16a64b for f32), so other
// M normally get their own primitive too; where one does not, EntryFor falls back.
constexpr int64_t kRepresentativeM = 1;
// Larger M run as chunks of this many rows; bounds the primitives cached per shape.
constexpr int64_t kMaxPrimitiveM = 256;

// ---- The packed layer ------------------------------------------------------------------------

class OneDnnLinear final : public PackedLinear {
 public:
  OneDnnLinear(std::string name, int64_t k, int64_t n, DType dtype, dnnl::engine engine,
               std::shared_ptr<PrimitiveCache> cache)
      : name_(std::move(name)),
        k_(k),
        n_(n),
        dtype_(dtype),
        engine_(std::move(engine)),
        cache_(std::move(cache)) {}

  // Picks the packed layout (the M = 1 primitive's). Throws dnnl::error.
  void Plan(const LinearPackSpec& spec) {
    const PrimKey rep_key{k_, n_, kRepresentativeM, dtype_, !spec.bias.empty()};
    std::shared_ptr<const PrimEntry> rep = cache_->Get(rep_key);
    packed_md_ = rep->weights_md;
    kernel_name_ = rep->impl;
  }

  // Converts, stacks and reorders the weight into weight memory (AllocateWeights). Throws
  // dnnl::error / std::bad_alloc.
  void Pack(const LinearPackSpec& spec) {
    const size_t packed_size = packed_md_.get_size();
    weights_ = AllocateWeights(packed_size);
    weights_mem_ = memory(packed_md_, engine_, weights_.mutable_data());
    dnnl::stream& stream = ThreadStream(engine_);
    const bool in_place = ReorderBlocksWhereTheyLie(spec, stream);
    if (!in_place) ReorderThroughPlainCopy(spec, stream);
    SetBias(spec);
    DescribePanels();
    VLOG(1) << "packed " << name_ << " [N=" << n_ << ", K=" << k_ << "] " << DTypeName(dtype_)
            << (bias_ ? " +bias" : "") << ": " << packed_bytes_ << " bytes, impl " << kernel_name_
            << (in_place ? ", reordered in place" : ", through a stacked copy");
  }

  // Why spec.prepacked cannot be adopted as it is (empty when it can): after Plan(), the image
  // must be this layout, dtype and size.
  std::string AdoptRefusal(const LinearPackSpec& spec) const {
    const PackedImage& image = *spec.prepacked;
    const std::string layout = ImageLayout();
    if (layout.empty()) return "this machine's oneDNN packs another layout for this shape";
    if (image.layout != layout) {
      return absl::StrCat("layout ", image.layout, " is not this machine's ", layout);
    }
    if (image.quantization != Quantization::kNone || image.dtype != dtype_) {
      return absl::StrCat("the image holds ", DTypeName(image.dtype), " weights, not ",
                          DTypeName(dtype_));
    }
    const PackedImage::Part* weights = image.Find("weights");
    if (weights == nullptr || image.parts.size() != 1 || weights->bytes != packed_md_.get_size()) {
      return absl::StrCat("the image is not one weights part of ", packed_md_.get_size(), " bytes");
    }
    return "";
  }

  // Takes the packed bytes of an image AdoptRefusal accepted, nothing reordered: where they lie
  // or copied (AdoptPart). Throws std::bad_alloc.
  void Adopt(const LinearPackSpec& spec) {
    weights_ = AdoptPart(*spec.prepacked, *spec.prepacked->Find("weights"), /*threads=*/1);
    // oneDNN only reads a matmul's weights.
    weights_mem_ = memory(packed_md_, engine_, const_cast<std::byte*>(weights_.data()));
    adopted_ = true;
    SetBias(spec);
    DescribePanels();
    VLOG(1) << "adopted " << name_ << " [N=" << n_ << ", K=" << k_ << "] " << DTypeName(dtype_)
            << (weights_.in_place() ? " where it lies" : " as a copy");
  }

  // The layout name of this linear's packed bytes where it is the panel layout (the one the
  // small-M kernel reads and that an image may hold), else empty.
  std::string ImageLayout() const {
    return InPanelLayout() ? std::string(PanelLayoutFor(dtype_).name) : "";
  }

  // Whether the packed layout is the panel one (64 columns × all of K, contiguous).
  bool InPanelLayout() const {
    return packed_md_ == memory::desc({k_, n_}, ToDnnl(dtype_), PanelLayoutFor(dtype_).tag);
  }

  std::optional<PackedImage> Image() const override {
    const std::string layout = ImageLayout();
    if (layout.empty() || weights_.data() == nullptr) return std::nullopt;
    PackedImage image;
    image.layout = layout;
    image.dtype = dtype_;
    image.rows = n_;
    image.cols = k_;
    image.parts.push_back({"weights", weights_.data(), packed_md_.get_size()});
    return image;
  }
  bool adopted() const override { return adopted_; }
  bool adopted_in_place() const override { return weights_.in_place(); }

  void SetBias(const LinearPackSpec& spec) {
    packed_bytes_ = packed_md_.get_size();
    if (spec.bias.empty()) return;
    const size_t bias_bytes = static_cast<size_t>(n_) * sizeof(float);
    bias_ = AllocAligned(bias_bytes);
    std::memcpy(bias_.get(), spec.bias.data(), bias_bytes);
    bias_mem_ = memory(memory::desc({1, n_}, Dt::f32, Tag::ab), engine_, bias_.get());
    packed_bytes_ += bias_bytes;
  }

  // The small-M kernel reads the packed weight when it is in the panel layout (64 columns × all
  // of K, contiguous) and the CPU has the instructions.
  void DescribePanels() {
    if (!InPanelLayout() || !SmallMKernelSupported(dtype_)) return;
    const dnnl_memory_desc_t& md = packed_md_.data;
    PanelWeights panel;
    panel.data = weights_.data();
    panel.dtype = dtype_;
    panel.k = k_;
    panel.k_padded = md.padded_dims[0];
    panel.n = n_;
    panel.bias = bias_ ? reinterpret_cast<const float*>(bias_.get()) : nullptr;
    if (panel.k_padded % 16 != 0 || md.padded_dims[1] % kPanelColumns != 0) return;
    panel_ = panel;
  }

  LinearShape shape() const { return LinearShape{k_, n_, dtype_, bias_ != nullptr}; }

  // Set at pack time from the measured choice for this shape.
  bool UsesSmallM(int64_t m) const {
    return panel_ && m <= kSmallMMaxRows && (small_m_rows_mask_ >> (m - 1) & 1u) != 0;
  }
  void set_k_block(int64_t k_block) { panel_->k_block = k_block; }
  void set_max_streams(int streams) { panel_->max_streams = streams; }
  int max_streams() const { return panel_->max_streams; }
  void ApplyChoice(const KernelChoice& choice) {
    panel_->k_block = choice.k_block;
    small_m_rows_mask_ = choice.small_m_rows;
    small_m_bit_identical_ = choice.bit_identical;
  }
  bool small_m_bit_identical() const { return small_m_bit_identical_; }

  // Plain W[N, K] in the compute dtype is weights {K, N} in layout `ba`.
  memory::desc PlainDesc(int64_t rows) const {
    return memory::desc({k_, rows}, ToDnnl(dtype_), Tag::ba);
  }

  void Reorder(const memory::desc& src_md, const std::byte* src, const memory::desc& dst_md,
               dnnl::stream& stream) {
    // The reorder only reads its source.
    memory src_mem(src_md, engine_, const_cast<std::byte*>(src));
    memory dst_mem(dst_md, engine_, weights_.mutable_data());
    dnnl::reorder(src_mem, dst_mem).execute(stream, src_mem, dst_mem);
    stream.wait();
  }

  // Blocks already in the compute dtype at aligned addresses (a memory-mapped bf16 checkpoint,
  // the fused weights of a native tensorized file) are reordered from where they lie, each into
  // its own rows of the packed layout: no stacked plain copy, which would cost a pass over the
  // bytes and as much fresh memory again. Several blocks need the packed layout to be cut at each
  // block's first row (oneDNN refuses cuts inside a layout block) and to have no padding, which
  // a cut could leave unwritten. Returns false when a block does not qualify; the caller then
  // rewrites the whole packed buffer.
  bool ReorderBlocksWhereTheyLie(const LinearPackSpec& spec, dnnl::stream& stream) {
    for (const WeightView& block : spec.row_blocks) {
      if (block.dtype != dtype_ ||
          reinterpret_cast<uintptr_t>(block.data) % DTypeSize(dtype_) != 0) {
        return false;
      }
    }
    if (spec.row_blocks.size() == 1) {
      const memory::desc plain_md = PlainDesc(n_);
      if (plain_md == packed_md_) {
        std::memcpy(weights_.mutable_data(), spec.row_blocks[0].data, spec.row_blocks[0].bytes());
      } else {
        Reorder(plain_md, spec.row_blocks[0].data, packed_md_, stream);
      }
      return true;
    }
    const dnnl_memory_desc_t& md = packed_md_.data;
    if (md.padded_dims[0] != md.dims[0] || md.padded_dims[1] != md.dims[1]) return false;
    try {
      std::vector<memory::desc> parts;
      int64_t row = 0;
      for (const WeightView& block : spec.row_blocks) {
        parts.push_back(packed_md_.submemory_desc({k_, block.rows}, {0, row}));
        row += block.rows;
      }
      for (size_t i = 0; i < parts.size(); ++i) {
        Reorder(PlainDesc(spec.row_blocks[i].rows), spec.row_blocks[i].data, parts[i], stream);
      }
    } catch (const dnnl::error&) {
      return false;
    }
    return true;
  }

  // Converts and stacks the blocks into one plain buffer, then reorders that.
  void ReorderThroughPlainCopy(const LinearPackSpec& spec, dnnl::stream& stream) {
    HostBytes plain = AllocAligned(static_cast<size_t>(n_ * k_) * DTypeSize(dtype_));
    size_t offset = 0;
    for (const WeightView& block : spec.row_blocks) {
      ConvertBlock(block, dtype_, plain.get() + offset);
      offset += static_cast<size_t>(block.rows * k_) * DTypeSize(dtype_);
    }
    const memory::desc plain_md = PlainDesc(n_);
    if (plain_md == packed_md_) {
      std::memcpy(weights_.mutable_data(), plain.get(), offset);
    } else {
      Reorder(plain_md, plain.get(), packed_md_, stream);
    }
  }

  size_t planned_bytes() const { return packed_md_.get_size(); }
  const std::string& name() const override { return name_; }
  int64_t in_features() const override { return k_; }
  int64_t out_features() const override { return n_; }
  DType compute_dtype() const override { return dtype_; }
  size_t packed_bytes() const override { return packed_bytes_; }
  std::string kernel_name() const override { return kernel_name_; }

  bool has_small_m() const { return panel_.has_value(); }

  absl::Status Forward(const float* x, int64_t m, float* y, LinearPath path) const {
    if (m < 0) return absl::InvalidArgumentError(absl::StrCat(name_, ": negative m ", m));
    if (m == 0) return absl::OkStatus();
    if (x == nullptr || y == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": null input or output"));
    }
    if (path == LinearPath::kSmallM && (!panel_ || m > kSmallMMaxRows)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": the small-M kernel cannot run this linear at M=", m,
                       panel_ ? "" : " (packed layout or CPU features do not allow it)"));
    }
    if (path == LinearPath::kSmallM || (path == LinearPath::kChosen && UsesSmallM(m))) {
      RunSmallM(*panel_, x, m, y, omp_get_max_threads());
      return absl::OkStatus();
    }
    if (StepTeam* team = StepTeam::Current(); team != nullptr && path == LinearPath::kChosen) {
      // Inside a step's team, oneDNN's own parallel region would be nested and run on one
      // thread; the small-M kernel runs on the team, and where it gives brgemm's bits the result
      // is the same. brgemm was chosen for these rows, so the team tells its step to run such
      // steps without a team from now on.
      if (panel_ && m <= kSmallMMaxRows && small_m_bit_identical_) {
        RunSmallM(*panel_, x, m, y, team->size());
        team->NoteFasterWithoutTeam();
        return absl::OkStatus();
      }
      team->NoteSerialWork();
    }
    try {
      dnnl::stream& stream = ThreadStream(engine_);
      int64_t done = 0;
      while (done < m) {
        const std::shared_ptr<const PrimEntry> entry = EntryFor(std::min(m - done, kMaxPrimitiveM));
        if (!entry) {
          return absl::InternalError(
              absl::StrCat(name_, ": no oneDNN primitive matches the packed weight layout"));
        }
        Run(*entry, x + done * k_, y + done * n_, stream);
        done += entry->m;
      }
      return absl::OkStatus();
    } catch (const dnnl::error& e) {
      return absl::InternalError(absl::StrCat(name_, ": oneDNN error in forward (status ",
                                              static_cast<int>(e.status), "): ", e.what()));
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(absl::StrCat(name_, ": out of memory in forward"));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(name_, ": forward failed: ", e.what()));
    }
  }

 private:
  PrimKey KeyFor(int64_t m) const { return PrimKey{k_, n_, m, dtype_, bias_ != nullptr}; }

  // A primitive for up to `rows` rows that runs on the packed layout: the one for exactly
  // `rows` when it wants that layout, else (logged once) the largest power-of-two M that does;
  // M = 1 always does, since it chose the layout. The caller loops over the remaining rows.
  std::shared_ptr<const PrimEntry> EntryFor(int64_t rows) const {
    std::shared_ptr<const PrimEntry> entry = cache_->Get(KeyFor(rows));
    if (entry->weights_md == packed_md_) return entry;
    if (!fallback_logged_.exchange(true)) {
      LOG(WARNING) << name_ << ": oneDNN wants another weight layout for M=" << rows << " (impl "
                   << entry->impl << "); running such M in smaller row chunks";
    }
    for (int64_t m = std::bit_floor(static_cast<uint64_t>(rows)); m >= 1; m /= 2) {
      if (m == rows) continue;
      entry = cache_->Get(KeyFor(m));
      if (entry->weights_md == packed_md_) return entry;
    }
    return nullptr;
  }

  void Run(const PrimEntry& entry, const float* x, float* y, dnnl::stream& stream) const {
    ThreadState& ts = ThisThreadState();
    void* src = const_cast<float*>(x);
    if (dtype_ == DType::kBF16) {
      const int64_t count = entry.m * k_;
      auto* converted = reinterpret_cast<uint16_t*>(ts.src_bf16.Get(count * sizeof(uint16_t)));
      F32BytesToBF16(reinterpret_cast<const std::byte*>(x), count, converted);
      src = converted;
    }
    const memory src_mem(entry.src_md, engine_, src);
    const memory dst_mem(entry.dst_md, engine_, y);
    dnnl_exec_arg_t args[5];
    int nargs = 0;
    args[nargs++] = {DNNL_ARG_SRC, src_mem.get()};
    args[nargs++] = {DNNL_ARG_WEIGHTS, weights_mem_.get()};
    args[nargs++] = {DNNL_ARG_DST, dst_mem.get()};
    if (bias_mem_) args[nargs++] = {DNNL_ARG_BIAS, bias_mem_.get()};
    memory scratch_mem;
    if (entry.scratch_bytes > 0) {
      scratch_mem = memory(entry.scratch_md, engine_, ts.scratchpad.Get(entry.scratch_bytes));
      args[nargs++] = {DNNL_ARG_SCRATCHPAD, scratch_mem.get()};
    }
    dnnl::error::wrap_c_api(
        dnnl_primitive_execute(entry.primitive.get(), stream.get(), nargs, args),
        "could not execute a matmul primitive");
    stream.wait();
  }

  const std::string name_;
  const int64_t k_;
  const int64_t n_;
  const DType dtype_;
  const dnnl::engine engine_;
  const std::shared_ptr<PrimitiveCache> cache_;
  memory::desc packed_md_;
  WeightBytes weights_;  // packed here, or adopted
  bool adopted_ = false;
  memory weights_mem_;
  HostBytes bias_;
  memory bias_mem_;
  std::string kernel_name_;
  size_t packed_bytes_ = 0;
  mutable std::atomic<bool> fallback_logged_{false};
  std::optional<PanelWeights> panel_;
  uint32_t small_m_rows_mask_ = 0;
  bool small_m_bit_identical_ = false;
};

// ---- Validation and the backend --------------------------------------------------------------

bool KnownDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

absl::Status ValidateSpec(const LinearPackSpec& spec, int64_t* k, int64_t* n) {
  auto invalid = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("PackLinear(", spec.name, "): ", parts...));
  };
  if (spec.compute_dtype != DType::kF32 && spec.compute_dtype != DType::kBF16) {
    return invalid("compute dtype must be F32 or BF16, got ", DTypeName(spec.compute_dtype));
  }
  if (spec.prepacked != nullptr) {
    const PackedImage& image = *spec.prepacked;
    if (!spec.row_blocks.empty()) return invalid("both row blocks and a packed image");
    if (image.rows <= 0 || image.cols <= 0 || image.rows > (int64_t{1} << 40) / image.cols) {
      return invalid("packed image of shape [", image.rows, ", ", image.cols, "]");
    }
    if (!spec.bias.empty() && static_cast<int64_t>(spec.bias.size()) != image.rows) {
      return invalid("bias has ", spec.bias.size(), " values for ", image.rows, " output rows");
    }
    *k = image.cols;
    *n = image.rows;
    return absl::OkStatus();
  }
  if (spec.row_blocks.empty()) return invalid("no row blocks");
  const WeightView& first = spec.row_blocks.front();
  int64_t rows = 0;
  for (size_t i = 0; i < spec.row_blocks.size(); ++i) {
    const WeightView& block = spec.row_blocks[i];
    if (!KnownDType(block.dtype)) return invalid("row block ", i, " has an unknown dtype");
    if (block.dtype != first.dtype) {
      return invalid("row block ", i, " is ", DTypeName(block.dtype), " but block 0 is ",
                     DTypeName(first.dtype));
    }
    if (block.rows <= 0 || block.cols <= 0) {
      return invalid("row block ", i, " has shape [", block.rows, ", ", block.cols, "]");
    }
    if (block.cols != first.cols) {
      return invalid("row block ", i, " has ", block.cols, " cols, block 0 has ", first.cols);
    }
    if (block.data == nullptr) return invalid("row block ", i, " has no data");
    if (block.rows > (int64_t{1} << 40) / block.cols - rows) return invalid("weight too large");
    rows += block.rows;
  }
  if (!spec.bias.empty() && static_cast<int64_t>(spec.bias.size()) != rows) {
    return invalid("bias has ", spec.bias.size(), " values for ", rows, " output rows");
  }
  *k = first.cols;
  *n = rows;
  return absl::OkStatus();
}

// Runs `fn`, turning what oneDNN and the allocator throw into a status naming the weight.
template <typename Fn>
absl::Status Guarded(const std::string& name, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("PackLinear(", name, "): oneDNN error (status ",
                                            static_cast<int>(e.status), "): ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("PackLinear(", name, "): out of memory"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("PackLinear(", name, "): ", e.what()));
  }
}

// A measurement round runs the weights of one shape in turn up to this many bytes (at least one
// weight), as decode runs a model's layers: more than a last-level cache holds (32 MB per Zen 4
// CCD), so a model whose layers exceed the caches is timed streaming from memory, and a small one
// from cache, as each will run.
constexpr size_t kRoundBytes = size_t{48} << 20;
// A single weight above this is not timed (an LM head: ~100 ms a measurement); it takes the choice
// of the largest timed shape with its K and dtype, or is timed when there is none.
constexpr size_t kLargestTimedBytes = size_t{64} << 20;

// The linears of one shape in a Pack call.
struct ShapeGroup {
  LinearShape shape;
  std::vector<OneDnnLinear*> members;
  size_t bytes = 0;  // one weight's
  KernelChoice choice;
};

// Finds the choice for a shape not chosen before in this process: probes for brgemm's K blocking
// on the group's first weight, times both kernels over the group (ChooseKernel). `like`: a
// smaller group with the same K and dtype whose choice a weight too large to time may take.
absl::StatusOr<KernelChoice> FindChoice(const ShapeGroup& group, const ShapeGroup* like) {
  const LinearShape& shape = group.shape;
  absl::Status status;
  auto run = [&](OneDnnLinear* linear, const float* x, int64_t m, float* y, LinearPath path) {
    absl::Status result = linear->Forward(x, m, y, path);
    if (!result.ok() && status.ok()) status = result;
  };
  const int64_t rows = kSmallMMaxRows;
  // The probe input: varied values, so that a different order of sums shows in the bits.
  std::vector<float> x(static_cast<size_t>(rows * shape.k));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) + 0.01f;
  std::vector<float> y(static_cast<size_t>(rows * shape.n));
  // One row, one pass of rows and two passes (small_m_linear.h), each against brgemm at that M.
  const int64_t probed_rows[] = {1, 8, rows};
  std::vector<std::vector<float>> reference;
  auto probe = [&](int64_t k_block) {
    for (OneDnnLinear* linear : group.members) linear->set_k_block(k_block);
    OneDnnLinear* first = group.members.front();
    if (reference.empty()) {
      for (const int64_t m : probed_rows) {
        reference.emplace_back(static_cast<size_t>(m * shape.n));
        run(first, x.data(), m, reference.back().data(), LinearPath::kBrgemm);
      }
    }
    for (size_t i = 0; i < reference.size(); ++i) {
      const int64_t m = probed_rows[i];
      run(first, x.data(), m, y.data(), LinearPath::kSmallM);
      if (std::memcmp(y.data(), reference[i].data(),
                      static_cast<size_t>(m * shape.n) * sizeof(float)) != 0) {
        return false;
      }
    }
    return true;
  };
  auto round = [&](int64_t m, bool small_m) {
    size_t bytes = 0;
    for (OneDnnLinear* linear : group.members) {
      run(linear, x.data(), m, y.data(), small_m ? LinearPath::kSmallM : LinearPath::kBrgemm);
      bytes += linear->packed_bytes();
      if (bytes >= kRoundBytes) break;
    }
  };
  KernelChoice choice = ChooseKernel(shape, probe, round, like ? &like->shape : nullptr,
                                     like ? &like->choice : nullptr);
  KILN_RETURN_IF_ERROR(status);
  return choice;
}

// The bf16 small-M kernel's streams a thread (ChooseStreamsForShapes) for each shape it runs at
// one row.
absl::Status ChooseStreamsForGroups(std::vector<ShapeGroup>& groups) {
  std::vector<StreamShape> shapes;
  std::vector<ShapeGroup*> chosen;
  absl::Status status;
  // One input row and output row, sized for the widest shape below.
  std::vector<float> x;
  std::vector<float> y;
  for (ShapeGroup& group : groups) {
    if (group.shape.dtype != DType::kBF16 || (group.choice.small_m_rows & 1u) == 0) continue;
    x.resize(std::max(x.size(), static_cast<size_t>(group.shape.k)), 0.5f);
    y.resize(std::max(y.size(), static_cast<size_t>(group.shape.n)));
    auto round = [&status, &x, &y, members = group.members](int streams) {
      size_t bytes = 0;
      for (OneDnnLinear* linear : members) {
        linear->set_max_streams(streams);
        absl::Status result = linear->Forward(x.data(), 1, y.data(), LinearPath::kSmallM);
        if (!result.ok() && status.ok()) status = result;
        bytes += linear->packed_bytes();
        if (bytes >= kStreamRoundBytes) break;
      }
    };
    shapes.push_back(
        StreamShape{group.shape, group.bytes, group.bytes * group.members.size(), round});
    chosen.push_back(&group);
  }
  const std::vector<int> streams = ChooseStreamsForShapes(shapes);
  KILN_RETURN_IF_ERROR(status);
  for (size_t i = 0; i < chosen.size(); ++i) {
    for (OneDnnLinear* linear : chosen[i]->members) linear->set_max_streams(streams[i]);
  }
  return absl::OkStatus();
}

// Sets each linear's kernel per M from the choice for its shape (linear_dispatch.h).
absl::Status ChooseKernels(const std::vector<std::unique_ptr<OneDnnLinear>>& linears) {
  std::vector<ShapeGroup> groups;
  for (const auto& linear : linears) {
    if (!linear->has_small_m()) continue;
    const LinearShape shape = linear->shape();
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const ShapeGroup& g) { return g.shape == shape; });
    if (it == groups.end()) {
      groups.push_back(ShapeGroup{shape, {}, linear->packed_bytes(), {}});
      it = groups.end() - 1;
    }
    it->members.push_back(linear.get());
  }
  // Smallest first: a weight too large to time looks among the groups before it.
  std::sort(groups.begin(), groups.end(),
            [](const ShapeGroup& a, const ShapeGroup& b) { return a.bytes < b.bytes; });
  for (auto group = groups.begin(); group != groups.end(); ++group) {
    if (!KnownChoice(group->shape, &group->choice)) {
      const ShapeGroup* like = nullptr;
      if (group->bytes > kLargestTimedBytes) {
        for (auto before = groups.begin(); before != group; ++before) {
          if (before->shape.k == group->shape.k && before->shape.dtype == group->shape.dtype) {
            like = &*before;
          }
        }
      }
      KILN_ASSIGN_OR_RETURN(group->choice, FindChoice(*group, like));
    }
    for (OneDnnLinear* linear : group->members) linear->ApplyChoice(group->choice);
  }
  return ChooseStreamsForGroups(groups);
}

}  // namespace

struct OneDnnPacker::State {
  dnnl::engine engine;
  std::shared_ptr<PrimitiveCache> cache;
};

absl::StatusOr<std::unique_ptr<OneDnnPacker>> OneDnnPacker::Create() {
  try {
    auto state = std::make_unique<State>();
    state->engine = dnnl::engine(dnnl::engine::kind::cpu, 0);
    state->cache = std::make_shared<PrimitiveCache>(state->engine);
    return std::unique_ptr<OneDnnPacker>(new OneDnnPacker(std::move(state)));
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN CPU engine: ", e.what()));
  }
}

OneDnnPacker::OneDnnPacker(std::unique_ptr<State> state) : state_(std::move(state)) {}
OneDnnPacker::~OneDnnPacker() = default;

// One weight per thread, each packed single-threaded. A model has hundreds of weights, so this
// keeps every core busy without an OpenMP barrier per reorder, and the first-touch page faults on
// fresh packed memory (the dearest part of packing: the kernel zeroes every page) run on all
// cores at once. Largest first, so a big lm_head does not finish alone at the end.
absl::StatusOr<std::vector<std::unique_ptr<PackedLinear>>> OneDnnPacker::Pack(
    absl::Span<const LinearPackSpec> specs, int threads) {
  std::vector<std::unique_ptr<OneDnnLinear>> linears;
  for (const LinearPackSpec& spec : specs) {
    int64_t k = 0;
    int64_t n = 0;
    KILN_RETURN_IF_ERROR(ValidateSpec(spec, &k, &n));
    linears.push_back(std::make_unique<OneDnnLinear>(spec.name, k, n, spec.compute_dtype,
                                                     state_->engine, state_->cache));
    KILN_RETURN_IF_ERROR(Guarded(spec.name, [&] { linears.back()->Plan(spec); }));
    if (spec.prepacked != nullptr) {
      if (const std::string refusal = linears.back()->AdoptRefusal(spec); !refusal.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("PackLinear(", spec.name, "): cannot adopt the packed image: ", refusal));
      }
    }
  }

  std::vector<size_t> order(specs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return linears[a]->planned_bytes() > linears[b]->planned_bytes();
  });
  std::vector<absl::Status> statuses(specs.size());
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    const int saved_threads = omp_get_max_threads();
    if (threads > 1) omp_set_num_threads(1);
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= order.size()) break;
      const size_t at = order[i];
      statuses[at] = Guarded(specs[at].name, [&] {
        if (specs[at].prepacked != nullptr) {
          linears[at]->Adopt(specs[at]);
        } else {
          linears[at]->Pack(specs[at]);
        }
      });
      if (!statuses[at].ok()) failed.store(true, std::memory_order_relaxed);
    }
    omp_set_num_threads(saved_threads);
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < std::min(static_cast<size_t>(std::max(threads, 1)), specs.size()); ++t) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // fewer threads: slower, not wrong
    }
  }
  work();
  for (std::thread& thread : pool) thread.join();
  for (const absl::Status& status : statuses) KILN_RETURN_IF_ERROR(status);
  KILN_RETURN_IF_ERROR(ChooseKernels(linears));
  return std::vector<std::unique_ptr<PackedLinear>>(std::make_move_iterator(linears.begin()),
                                                    std::make_move_iterator(linears.end()));
}

std::string OneDnnPacker::AdoptRefusal(const LinearPackSpec& spec) {
  int64_t k = 0;
  int64_t n = 0;
  if (absl::Status valid = ValidateSpec(spec, &k, &n); !valid.ok()) {
    return std::string(valid.message());
  }
  OneDnnLinear linear(spec.name, k, n, spec.compute_dtype, state_->engine, state_->cache);
  if (absl::Status planned = Guarded(spec.name, [&] { linear.Plan(spec); }); !planned.ok()) {
    return std::string(planned.message());
  }
  return linear.AdoptRefusal(spec);
}

absl::Status RunLinear(const PackedLinear& linear, const float* x, int64_t m, float* y,
                       LinearPath path) {
  if (IsQuantizedLinear(linear)) {
    if (path == LinearPath::kChosen)
      return RunQuantizedLinear(linear, x, m, y, omp_get_max_threads());
    return absl::InvalidArgumentError(
        absl::StrCat(linear.name(), " is quantized: only its own kernel runs it"));
  }
  const auto* packed = dynamic_cast<const OneDnnLinear*>(&linear);
  if (packed == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(linear.name(), " was not packed by the CPU backend"));
  }
  return packed->Forward(x, m, y, path);
}

bool HasSmallMKernel(const PackedLinear& linear) {
  const auto* packed = dynamic_cast<const OneDnnLinear*>(&linear);
  return packed != nullptr && packed->has_small_m();
}

bool SmallMKernelIsBitIdentical(const PackedLinear& linear) {
  const auto* packed = dynamic_cast<const OneDnnLinear*>(&linear);
  return packed != nullptr && packed->has_small_m() && packed->small_m_bit_identical();
}

bool ChoosesSmallM(const PackedLinear& linear, int64_t m) {
  const auto* packed = dynamic_cast<const OneDnnLinear*>(&linear);
  return packed != nullptr && m >= 1 && packed->UsesSmallM(m);
}

int DecodeStreams(const PackedLinear& linear) {
  if (IsQuantizedLinear(linear)) return QuantizedStreams(linear);
  const auto* packed = dynamic_cast<const OneDnnLinear*>(&linear);
  return packed != nullptr && packed->has_small_m() && packed->shape().dtype == DType::kBF16
             ? packed->max_streams()
             : 0;
}

absl::Status SetDecodeStreams(PackedLinear& linear, int streams) {
  if (streams != 1 && streams != 2 && streams != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(linear.name(), ": ", streams, " streams a thread; 1, 2 or 4 can be read"));
  }
  if (DecodeStreams(linear) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        linear.name(), ": no decode kernel reads it in streams (", linear.kernel_name(), ")"));
  }
  if (IsQuantizedLinear(linear)) {
    SetQuantizedStreams(linear, streams);
  } else {
    dynamic_cast<OneDnnLinear&>(linear).set_max_streams(streams);
  }
  return absl::OkStatus();
}

}  // namespace kiln::cpu
