#include "kernels/backend.h"

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kiln {

std::string Device::ToString() const {
  return kind == DeviceKind::kHost ? std::string("host") : absl::StrCat("cuda:", ordinal);
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(std::shared_ptr<MemoryResource> resource,
                                                    size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  KILN_ASSIGN_OR_RETURN(void* data, resource->Allocate(bytes));
  return DeviceBuffer(std::move(resource), data, bytes);
}

std::string TensorView::ShapeString() const {
  return absl::StrCat("[", rows, ", ", cols, "] ", DTypeName(dtype),
                      contiguous() ? "" : absl::StrCat(" (row stride ", row_stride, ")"), " on ",
                      device.ToString());
}

absl::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kEmbed:
      return "Embed";
    case OpKind::kRmsNorm:
      return "RmsNorm";
    case OpKind::kAddRmsNorm:
      return "AddRmsNorm";
    case OpKind::kLinear:
      return "Linear";
    case OpKind::kRopeAndAppendKv:
      return "RopeAndAppendKv";
    case OpKind::kAttention:
      return "Attention";
    case OpKind::kSiluMul:
      return "SiluMul";
    case OpKind::kAdd:
      return "Add";
    case OpKind::kGatherRows:
      return "GatherRows";
    case OpKind::kCopyFromHost:
      return "CopyFromHost";
    case OpKind::kCopyToHost:
      return "CopyToHost";
  }
  return "?";
}

double OpProfile::total_seconds() const {
  double total = 0;
  for (const Entry& entry : by_kind) total += entry.seconds;
  return total;
}

// ---- ExecutionContext: the checks every backend shares ---------------------------------------

namespace {

template <typename... Parts>
absl::Status OpError(absl::string_view op, const Parts&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", parts...));
}

bool SameShape(const TensorView& a, const TensorView& b) {
  return a.rows == b.rows && a.cols == b.cols;
}

}  // namespace

absl::Status ExecutionContext::CheckTensor(const TensorView& view, absl::string_view op,
                                           absl::string_view what) const {
  if (view.rows < 0 || view.cols < 0 || view.row_stride < view.cols) {
    return OpError(op, what, " has an invalid shape ", view.ShapeString());
  }
  if (view.data == nullptr && !view.empty()) return OpError(op, what, " has no data");
  if (!(view.device == device_)) {
    return OpError(op, what, " lives on ", view.device.ToString(), ", not on ", device_.ToString());
  }
  if (view.dtype != DType::kF32) {
    return OpError(op, what, " must be F32, got ", view.ShapeString());
  }
  return absl::OkStatus();
}

absl::Status ExecutionContext::CheckKvLayer(absl::string_view op, int64_t layer,
                                            const AttentionShape& shape) const {
  if (shape.n_heads <= 0 || shape.n_kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.n_heads % shape.n_kv_heads != 0) {
    return OpError(op, "invalid attention shape: ", shape.n_heads, " heads, ", shape.n_kv_heads,
                   " kv heads, head_dim ", shape.head_dim);
  }
  const KvPoolRef& pool = step_.pool;
  if (!(pool.device == device_)) {
    return OpError(op, "the KV pool lives on ", pool.device.ToString(), ", not on ",
                   device_.ToString());
  }
  if (layer < 0 || layer >= pool.layers) {
    return OpError(op, "layer ", layer, " is outside a KV pool of ", pool.layers, " layers");
  }
  if (pool.kv_dim != shape.kv_dim()) {
    return OpError(op, "KV pool rows hold ", pool.kv_dim, " values; the shape needs ",
                   shape.kv_dim());
  }
  return absl::OkStatus();
}

template <typename Kernel>
absl::Status ExecutionContext::Run(OpKind kind, const PackedLinear* linear, Kernel&& kernel) {
  if (profile_ == nullptr) return kernel();
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = kernel();
  if (status.ok()) status = Synchronize();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  OpProfile::Entry& entry = profile_->by_kind[static_cast<size_t>(kind)];
  entry.seconds += seconds;
  ++entry.calls;
  if (linear != nullptr) {
    auto it = profile_->by_linear.find(linear->name());
    if (it == profile_->by_linear.end())
      it = profile_->by_linear.emplace(linear->name(), OpProfile::Entry()).first;
    it->second.seconds += seconds;
    ++it->second.calls;
  }
  return status;
}

