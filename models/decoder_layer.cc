#include "models/decoder_layer.h"

#include <cmath>

#include "base/status_macros.h"

namespace kiln {

size_t DecoderLayerWeights::bytes() const {
  return qkv->packed_bytes() + o->packed_bytes() + gate_up->packed_bytes() + down->packed_bytes() +
         static_cast<size_t>(input_norm.elements() + post_attention_norm.elements() +
                             q_norm.elements() + k_norm.elements()) *
             sizeof(float);
}

AttentionShape AttentionShapeOf(const ModelConfig& c) {
  return AttentionShape{c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                        static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)))};
}

absl::Status RunDecoderLayer(ExecutionContext& ctx, const ModelConfig& c,
                             const DecoderLayerWeights& layer, const TensorView& rope_inv_freq,
                             int64_t cache_layer, const StepBuffers& b) {
  const int64_t rows = ctx.step().rows();
  const float eps = static_cast<float>(c.rms_norm_eps);
  const AttentionShape shape = AttentionShapeOf(c);
  const TensorView x = b.residual.Rows(0, rows);
  const TensorView normed = b.normed.Rows(0, rows);
  const TensorView qkv = b.qkv.Rows(0, rows);
  const TensorView attention = b.attention.Rows(0, rows);
  const TensorView projected = b.projected.Rows(0, rows);
  const TensorView gate_up = b.gate_up.Rows(0, rows);
  const TensorView activated = b.activated.Rows(0, rows);

  KILN_RETURN_IF_ERROR(ctx.RmsNorm(x, layer.input_norm, eps, normed));
  KILN_RETURN_IF_ERROR(ctx.Linear(*layer.qkv, normed, qkv));
  if (!layer.q_norm.empty()) {
    const TensorView q = qkv.Cols(0, shape.q_dim());
    const TensorView k = qkv.Cols(shape.q_dim(), shape.kv_dim());
    KILN_RETURN_IF_ERROR(ctx.RmsNorm(q, layer.q_norm, eps, q));
    KILN_RETURN_IF_ERROR(ctx.RmsNorm(k, layer.k_norm, eps, k));
  }
  KILN_RETURN_IF_ERROR(ctx.RopeAndAppendKv(qkv, shape, rope_inv_freq, cache_layer));
  KILN_RETURN_IF_ERROR(ctx.Attention(qkv, shape, cache_layer, attention));
  KILN_RETURN_IF_ERROR(ctx.Linear(*layer.o, attention, projected));
  KILN_RETURN_IF_ERROR(ctx.AddRmsNorm(x, projected, layer.post_attention_norm, eps, normed));
  KILN_RETURN_IF_ERROR(ctx.Linear(*layer.gate_up, normed, gate_up));
  KILN_RETURN_IF_ERROR(ctx.SiluMul(gate_up, activated));
  KILN_RETURN_IF_ERROR(ctx.Linear(*layer.down, activated, projected));
  return ctx.Add(x, projected);
}

}  // namespace kiln
