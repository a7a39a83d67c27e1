// A test backend that stands in for a device with memory of its own: it runs the CPU backend's
// kernels, but reads no host memory in place (so PostLoad must prepare a copy of everything),
// counts every allocation, upload, download and op, and checks that each op reads and writes
// only memory the backend handed out: weights PostLoad prepared, the execution context's arena,
// and KV caches. Anything else an op touches is recorded as a violation.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/backend.h"

namespace kiln::testing_util {

struct TraceCounts {
  int64_t allocations = 0;
  int64_t uploads = 0;    // Backend::Upload
  int64_t downloads = 0;  // Backend::Download
  int64_t steps = 0;      // ExecutionContext::BeginStep
  int64_t ops = 0;
  int64_t copies_from_host = 0;
  int64_t copies_to_host = 0;
  int64_t packs = 0;
  int64_t prepares = 0;
};

class TracingBackend final : public Backend {
 public:
  enum class Kind { kPrepared, kAllocated };

  explicit TracingBackend(std::shared_ptr<Backend> inner)
      : inner_(std::move(inner)), memory_(std::make_shared<Memory>(this)) {}

  absl::string_view name() const override { return "tracing"; }
  std::string description() const override { return absl::StrCat("tracing over ", inner_->name()); }
  Device device() const override { return inner_->device(); }
  bool reads_host_memory() const override { return false; }

  uint64_t available_memory() const override { return inner_->available_memory(); }
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override {
    ++counts_.allocations;
    return DeviceBuffer::Allocate(memory_, bytes);
  }
  absl::Status Upload(const void* host, size_t bytes, const DeviceBuffer& dst,
                      size_t offset) override {
    ++counts_.uploads;
    return inner_->Upload(host, bytes, dst, offset);
  }
  absl::Status Download(const DeviceBuffer& src, size_t offset, size_t bytes, void* host) override {
    ++counts_.downloads;
    return inner_->Download(src, offset, bytes, host);
  }
  absl::Status Synchronize() override { return inner_->Synchronize(); }

  absl::StatusOr<std::unique_ptr<PackedLinear>> PackLinear(const LinearPackSpec& spec) override {
    ++counts_.packs;
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<PackedLinear> inner, inner_->PackLinear(spec));
    auto traced = std::make_unique<TracedLinear>(std::move(inner));
    std::lock_guard<std::mutex> lock(mu_);
    linears_.push_back(traced.get());
    return std::unique_ptr<PackedLinear>(std::move(traced));
  }

  // Everything allocated while preparing is prepared memory.
  absl::StatusOr<PreparedWeights> Prepare(const PreparePlan& plan) override {
    ++counts_.prepares;
    preparing_ = true;
    absl::StatusOr<PreparedWeights> prepared = Backend::Prepare(plan);
    preparing_ = false;
    return prepared;
  }

  absl::StatusOr<std::unique_ptr<ExecutionContext>> CreateContext(
      const ContextOptions& options) override;

  TraceCounts counts() const { return counts_; }
  std::vector<std::string> violations() const {
    std::lock_guard<std::mutex> lock(mu_);
    return violations_;
  }