absl::Status ExecutionContext::BeginStep(const StepMetadata& step) {
  KILN_RETURN_IF_ERROR(ValidateStep(step, limits_));
  // Assigning keeps the vectors' memory: after the first steps this allocates nothing.
  step_.token_ids.assign(step.token_ids.begin(), step.token_ids.end());
  step_.positions.assign(step.positions.begin(), step.positions.end());
  step_.row_sequence.assign(step.row_sequence.begin(), step.row_sequence.end());
  step_.sequences.assign(step.sequences.begin(), step.sequences.end());
  step_.block_tables.assign(step.block_tables.begin(), step.block_tables.end());
  step_.pool = step.pool;
  step_.gather_rows.assign(step.gather_rows.begin(), step.gather_rows.end());
  return DoBeginStep(step_);
}

absl::Status ExecutionContext::Embed(const TensorView& table, const EmbedOptions& options,
                                     const TensorView& out) {
  constexpr absl::string_view kOp = "Embed";
  KILN_RETURN_IF_ERROR(CheckTensor(out, kOp, "out"));
  if (!(table.device == device_) || table.data == nullptr || table.rows <= 0 ||
      table.row_stride != table.cols) {
    return OpError(kOp, "table must be a contiguous matrix on ", device_.ToString(), ", got ",
                   table.ShapeString());
  }
  if (out.rows != step_.rows() || out.cols != table.cols) {
    return OpError(kOp, "out is ", out.ShapeString(), "; the step needs [", step_.rows(), ", ",
                   table.cols, "]");
  }
  for (int32_t id : step_.token_ids) {
    if (id < 0 || id >= table.rows) {
      return OpError(kOp, "token id ", id, " is outside the table's ", table.rows, " rows");
    }
  }
  return Run(OpKind::kEmbed, nullptr, [&] { return DoEmbed(table, options, out); });
}

absl::Status ExecutionContext::RmsNorm(const TensorView& in, const TensorView& weight, float eps,
                                       const TensorView& out) {
  constexpr absl::string_view kOp = "RmsNorm";
  KILN_RETURN_IF_ERROR(CheckTensor(in, kOp, "in"));
  KILN_RETURN_IF_ERROR(CheckTensor(weight, kOp, "weight"));
  KILN_RETURN_IF_ERROR(CheckTensor(out, kOp, "out"));
  if (!SameShape(in, out)) {
    return OpError(kOp, "in ", in.ShapeString(), " and out ", out.ShapeString(), " differ");
  }
  if (weight.rows != 1 || weight.cols <= 0 || in.cols % weight.cols != 0) {
    return OpError(kOp, "weight ", weight.ShapeString(), " does not divide rows of ", in.cols);
  }
  if (!(eps >= 0.0f)) return OpError(kOp, "eps ", eps, " is negative");
  return Run(OpKind::kRmsNorm, nullptr, [&] { return DoRmsNorm(in, weight, eps, out); });
}

absl::Status ExecutionContext::AddRmsNorm(const TensorView& residual, const TensorView& delta,
                                          const TensorView& weight, float eps,
                                          const TensorView& out) {
  constexpr absl::string_view kOp = "AddRmsNorm";
  KILN_RETURN_IF_ERROR(CheckTensor(residual, kOp, "residual"));
  KILN_RETURN_IF_ERROR(CheckTensor(delta, kOp, "delta"));
  KILN_RETURN_IF_ERROR(CheckTensor(weight, kOp, "weight"));
  KILN_RETURN_IF_ERROR(CheckTensor(out, kOp, "out"));
  if (!SameShape(residual, delta) || !SameShape(residual, out)) {
    return OpError(kOp, "residual ", residual.ShapeString(), ", delta ", delta.ShapeString(),
                   " and out ", out.ShapeString(), " must have one shape");
  }
  if (weight.rows != 1 || weight.cols != residual.cols) {
    return OpError(kOp, "weight ", weight.ShapeString(), " must be [1, ", residual.cols, "]");
  }
  if (!(eps >= 0.0f)) return OpError(kOp, "eps ", eps, " is negative");
  return Run(OpKind::kAddRmsNorm, nullptr,
             [&] { return DoAddRmsNorm(residual, delta, weight, eps, out); });
}

absl::Status ExecutionContext::Linear(const PackedLinear& linear, const TensorView& in,
                                      const TensorView& out) {
  const std::string op = absl::StrCat("Linear(", linear.name(), ")");
  KILN_RETURN_IF_ERROR(CheckTensor(in, op, "in"));
  KILN_RETURN_IF_ERROR(CheckTensor(out, op, "out"));
  if (in.cols != linear.in_features() || out.cols != linear.out_features() || in.rows != out.rows) {
    return OpError(op, "in ", in.ShapeString(), " and out ", out.ShapeString(), " do not fit a [",
                   linear.out_features(), ", ", linear.in_features(), "] weight");
  }
  if (!in.contiguous() || !out.contiguous()) {
    return OpError(op, "in and out rows must be contiguous");
  }
  if (in.rows == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Run(OpKind::kLinear, &linear, [&] { return DoLinear(linear, in, out); }));
  if (linear_observer_) {
    KILN_RETURN_IF_ERROR(Synchronize());
    linear_observer_(linear, in, out);
  }
  return absl::OkStatus();
}

