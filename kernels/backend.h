// The compute backend seam (docs/backends.md §1). A backend owns memory (DeviceBuffer), prepares
// a model's weights once at PostLoad (packing linears for its GEMM, placing norms, the embedding
// and the RoPE table), and creates one execution context per model, which runs the op set below.
// Model code describes a forward pass in these ops and never calls one device's kernels.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/buffer.h"
#include "kernels/dtype.h"
#include "kernels/op_profile.h"
#include "kernels/packed_image.h"
#include "kernels/quantization.h"
#include "kernels/step.h"
#include "kernels/tensor.h"

namespace kiln {

// A read-only row-major [rows, cols] matrix in its stored dtype, in host memory. `data` may be
// unaligned (it often points into a memory-mapped checkpoint).
struct WeightView {
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const std::byte* data = nullptr;

  int64_t elements() const { return rows * cols; }
  size_t bytes() const { return static_cast<size_t>(elements()) * DTypeSize(dtype); }
};

// What to pack: the weight of y = x·Wᵀ (+ bias). Several row blocks are stacked along the
// output dimension, which is how q/k/v and gate/up become one fused GEMM.
struct LinearPackSpec {
  std::string name;                    // for logs and errors, e.g. "layers.3.qkv"
  std::vector<WeightView> row_blocks;  // all with the same cols; concatenated by rows
  std::vector<float> bias;             // empty, or one value per output row
  DType compute_dtype = DType::kF32;   // kF32 or kBF16: the dtype the packed weight is kept in
  // Quantized weights (kernels/quantization.h) instead of compute_dtype ones, where the backend
  // has kernels for them; compute_dtype is then what shapes it cannot quantize fall back to.
  Quantization quantization = Quantization::kNone;
  // The weight as packed before (a native tensorized file written with --prepack), instead of
  // row_blocks: the backend adopts its bytes where it packs that layout itself, and otherwise
  // unpacks it and packs as usual. The bytes stay valid for the packed linear's life.
  const PackedImage* prepacked = nullptr;
};

// A weight packed by one backend, run by that backend's ExecutionContext::Linear:
// y[m, n] = Σ_k x[m, k]·W[n, k] (+ bias[n]); activations fp32, accumulation fp32.
class PackedLinear {
 public:
  virtual ~PackedLinear() = default;
  PackedLinear(const PackedLinear&) = delete;
  PackedLinear& operator=(const PackedLinear&) = delete;

  virtual const std::string& name() const = 0;
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  virtual DType compute_dtype() const = 0;
  // How the weight is quantized (kNone: kept in compute_dtype).
  virtual Quantization quantization() const { return Quantization::kNone; }
  // Bytes of packed weight (and bias) this layer holds.
  virtual size_t packed_bytes() const = 0;
  // Kernel that runs it (e.g. oneDNN's impl string "brg:avx512_core_bf16"), for logs and benches.
  virtual std::string kernel_name() const = 0;
  // The packed bytes as an image a file can keep (bias excluded), or nothing when the layout is
  // not one the backend can adopt again. Points into this linear: valid while it lives.
  virtual std::optional<PackedImage> Image() const { return std::nullopt; }
  // Whether the weight was adopted from a PackedImage rather than packed.
  virtual bool adopted() const { return false; }
  // Whether an adopted weight is read where the image's bytes lie (a file's mapping: see
  // PackedImage::backing) rather than from a copy.
  virtual bool adopted_in_place() const { return false; }

