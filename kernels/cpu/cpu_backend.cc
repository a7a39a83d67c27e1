#include "kernels/cpu/cpu_backend.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/host_memory.h"
#include "kernels/cpu/onednn_images.h"
#include "kernels/cpu/onednn_linear.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quantized_linear.h"
#include "kernels/cpu/small_m_linear.h"
#include "kernels/cpu/step_team.h"

namespace kiln {
namespace {

// A number in a cgroup file ("max" and unreadable files: nullopt).
std::optional<uint64_t> ReadCgroupNumber(const char* path) {
  std::ifstream file(path);
  std::string text;
  if (!(file >> text) || text == "max") return std::nullopt;
  uint64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) return std::nullopt;
  return value;
}

const char* IsaName(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

// Host memory is the device memory: copies are memcpy, row by row when strided.
void CopyRows(const std::byte* src, size_t src_stride, std::byte* dst, size_t dst_stride,
              int64_t rows, size_t row_bytes) {
  if (src_stride == row_bytes && dst_stride == row_bytes) {
    std::memcpy(dst, src, row_bytes * static_cast<size_t>(rows));
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * dst_stride, src + r * src_stride, row_bytes);
  }
}

class CpuContext final : public ExecutionContext {
 public:
  CpuContext(StepLimits limits, DeviceBuffer scratch)
      : ExecutionContext(Device{}, limits, std::move(scratch)),
        threads_(omp_get_max_threads()),
        rows_without_team_(cpu::Avx512Supported() ? 0u : ~0u) {}

  absl::Status Synchronize() override { return absl::OkStatus(); }

 protected:
  absl::Status DoBeginStep(const StepMetadata& /*step*/) override { return absl::OkStatus(); }

  // A step of up to kSmallMMaxRows rows (decode, speculative verification) runs on a team held
  // for the whole step: its linears take the small-M and quantized kernels, which run on the
  // team. A step that met work the team could not share (oneDNN, on a CPU where the small-M
  // kernel does not give brgemm's bits) sends steps of its rows and more back to a parallel
  // region per op; one whose linears ran the small-M kernel where brgemm was measured faster at
  // its rows (more rows than the small-M kernel wins on this CPU, or KILN_LINEAR_KERNEL=brgemm)
  // sends steps of its row count back, so that brgemm gets them.
  absl::Status DoRunStep(absl::FunctionRef<absl::Status()> ops) override {
    const int64_t rows = step().rows();
    if (threads_ <= 1 || rows < 1 || rows > cpu::kSmallMMaxRows || !cpu::StepTeamsEnabled() ||
        (rows_without_team_ >> (rows - 1) & 1u) != 0) {
      return ops();
    }
    cpu::StepTeam::Report report;
    absl::Status status = cpu::StepTeam::Hold(threads_, ops, &report);
    if (report.ran_serial_work) {
      rows_without_team_ |= ~0u << (rows - 1);
      LOG(INFO) << "CPU steps of " << rows << " rows ran a oneDNN primitive on one thread inside "
                << "a step's thread team; steps of more than " << rows - 1
                << " rows now start a parallel region per op instead";
    } else if (report.faster_without_team) {
      rows_without_team_ |= 1u << (rows - 1);
      LOG(INFO) << "CPU steps of " << rows << " rows ran the small-M kernel inside a step's "
                << "thread team where brgemm was measured faster at " << rows
                << " rows; such steps now start a parallel region per op instead";
    }
    return status;
  }