absl::Status ExecutionContext::RopeAndAppendKv(const TensorView& qkv, const AttentionShape& shape,
                                               const TensorView& inv_freq, int64_t layer) {
  constexpr absl::string_view kOp = "RopeAndAppendKv";
  KILN_RETURN_IF_ERROR(CheckTensor(qkv, kOp, "qkv"));
  KILN_RETURN_IF_ERROR(CheckTensor(inv_freq, kOp, "inv_freq"));
  KILN_RETURN_IF_ERROR(CheckKvLayer(kOp, layer, shape));
  if (qkv.rows != step_.rows() || qkv.cols != shape.qkv_dim()) {
    return OpError(kOp, "qkv is ", qkv.ShapeString(), "; the step needs [", step_.rows(), ", ",
                   shape.qkv_dim(), "]");
  }
  if (shape.head_dim % 2 != 0 || inv_freq.rows != 1 || inv_freq.cols != shape.head_dim / 2) {
    return OpError(kOp, "inv_freq ", inv_freq.ShapeString(), " does not fit head_dim ",
                   shape.head_dim);
  }
  return Run(OpKind::kRopeAndAppendKv, nullptr,
             [&] { return DoRopeAndAppendKv(qkv, shape, inv_freq, layer); });
}

absl::Status ExecutionContext::Attention(const TensorView& qkv, const AttentionShape& shape,
                                         int64_t layer, const TensorView& out) {
  constexpr absl::string_view kOp = "Attention";
  KILN_RETURN_IF_ERROR(CheckTensor(qkv, kOp, "qkv"));
  KILN_RETURN_IF_ERROR(CheckTensor(out, kOp, "out"));
  KILN_RETURN_IF_ERROR(CheckKvLayer(kOp, layer, shape));
  if (qkv.rows != step_.rows() || qkv.cols != shape.qkv_dim() || out.rows != step_.rows() ||
      out.cols != shape.q_dim()) {
    return OpError(kOp, "qkv ", qkv.ShapeString(), " and out ", out.ShapeString(),
                   " do not fit a step of ", step_.rows(), " rows with ", shape.n_heads,
                   " heads of ", shape.head_dim);
  }
  return Run(OpKind::kAttention, nullptr, [&] { return DoAttention(qkv, shape, layer, out); });
}

absl::Status ExecutionContext::SiluMul(const TensorView& gate_up, const TensorView& out) {
  constexpr absl::string_view kOp = "SiluMul";
  KILN_RETURN_IF_ERROR(CheckTensor(gate_up, kOp, "gate_up"));
  KILN_RETURN_IF_ERROR(CheckTensor(out, kOp, "out"));
  if (gate_up.rows != out.rows || gate_up.cols != 2 * out.cols) {
    return OpError(kOp, "gate_up ", gate_up.ShapeString(), " must be twice as wide as out ",
                   out.ShapeString());
  }
  return Run(OpKind::kSiluMul, nullptr, [&] { return DoSiluMul(gate_up, out); });
}

absl::Status ExecutionContext::Add(const TensorView& y, const TensorView& x) {
  constexpr absl::string_view kOp = "Add";
  KILN_RETURN_IF_ERROR(CheckTensor(y, kOp, "y"));
  KILN_RETURN_IF_ERROR(CheckTensor(x, kOp, "x"));
  if (!SameShape(x, y)) {
    return OpError(kOp, "y ", y.ShapeString(), " and x ", x.ShapeString(), " differ");
  }
  return Run(OpKind::kAdd, nullptr, [&] { return DoAdd(y, x); });
}

