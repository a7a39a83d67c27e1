#include "models/step_buffers.h"

namespace kiln {
namespace {

// Hands out aligned [rows, cols] fp32 views one after another; with no arena it only counts.
class Carver {
 public:
  explicit Carver(const DeviceBuffer* arena) : arena_(arena) {}

  TensorView Take(int64_t rows, int64_t cols) {
    TensorView view;
    if (arena_ != nullptr) view = ViewOf(*arena_, DType::kF32, rows, cols, offset_);
    const size_t bytes = static_cast<size_t>(rows * cols) * sizeof(float);
    offset_ += (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
    return view;
  }
  size_t offset() const { return offset_; }

 private:
  const DeviceBuffer* arena_;
  size_t offset_ = 0;
};

StepBuffers CarveWith(Carver& carver, const ModelConfig& c, const StepCapacity& capacity,
                      bool mtp) {
  const int64_t rows = capacity.max_rows;
  StepBuffers b;
  b.residual = carver.Take(rows, c.hidden_size);
  b.normed = carver.Take(rows, c.hidden_size);
  b.qkv = carver.Take(rows, c.q_dim() + 2 * c.kv_dim());
  b.attention = carver.Take(rows, c.q_dim());
  b.projected = carver.Take(rows, c.hidden_size);
  b.gate_up = carver.Take(rows, 2 * c.intermediate_size);
  b.activated = carver.Take(rows, c.intermediate_size);
  if (mtp) {
    b.embedded = carver.Take(rows, c.hidden_size);
    b.concat = carver.Take(rows, 2 * c.hidden_size);
    b.hidden_in = carver.Take(rows, c.hidden_size);
  }
  b.selected = carver.Take(capacity.max_logits_rows, c.hidden_size);
  b.logits = carver.Take(capacity.max_logits_rows, c.vocab_size);
  return b;
}

}  // namespace

size_t StepBuffers::Bytes(const ModelConfig& config, const StepCapacity& capacity, bool mtp) {
  Carver counter(nullptr);
  CarveWith(counter, config, capacity, mtp);
  return counter.offset();
}

StepBuffers StepBuffers::Carve(const DeviceBuffer& arena, const ModelConfig& config,
                               const StepCapacity& capacity, bool mtp) {
  Carver carver(&arena);
  return CarveWith(carver, config, capacity, mtp);
}

}  // namespace kiln