  // Where [p, p + bytes) lies: a prepared weight, other backend memory, or nowhere known.
  enum class Where { kPrepared, kAllocated, kUnknown };
  Where Locate(const void* p, size_t bytes) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto* b = static_cast<const std::byte*>(p);
    auto it = live_.upper_bound(b);
    if (it == live_.begin()) return Where::kUnknown;
    --it;
    if (b + bytes > it->first + it->second.bytes) return Where::kUnknown;
    return it->second.prepared ? Where::kPrepared : Where::kAllocated;
  }
  bool IsPreparedLinear(const PackedLinear* linear) const {
    std::lock_guard<std::mutex> lock(mu_);
    return std::find(linears_.begin(), linears_.end(), linear) != linears_.end();
  }
  void Violation(std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    violations_.push_back(std::move(what));
  }
  Backend& inner() { return *inner_; }
  void CountOp() { ++counts_.ops; }
  void CountStep() { ++counts_.steps; }
  void CountCopy(bool from_host) {
    ++(from_host ? counts_.copies_from_host : counts_.copies_to_host);
  }

  // Wraps the inner backend's linear so that ops can tell it was prepared here.
  class TracedLinear final : public PackedLinear {
   public:
    explicit TracedLinear(std::unique_ptr<PackedLinear> inner) : inner_(std::move(inner)) {}
    const std::string& name() const override { return inner_->name(); }
    int64_t in_features() const override { return inner_->in_features(); }
    int64_t out_features() const override { return inner_->out_features(); }
    DType compute_dtype() const override { return inner_->compute_dtype(); }
    size_t packed_bytes() const override { return inner_->packed_bytes(); }
    std::string kernel_name() const override { return inner_->kernel_name(); }
    const PackedLinear& inner() const { return *inner_; }

   private:
    std::unique_ptr<PackedLinear> inner_;
  };

 private:
  // Host memory, tracked range by range.
  class Memory final : public MemoryResource {
   public:
    explicit Memory(TracingBackend* owner) : owner_(owner) {}
    Device device() const override { return Device{}; }
    absl::StatusOr<void*> Allocate(size_t bytes) override {
      void* p = std::aligned_alloc(
          kTensorAlignment, (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment);
      if (p == nullptr) return absl::ResourceExhaustedError("tracing backend: out of memory");
      std::lock_guard<std::mutex> lock(owner_->mu_);
      owner_->live_[static_cast<std::byte*>(p)] = {bytes, owner_->preparing_};
      return p;
    }
    void Deallocate(void* data, size_t /*bytes*/) noexcept override {
      {
        std::lock_guard<std::mutex> lock(owner_->mu_);
        owner_->live_.erase(static_cast<std::byte*>(data));
      }
      std::free(data);
    }

   private:
    TracingBackend* owner_;
  };
  struct Range {
    size_t bytes = 0;
    bool prepared = false;
  };

  std::shared_ptr<Backend> inner_;
  std::shared_ptr<Memory> memory_;
  TraceCounts counts_;
  std::atomic<bool> preparing_{false};
  mutable std::mutex mu_;
  std::map<const std::byte*, Range> live_;
  std::vector<const PackedLinear*> linears_;
  std::vector<std::string> violations_;
};

// Runs every op on an inner context of the CPU backend after checking where its tensors live.
class TracingContext final : public ExecutionContext {
 public:
  TracingContext(TracingBackend* backend, StepLimits limits, DeviceBuffer scratch,
                 std::unique_ptr<ExecutionContext> inner)
      : ExecutionContext(backend->device(), limits, std::move(scratch)),
        backend_(backend),
        inner_(std::move(inner)) {}

  absl::Status Synchronize() override { return inner_->Synchronize(); }