 protected:
  PackedLinear() = default;
};

// A tensor PostLoad places on the backend as it is: a norm weight, the embedding table, the RoPE
// table.
struct ConstantSpec {
  std::string name;
  WeightView source;          // host bytes, any stored dtype
  DType dtype = DType::kF32;  // dtype kept on the backend (norms: F32; the embedding: as stored)
  // The source stays valid for the model's life (mapped checkpoint bytes the model keeps), so a
  // backend that reads host memory may use it in place instead of copying it.
  bool source_outlives_model = false;
};

// Everything a model's forward reads, described for the one run-once preparation stage.
struct PreparePlan {
  std::vector<LinearPackSpec> linears;
  std::vector<ConstantSpec> constants;
};

// What Backend::Prepare returns: one packed linear per LinearPackSpec and one view per
// ConstantSpec, in plan order. The views point into `buffers` or, when zero-copy, into the
// source. Move-only.
struct PreparedWeights {
  std::vector<std::unique_ptr<PackedLinear>> linears;
  std::vector<TensorView> constants;
  std::vector<DeviceBuffer> buffers;
  std::vector<bool> zero_copy;  // per constant: it is the source's bytes, not a copy
};

// Geometry of causal grouped-query attention. A step's qkv rows are
// [q: n_heads·head_dim | k: n_kv_heads·head_dim | v: n_kv_heads·head_dim]; query head h reads
// kv head h / (n_heads / n_kv_heads).
struct AttentionShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;  // on q·k; 1/√head_dim for every supported architecture

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
};

struct EmbedOptions {
  // Rows at position 0 get zeros instead of their token's row (DeepSeek-style MTP heads).
  bool zero_at_position_zero = false;
};

struct ContextOptions {
  StepLimits limits;         // the largest step BeginStep accepts
  size_t scratch_bytes = 0;  // the activation arena, allocated once here
};

// One model's place to run: a device backend keeps its stream, library handles and per-step
// metadata here; the arena holds every activation, so a step allocates nothing. Not thread-safe:
// one step loop drives it. Ops are queued in order and may run asynchronously; CopyToHost and
// Synchronize wait for everything queued before them.
//
// Every op checks its shapes, dtypes and devices here, once for all backends, and then runs the
// backend's kernel. Activations are fp32; `rows` of a step-wide op is the current step's
// rows(). Views may have row strides unless an op says otherwise.
class ExecutionContext {
 public:
  virtual ~ExecutionContext() = default;
  ExecutionContext(const ExecutionContext&) = delete;
  ExecutionContext& operator=(const ExecutionContext&) = delete;

  Device device() const { return device_; }
  const StepLimits& limits() const { return limits_; }
  // The arena (ContextOptions::scratch_bytes, 256-byte aligned).
  const DeviceBuffer& scratch() const { return scratch_; }

  // Validates `step` (ValidateStep) and makes it the current step.
  absl::Status BeginStep(const StepMetadata& step);
  const StepMetadata& step() const { return step_; }
  // Runs `ops`, the current step's ops, and returns its status. A backend may hold resources
  // across them: the CPU backend keeps its threads in one parallel region for a decode-sized step
  // (kernels/cpu/step_team.h) instead of starting one per op.
  absl::Status RunStep(absl::FunctionRef<absl::Status()> ops) { return DoRunStep(ops); }