absl::Status ExecutionContext::GatherRows(const TensorView& in, int64_t first, int64_t count,
                                          const TensorView& out) {
  constexpr absl::string_view kOp = "GatherRows";
  KILN_RETURN_IF_ERROR(CheckTensor(in, kOp, "in"));
  KILN_RETURN_IF_ERROR(CheckTensor(out, kOp, "out"));
  const int64_t listed = static_cast<int64_t>(step_.gather_rows.size());
  if (first < 0 || count < 0 || first + count > listed) {
    return OpError(kOp, "rows [", first, ", +", count, ") of a list of ", listed);
  }
  if (in.rows != step_.rows() || out.rows != count || out.cols != in.cols) {
    return OpError(kOp, "in ", in.ShapeString(), " and out ", out.ShapeString(), " do not fit ",
                   count, " of the step's ", step_.rows(), " rows");
  }
  if (count == 0) return absl::OkStatus();
  return Run(OpKind::kGatherRows, nullptr, [&] { return DoGatherRows(in, first, count, out); });
}

absl::Status ExecutionContext::CopyFromHost(const void* host, const TensorView& dst) {
  KILN_RETURN_IF_ERROR(CheckTensor(dst, "CopyFromHost", "dst"));
  if (host == nullptr && !dst.empty()) return OpError("CopyFromHost", "no host memory");
  if (dst.empty()) return absl::OkStatus();
  return Run(OpKind::kCopyFromHost, nullptr, [&] { return DoCopyFromHost(host, dst); });
}

absl::Status ExecutionContext::CopyToHost(const TensorView& src, void* host) {
  KILN_RETURN_IF_ERROR(CheckTensor(src, "CopyToHost", "src"));
  if (host == nullptr && !src.empty()) return OpError("CopyToHost", "no host memory");
  if (src.empty()) return Synchronize();
  return Run(OpKind::kCopyToHost, nullptr, [&] { return DoCopyToHost(src, host); });
}

// ---- Backend defaults --------------------------------------------------------------------------

absl::StatusOr<std::vector<std::unique_ptr<PackedLinear>>> Backend::PackLinears(
    absl::Span<const LinearPackSpec> specs) {
  std::vector<std::unique_ptr<PackedLinear>> packed;
  packed.reserve(specs.size());
  for (const LinearPackSpec& spec : specs) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<PackedLinear> linear, PackLinear(spec));
    packed.push_back(std::move(linear));
  }
  return packed;
}

absl::StatusOr<TensorView> Backend::PrepareConstant(const ConstantSpec& spec,
                                                    std::vector<DeviceBuffer>& buffers,
                                                    bool* zero_copy) {
  const WeightView& source = spec.source;
  *zero_copy = false;
  if (source.rows < 0 || source.cols < 0 || (source.data == nullptr && source.elements() > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("constant ", spec.name, " has no data"));
  }
  if (spec.dtype != DType::kF32 && spec.dtype != source.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("constant ", spec.name, " is stored as ",
                                                   DTypeName(source.dtype),
                                                   "; it can be kept as "
                                                   "that or as F32, not ",
                                                   DTypeName(spec.dtype)));
  }
  const bool aligned = reinterpret_cast<uintptr_t>(source.data) % DTypeSize(source.dtype) == 0;
  if (spec.source_outlives_model && reads_host_memory() && spec.dtype == source.dtype && aligned) {
    *zero_copy = true;
    return TensorView::Matrix(const_cast<std::byte*>(source.data), source.dtype, device(),
                              source.rows, source.cols);
  }
  const size_t bytes = static_cast<size_t>(source.elements()) * DTypeSize(spec.dtype);
  KILN_ASSIGN_OR_RETURN(DeviceBuffer buffer, Allocate(bytes));
  if (bytes > 0) {
    if (spec.dtype == source.dtype) {
      KILN_RETURN_IF_ERROR(Upload(source.data, bytes, buffer));
    } else {
      std::vector<float> converted(static_cast<size_t>(source.elements()));
      ConvertToF32(source.dtype, source.data, source.elements(), converted.data());
      KILN_RETURN_IF_ERROR(Upload(converted.data(), bytes, buffer));
    }
  }
  TensorView view = ViewOf(buffer, spec.dtype, source.rows, source.cols);
  buffers.push_back(std::move(buffer));
  return view;
}

absl::StatusOr<PreparedWeights> Backend::Prepare(const PreparePlan& plan) {
  PreparedWeights prepared;
  KILN_ASSIGN_OR_RETURN(prepared.linears, PackLinears(plan.linears));
  for (const ConstantSpec& spec : plan.constants) {
    bool zero_copy = false;
    absl::StatusOr<TensorView> view = PrepareConstant(spec, prepared.buffers, &zero_copy);
    if (!view.ok()) return KilnAnnotate(view.status(), absl::StrCat("preparing ", spec.name));
    prepared.constants.push_back(*view);
    prepared.zero_copy.push_back(zero_copy);
  }
  KILN_RETURN_IF_ERROR(Synchronize());
  return prepared;
}

}  // namespace kiln