 protected:
  absl::Status DoBeginStep(const StepMetadata& step) override {
    backend_->CountStep();
    const size_t pool_bytes =
        static_cast<size_t>(step.pool.num_blocks * step.pool.block_elements()) *
        DTypeSize(step.pool.dtype);
    if (!step.sequences.empty() &&
        backend_->Locate(step.pool.data, pool_bytes) != TracingBackend::Where::kAllocated) {
      backend_->Violation("BeginStep: a KV pool not allocated by the backend");
    }
    return inner_->BeginStep(step);
  }
  absl::Status DoEmbed(const TensorView& table, const EmbedOptions& options,
                       const TensorView& out) override {
    Weight("Embed", "table", table);
    Activation("Embed", "out", out);
    return inner_->Embed(table, options, out);
  }
  absl::Status DoRmsNorm(const TensorView& in, const TensorView& weight, float eps,
                         const TensorView& out) override {
    Activation("RmsNorm", "in", in);
    Weight("RmsNorm", "weight", weight);
    Activation("RmsNorm", "out", out);
    return inner_->RmsNorm(in, weight, eps, out);
  }
  absl::Status DoAddRmsNorm(const TensorView& residual, const TensorView& delta,
                            const TensorView& weight, float eps, const TensorView& out) override {
    Activation("AddRmsNorm", "residual", residual);
    Activation("AddRmsNorm", "delta", delta);
    Weight("AddRmsNorm", "weight", weight);
    Activation("AddRmsNorm", "out", out);
    return inner_->AddRmsNorm(residual, delta, weight, eps, out);
  }
  absl::Status DoLinear(const PackedLinear& linear, const TensorView& in,
                        const TensorView& out) override {
    backend_->CountOp();
    Activation("Linear", "in", in);
    Activation("Linear", "out", out);
    if (!backend_->IsPreparedLinear(&linear)) {
      backend_->Violation(absl::StrCat("Linear: ", linear.name(), " was not prepared here"));
      return absl::InvalidArgumentError("foreign linear");
    }
    return inner_->Linear(static_cast<const TracingBackend::TracedLinear&>(linear).inner(), in,
                          out);
  }
  absl::Status DoRopeAndAppendKv(const TensorView& qkv, const AttentionShape& shape,
                                 const TensorView& inv_freq, int64_t layer) override {
    Activation("RopeAndAppendKv", "qkv", qkv);
    Weight("RopeAndAppendKv", "inv_freq", inv_freq);
    return inner_->RopeAndAppendKv(qkv, shape, inv_freq, layer);
  }
  absl::Status DoAttention(const TensorView& qkv, const AttentionShape& shape, int64_t layer,
                           const TensorView& out) override {
    Activation("Attention", "qkv", qkv);
    Activation("Attention", "out", out);
    return inner_->Attention(qkv, shape, layer, out);
  }
  absl::Status DoSiluMul(const TensorView& gate_up, const TensorView& out) override {
    Activation("SiluMul", "gate_up", gate_up);
    Activation("SiluMul", "out", out);
    return inner_->SiluMul(gate_up, out);
  }
  absl::Status DoAdd(const TensorView& y, const TensorView& x) override {
    Activation("Add", "y", y);
    Activation("Add", "x", x);
    return inner_->Add(y, x);
  }
  absl::Status DoGatherRows(const TensorView& in, int64_t first, int64_t count,
                            const TensorView& out) override {
    Activation("GatherRows", "in", in);
    Activation("GatherRows", "out", out);
    return inner_->GatherRows(in, first, count, out);
  }
  absl::Status DoCopyFromHost(const void* host, const TensorView& dst) override {
    backend_->CountCopy(/*from_host=*/true);
    Activation("CopyFromHost", "dst", dst);
    return inner_->CopyFromHost(host, dst);
  }
  absl::Status DoCopyToHost(const TensorView& src, void* host) override {
    backend_->CountCopy(/*from_host=*/false);
    Activation("CopyToHost", "src", src);
    return inner_->CopyToHost(src, host);
  }

 private:
  void Weight(absl::string_view op, absl::string_view what, const TensorView& view) {
    backend_->CountOp();
    if (backend_->Locate(view.data, view.span_bytes()) != TracingBackend::Where::kPrepared) {
      backend_->Violation(absl::StrCat(op, ": ", what, " is not a weight PostLoad prepared"));
    }
  }
  void Activation(absl::string_view op, absl::string_view what, const TensorView& view) {
    if (!scratch().Contains(view.data, view.span_bytes())) {
      backend_->Violation(absl::StrCat(op, ": ", what, " is outside the context's arena"));
    }
  }

  TracingBackend* backend_;
  std::unique_ptr<ExecutionContext> inner_;
};

inline absl::StatusOr<std::unique_ptr<ExecutionContext>> TracingBackend::CreateContext(
    const ContextOptions& options) {
  KILN_ASSIGN_OR_RETURN(DeviceBuffer scratch, Allocate(options.scratch_bytes));
  ContextOptions inner_options = options;
  inner_options.scratch_bytes = 0;  // the inner kernels run on this backend's arena
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ExecutionContext> inner,
                        inner_->CreateContext(inner_options));
  return std::unique_ptr<ExecutionContext>(
      new TracingContext(this, options.limits, std::move(scratch), std::move(inner)));
}

}  // namespace kiln::testing_util