  // out[r] = table[token_ids[r]] as fp32, for every row. table: [vocab, hidden] in any stored
  // dtype; out: [rows, hidden].
  absl::Status Embed(const TensorView& table, const EmbedOptions& options, const TensorView& out);
  // Each group of weight.cols values of each row: out = x · rsqrt(mean(x²) + eps) · weight, in
  // fp32 as Hugging Face. weight.cols == in.cols is the per-row norm; weight.cols == head_dim
  // over the q (or k) columns of qkv is the per-head q/k norm. in: [R, C]; weight: [1, G] with
  // C % G == 0; out: [R, C]; out may be in.
  absl::Status RmsNorm(const TensorView& in, const TensorView& weight, float eps,
                       const TensorView& out);
  // residual += delta; out = RmsNorm(residual). residual, delta, out: [R, C]; weight: [1, C].
  absl::Status AddRmsNorm(const TensorView& residual, const TensorView& delta,
                          const TensorView& weight, float eps, const TensorView& out);
  // out = in · Wᵀ (+ bias). in: [R, in_features], out: [R, out_features], both contiguous.
  // `linear` must come from this context's backend.
  absl::Status Linear(const PackedLinear& linear, const TensorView& in, const TensorView& out);
  // Rotates the q and k heads of every row at its position (Hugging Face rotate-half; inv_freq:
  // [1, head_dim / 2], the RoPE table), then writes the row's k and v into layer `layer` of its
  // sequence's KV cache at that position. qkv: [rows, shape.qkv_dim()], rotated in place.
  absl::Status RopeAndAppendKv(const TensorView& qkv, const AttentionShape& shape,
                               const TensorView& inv_freq, int64_t layer);
  // Causal attention of every row's q over its sequence's keys and values of layer `layer` up to
  // and including its own position (prefill chunks, decode rows and speculative verification
  // rows alike). qkv: [rows, shape.qkv_dim()] (only q is read); out: [rows, shape.q_dim()].
  absl::Status Attention(const TensorView& qkv, const AttentionShape& shape, int64_t layer,
                         const TensorView& out);
  // out[r, i] = silu(gate_up[r, i]) · gate_up[r, I + i]. gate_up: [R, 2I]; out: [R, I].
  absl::Status SiluMul(const TensorView& gate_up, const TensorView& out);
  // y += x. Both [R, C].
  absl::Status Add(const TensorView& y, const TensorView& x);
  // out[i] = in[gather_rows[first + i]] for i < count. in: [rows, C]; out: [count, C].
  absl::Status GatherRows(const TensorView& in, int64_t first, int64_t count,
                          const TensorView& out);

  // Explicit copies between host memory (contiguous rows) and a view of backend memory.
  absl::Status CopyFromHost(const void* host, const TensorView& dst);
  // Waits for the queued ops, then copies.
  absl::Status CopyToHost(const TensorView& src, void* host);
  // Waits for every queued op; returns the first error a kernel reported.
  virtual absl::Status Synchronize() = 0;

  // While set (not null), every op adds its time to `profile` (kernels/op_profile.h). For
  // benches: timing waits for each op.
  void set_profile(OpProfile* profile) { profile_ = profile; }
  // While set, called after every Linear with its input and output, both waited for (benches:
  // the per-layer error of quantized weights). Empty: none.
  using LinearObserver =
      std::function<void(const PackedLinear& linear, const TensorView& in, const TensorView& out)>;
  void set_linear_observer(LinearObserver observer) { linear_observer_ = std::move(observer); }

 protected:
  ExecutionContext(Device device, StepLimits limits, DeviceBuffer scratch)
      : device_(device), limits_(limits), scratch_(std::move(scratch)) {}

  // The backend's kernels: called after the checks above passed.
  virtual absl::Status DoBeginStep(const StepMetadata& step) = 0;
  virtual absl::Status DoRunStep(absl::FunctionRef<absl::Status()> ops) { return ops(); }
  virtual absl::Status DoEmbed(const TensorView& table, const EmbedOptions& options,
                               const TensorView& out) = 0;
  virtual absl::Status DoRmsNorm(const TensorView& in, const TensorView& weight, float eps,
                                 const TensorView& out) = 0;
  virtual absl::Status DoAddRmsNorm(const TensorView& residual, const TensorView& delta,
                                    const TensorView& weight, float eps, const TensorView& out) = 0;
  virtual absl::Status DoLinear(const PackedLinear& linear, const TensorView& in,
                                const TensorView& out) = 0;
  virtual absl::Status DoRopeAndAppendKv(const TensorView& qkv, const AttentionShape& shape,
                                         const TensorView& inv_freq, int64_t layer) = 0;
  virtual absl::Status DoAttention(const TensorView& qkv, const AttentionShape& shape,
                                   int64_t layer, const TensorView& out) = 0;
  virtual absl::Status DoSiluMul(const TensorView& gate_up, const TensorView& out) = 0;
  virtual absl::Status DoAdd(const TensorView& y, const TensorView& x) = 0;
  virtual absl::Status DoGatherRows(const TensorView& in, int64_t first, int64_t count,
                                    const TensorView& out) = 0;
  virtual absl::Status DoCopyFromHost(const void* host, const TensorView& dst) = 0;
  virtual absl::Status DoCopyToHost(const TensorView& src, void* host) = 0;