  absl::Status DoEmbed(const TensorView& table, const EmbedOptions& options,
                       const TensorView& out) override {
    const StepMetadata& s = step();
    const WeightView weights{table.dtype, table.rows, table.cols, table.bytes()};
    cpu::EmbeddingLookup(weights, s.token_ids.data(), s.rows(), out.f32(), out.row_stride);
    if (options.zero_at_position_zero) {
      for (int64_t r = 0; r < s.rows(); ++r) {
        if (s.positions[static_cast<size_t>(r)] == 0) {
          std::fill_n(out.f32() + r * out.row_stride, out.cols, 0.0f);
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status DoRmsNorm(const TensorView& in, const TensorView& weight, float eps,
                         const TensorView& out) override {
    cpu::RmsNorm(in.f32(), in.row_stride, weight.f32(), in.rows, in.cols, weight.cols, eps,
                 out.f32(), out.row_stride);
    return absl::OkStatus();
  }

  absl::Status DoAddRmsNorm(const TensorView& residual, const TensorView& delta,
                            const TensorView& weight, float eps, const TensorView& out) override {
    cpu::AddRmsNorm(residual.f32(), residual.row_stride, delta.f32(), delta.row_stride,
                    weight.f32(), residual.rows, residual.cols, eps, out.f32(), out.row_stride);
    return absl::OkStatus();
  }

  absl::Status DoLinear(const PackedLinear& linear, const TensorView& in,
                        const TensorView& out) override {
    return cpu::RunLinear(linear, in.f32(), in.rows, out.f32());
  }

  // Key `k` and value `v` (kv_dim values each) of the position at `offset` in `block`, as the
  // pool's element T.
  template <typename T>
  static void StoreKv(const KvPoolRef& pool, int32_t block, int64_t layer, int64_t offset,
                      const float* k, const float* v) {
    T* keys = pool.rows<T>(block, layer, 0);
    T* values = pool.rows<T>(block, layer, 1) + pool.value_index(offset, 0);
    for (int64_t i = 0; i < pool.kv_dim; ++i) {
      keys[pool.key_index(offset, i)] = cpu::KvFromF32<T>(k[i]);
      values[i] = cpu::KvFromF32<T>(v[i]);
    }
  }

  absl::Status DoRopeAndAppendKv(const TensorView& qkv, const AttentionShape& shape,
                                 const TensorView& inv_freq, int64_t layer) override {
    const StepMetadata& s = step();
    const int64_t q_dim = shape.q_dim();
    const int64_t kv_dim = shape.kv_dim();
    float* rows = qkv.f32();
    // The k heads follow the q heads in each row: one pass rotates both, with one set of
    // angles per row.
    cpu::ApplyRope(rows, s.rows(), qkv.row_stride, shape.n_heads + shape.n_kv_heads, shape.head_dim,
                   s.positions.data(), inv_freq.f32());
    const int64_t block_size = s.pool.block_size;
    for (const StepSequence& seq : s.sequences) {
      const int32_t* table = s.table(seq);
      for (int64_t t = 0; t < seq.rows; ++t) {
        const int64_t p = seq.start_position + t;
        const int32_t block = table[p / block_size];
        const int64_t offset = p % block_size;
        const float* src = rows + (seq.first_row + t) * qkv.row_stride + q_dim;
        if (s.pool.dtype == DType::kBF16) {
          StoreKv<uint16_t>(s.pool, block, layer, offset, src, src + kv_dim);
        } else {
          StoreKv<float>(s.pool, block, layer, offset, src, src + kv_dim);
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status DoAttention(const TensorView& qkv, const AttentionShape& shape, int64_t layer,
                           const TensorView& out) override {
    const StepMetadata& s = step();
    std::vector<cpu::AttentionSequence>& sequences = attention_sequences_;
    sequences.clear();
    for (const StepSequence& seq : s.sequences) {
      cpu::AttentionSequence a;
      a.q = qkv.f32() + seq.first_row * qkv.row_stride;
      a.q_stride = qkv.row_stride;
      a.n_tokens = seq.rows;
      a.start_pos = seq.start_position;
      a.kv = cpu::PagedKv{s.pool, s.table(seq), layer};
      a.out = out.f32() + seq.first_row * out.row_stride;
      a.out_stride = out.row_stride;
      sequences.push_back(a);
    }
    cpu::CausalAttention(shape, sequences.data(), static_cast<int64_t>(sequences.size()));
    return absl::OkStatus();
  }

  absl::Status DoSiluMul(const TensorView& gate_up, const TensorView& out) override {
    cpu::SiluMul(gate_up.f32(), gate_up.row_stride, out.rows, out.cols, out.f32(), out.row_stride);
    return absl::OkStatus();
  }

  absl::Status DoAdd(const TensorView& y, const TensorView& x) override {
    cpu::Add(y.f32(), y.row_stride, x.f32(), x.row_stride, y.rows, y.cols);
    return absl::OkStatus();
  }

  absl::Status DoGatherRows(const TensorView& in, int64_t first, int64_t count,
                            const TensorView& out) override {
    const size_t row_bytes = static_cast<size_t>(in.cols) * sizeof(float);
    for (int64_t i = 0; i < count; ++i) {
      const int32_t row = step().gather_rows[static_cast<size_t>(first + i)];
      std::memcpy(out.row(i), in.row(row), row_bytes);
    }
    return absl::OkStatus();
  }

  absl::Status DoCopyFromHost(const void* host, const TensorView& dst) override {
    const size_t row_bytes = static_cast<size_t>(dst.cols) * dst.element_bytes();
    CopyRows(static_cast<const std::byte*>(host), row_bytes, dst.bytes(),
             static_cast<size_t>(dst.row_stride) * dst.element_bytes(), dst.rows, row_bytes);
    return absl::OkStatus();
  }

  absl::Status DoCopyToHost(const TensorView& src, void* host) override {
    const size_t row_bytes = static_cast<size_t>(src.cols) * src.element_bytes();
    CopyRows(src.bytes(), static_cast<size_t>(src.row_stride) * src.element_bytes(),
             static_cast<std::byte*>(host), row_bytes, src.rows, row_bytes);
    return absl::OkStatus();
  }

 private:
  const int threads_;
  // Bit r-1 set: steps of r rows run without a team (every row count without AVX-512: oneDNN
  // then runs every linear).
  uint32_t rows_without_team_;
  static_assert(cpu::kSmallMMaxRows <= 32, "rows_without_team_ holds a bit per row count");
  // A step's sequences as the attention takes them (only grows).
  std::vector<cpu::AttentionSequence> attention_sequences_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(std::unique_ptr<cpu::OneDnnPacker> packer) : packer_(std::move(packer)) {
    const dnnl_version_t* version = dnnl_version();
    description_ = absl::StrCat("oneDNN ", version->major, ".", version->minor, ".", version->patch,
                                " brgemm (", IsaName(dnnl::get_effective_cpu_isa()), "), ",
                                omp_get_max_threads(), " threads");
  }

  absl::string_view name() const override { return "cpu"; }
  std::string description() const override { return description_; }
  Device device() const override { return Device{}; }
  bool reads_host_memory() const override { return true; }

  // MemAvailable of /proc/meminfo: free memory plus what the kernel can reclaim (page cache).
  uint64_t available_memory() const override {
    uint64_t available = 0;
    {
      std::ifstream meminfo("/proc/meminfo");
      std::string key, unit;
      uint64_t kib = 0;
      while (meminfo >> key >> kib >> unit) {
        if (key == "MemAvailable:") {
          available = kib * 1024;
          break;
        }
      }
    }
    if (available == 0) {
      const long pages = sysconf(_SC_AVPHYS_PAGES);
      const long page_size = sysconf(_SC_PAGESIZE);
      if (pages > 0 && page_size > 0) available = static_cast<uint64_t>(pages) * page_size;
    }
    // In a container /proc/meminfo shows the host: the cgroup's limit (v2) is what this process
    // may actually use.
    const std::optional<uint64_t> limit = ReadCgroupNumber("/sys/fs/cgroup/memory.max");
    const std::optional<uint64_t> used = ReadCgroupNumber("/sys/fs/cgroup/memory.current");
    if (limit.has_value()) {
      const uint64_t room = *limit > used.value_or(0) ? *limit - used.value_or(0) : 0;
      available = available == 0 ? room : std::min(available, room);
    }
    return available;
  }

  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override {
    return DeviceBuffer::Allocate(cpu::HostMemory(), bytes);
  }

  absl::Status Upload(const void* host, size_t bytes, const DeviceBuffer& dst,
                      size_t offset) override {
    if (offset > dst.size() || bytes > dst.size() - offset) {
      return absl::OutOfRangeError(absl::StrCat("upload of ", bytes, " bytes at offset ", offset,
                                                " into a buffer of ", dst.size()));
    }
    if (bytes > 0) std::memcpy(dst.data() + offset, host, bytes);
    return absl::OkStatus();
  }

  absl::Status Download(const DeviceBuffer& src, size_t offset, size_t bytes, void* host) override {
    if (offset > src.size() || bytes > src.size() - offset) {
      return absl::OutOfRangeError(absl::StrCat("download of ", bytes, " bytes at offset ", offset,
                                                " from a buffer of ", src.size()));
    }
    if (bytes > 0) std::memcpy(host, src.data() + offset, bytes);
    return absl::OkStatus();
  }

  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::StatusOr<std::unique_ptr<PackedLinear>> PackLinear(const LinearPackSpec& spec) override {
    KILN_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<PackedLinear>> packed,
                          PackAll(absl::MakeConstSpan(&spec, 1), /*threads=*/1));
    return std::move(packed.front());
  }

  absl::StatusOr<std::vector<std::unique_ptr<PackedLinear>>> PackLinears(
      absl::Span<const LinearPackSpec> specs) override {
    return PackAll(specs, std::max(1, omp_get_max_threads()));
  }

  // The load packed on this thread's OpenMP workers; the model's steps run on its engine's
  // thread, with workers of their own. libgomp cuts every worker's spin to almost nothing once it
  // manages more threads than there are CPUs, so the load's idle workers made the step thread's
  // workers sleep and be woken for each op: through the engine on the 2-core EPYC, one stream
  // 50-51 → 60 tokens/s and 16 streams 278-291 → 339-342 once they were released (two runs
  // each, kiln_kv_cache_bench, while every stream decodes). A later parallel region on this thread
  // starts them again.
  void FinishLoadOnThisThread() override {
    if (!omp_in_parallel()) omp_pause_resource(omp_pause_soft, omp_get_initial_device());
  }

  absl::StatusOr<std::unique_ptr<ExecutionContext>> CreateContext(
      const ContextOptions& options) override {
    if (options.limits.max_rows <= 0 || options.limits.max_sequences <= 0) {
      return absl::InvalidArgumentError("an execution context needs room for at least one row");
    }
    KILN_ASSIGN_OR_RETURN(DeviceBuffer scratch, Allocate(options.scratch_bytes));
    return std::unique_ptr<ExecutionContext>(new CpuContext(options.limits, std::move(scratch)));
  }

 private:
  // A packed image this machine packs into itself as the spec asks is adopted (nothing packed);
  // any other is unpacked to plain weights here, logged, and packed like a checkpoint's weight.
  // `plain` keeps the unpacked bytes for the packing that follows.
  absl::StatusOr<LinearPackSpec> AdoptOrUnpack(const LinearPackSpec& spec, bool* adopt_quantized,
                                               std::vector<std::vector<std::byte>>& plain) {
    const PackedImage& image = *spec.prepacked;
    std::string refusal;
    if (image.quantization != Quantization::kNone || spec.quantization != Quantization::kNone) {
      refusal = image.quantization == Quantization::kNone
                    ? absl::StrCat("the image holds ", DTypeName(image.dtype), " weights, ",
                                   QuantizationName(spec.quantization), " were asked for")
                    : cpu::QuantizedAdoptRefusal(spec);
      *adopt_quantized = refusal.empty();
    } else {
      refusal = packer_->AdoptRefusal(spec);
    }
    if (refusal.empty()) return spec;
    LOG(WARNING) << spec.name << ": packed image in " << image.layout << " not adopted (" << refusal
                 << "); unpacking it and packing again";
    WeightView view{image.dtype, image.rows, image.cols, nullptr};
    const std::string context = absl::StrCat("PackLinear(", spec.name, ")");
    if (image.quantization != Quantization::kNone) {
      absl::StatusOr<std::vector<float>> values = cpu::DequantizeImage(image);
      if (!values.ok()) return KilnAnnotate(values.status(), context);
      std::vector<std::byte>& bytes = plain.emplace_back(values->size() * sizeof(float));
      std::memcpy(bytes.data(), values->data(), bytes.size());
      view.dtype = DType::kF32;
      view.data = bytes.data();
    } else {
      absl::StatusOr<std::vector<std::byte>> bytes = cpu::UnpackOneDnnImage(image);
      if (!bytes.ok()) return KilnAnnotate(bytes.status(), context);
      view.data = plain.emplace_back(*std::move(bytes)).data();
    }
    LinearPackSpec unpacked = spec;
    unpacked.prepacked = nullptr;
    unpacked.row_blocks = {view};
    return unpacked;
  }

  // Quantized specs go to the quantized kernels where this CPU and the shape allow them; the rest,
  // and those that fall back (logged once per reason), to oneDNN in their compute dtype.
  absl::StatusOr<std::vector<std::unique_ptr<PackedLinear>>> PackAll(
      absl::Span<const LinearPackSpec> all_specs, int threads) {
    std::vector<std::unique_ptr<PackedLinear>> packed(all_specs.size());
    std::vector<std::vector<std::byte>> plain;  // unpacked images, until packed
    plain.reserve(all_specs.size());
    std::vector<LinearPackSpec> specs(all_specs.begin(), all_specs.end());
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].prepacked == nullptr) continue;
      bool adopt_quantized = false;
      KILN_ASSIGN_OR_RETURN(specs[i], AdoptOrUnpack(all_specs[i], &adopt_quantized, plain));
      if (adopt_quantized) {
        KILN_ASSIGN_OR_RETURN(packed[i], cpu::AdoptQuantizedLinear(specs[i], threads));
      }
    }
    std::vector<LinearPackSpec> dense;
    std::vector<size_t> dense_at;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (packed[i] != nullptr) continue;
      if (specs[i].quantization != Quantization::kNone) {
        const std::string refusal = cpu::QuantizedPackRefusal(specs[i]);
        if (refusal.empty()) {
          KILN_ASSIGN_OR_RETURN(packed[i], cpu::PackQuantizedLinear(specs[i], threads));
          continue;
        }
        LOG_FIRST_N(WARNING, 4) << specs[i].name << ": not quantized to "
                                << QuantizationName(specs[i].quantization) << " (" << refusal
                                << "); packed as " << DTypeName(specs[i].compute_dtype);
      }
      dense.push_back(specs[i]);
      dense.back().quantization = Quantization::kNone;
      dense_at.push_back(i);
    }
    if (!dense.empty()) {
      KILN_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<PackedLinear>> from_onednn,
                            packer_->Pack(dense, threads));
      for (size_t j = 0; j < dense_at.size(); ++j) packed[dense_at[j]] = std::move(from_onednn[j]);
    }
    std::vector<PackedLinear*> all;
    for (const auto& linear : packed) all.push_back(linear.get());
    // Timed on the threads decode runs them on, whatever this pack used.
    cpu::ChooseQuantizedStreams(all, std::max(1, omp_get_max_threads()));
    return packed;
  }

  const std::unique_ptr<cpu::OneDnnPacker> packer_;
  std::string description_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend() {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<cpu::OneDnnPacker> packer, cpu::OneDnnPacker::Create());
  return std::unique_ptr<Backend>(new CpuBackend(std::move(packer)));
}

}  // namespace kiln