 private:
  absl::Status CheckTensor(const TensorView& view, absl::string_view op,
                           absl::string_view what) const;
  absl::Status CheckKvLayer(absl::string_view op, int64_t layer, const AttentionShape& shape) const;
  // Runs one op's kernel, timed into profile_ when profiling.
  template <typename Kernel>
  absl::Status Run(OpKind kind, const PackedLinear* linear, Kernel&& kernel);

  const Device device_;
  const StepLimits limits_;
  const DeviceBuffer scratch_;
  StepMetadata step_;
  OpProfile* profile_ = nullptr;
  LinearObserver linear_observer_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // The name it is registered under (kernels/backend_registry.h), e.g. "cpu".
  virtual absl::string_view name() const = 0;
  // What runs, for logs and GetModel, e.g. "oneDNN 2.6 brgemm, 2 threads, avx512_core_bf16".
  virtual std::string description() const = 0;
  virtual Device device() const = 0;
  // True when ops may read host memory in place: PostLoad then keeps a memory-mapped embedding
  // zero-copy. False for a device with memory of its own.
  virtual bool reads_host_memory() const = 0;

  // ---- Memory (synchronous) --------------------------------------------------------------------
  // Bytes the device could still hand out now (what sizes default pools); 0 when unknown.
  virtual uint64_t available_memory() const = 0;
  virtual absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) = 0;
  // Copies `bytes` from host memory to `dst` at `offset`, and back.
  virtual absl::Status Upload(const void* host, size_t bytes, const DeviceBuffer& dst,
                              size_t offset = 0) = 0;
  virtual absl::Status Download(const DeviceBuffer& src, size_t offset, size_t bytes,
                                void* host) = 0;
  // Waits for every copy and kernel the backend queued.
  virtual absl::Status Synchronize() = 0;

  // ---- Weights: run once, at PostLoad ----------------------------------------------------------
  // Packs the weight into the layout the backend's fastest kernel wants. Shapes the fast path
  // does not support fall back to a slower layout instead of failing.
  virtual absl::StatusOr<std::unique_ptr<PackedLinear>> PackLinear(const LinearPackSpec& spec) = 0;
  // Packs a whole model's weights: one result per spec, in order. A backend may pack them
  // concurrently (the CPU backend does); this default packs them one after another. On error
  // nothing is returned and the status names the first failing spec.
  virtual absl::StatusOr<std::vector<std::unique_ptr<PackedLinear>>> PackLinears(
      absl::Span<const LinearPackSpec> specs);
  // Places one constant: zero-copy when allowed and reads_host_memory(), else converted to
  // spec.dtype into a buffer of its own (appended to `buffers`).
  virtual absl::StatusOr<TensorView> PrepareConstant(const ConstantSpec& spec,
                                                     std::vector<DeviceBuffer>& buffers,
                                                     bool* zero_copy);
  // The preparation stage: PackLinears, then PrepareConstant for each constant. A device backend
  // may override it to place everything in one arena. Errors name the tensor.
  virtual absl::StatusOr<PreparedWeights> Prepare(const PreparePlan& plan);

  // Called on the thread that loaded a model once its post-load stage is done: a backend may
  // release what it held for that thread's share of the load. The CPU backend releases the
  // thread's OpenMP workers (see CpuBackend).
  virtual void FinishLoadOnThisThread() {}

  // ---- Execution -------------------------------------------------------------------------------
  virtual absl::StatusOr<std::unique_ptr<ExecutionContext>> CreateContext(
      const ContextOptions& options) = 0;
};

// Alignment of every view a context hands out of its arena, and of buffers backends allocate.
inline constexpr size_t kTensorAlignment = 256;

}  // namespace kiln
