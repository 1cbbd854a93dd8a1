// The umT5 encoder forward (Wan's T5Encoder / HF UMT5EncoderModel):
//   x = token_embedding[ids]
//   per layer: x += O(Attn(RMSNorm1(x)))  -- no 1/sqrt(d_kv) scaling, the
//                 layer's own relative-position bias, padded keys masked out,
//                 softmax in fp32
//              x += fc2(fc1(h) * gelu_tanh(gate(h))), h = RMSNorm2(x)
//   out = RMSNorm(x)   (T5 RMSNorm: x * rsqrt(mean(x^2) + eps) * w, no mean, no bias)
// Norms, linears and activations go through src/ops (CPU fp32 reference on
// host tensors, CUDA kernels / cuBLASLt BF16 on device tensors). The attention
// core (QK^T + bias + mask, softmax, PV) is computed here on the host; CUDA
// runs copy q/k/v to the host for it (no CUDA attention with an additive bias
// exists in src/ops yet), which is correct but slow.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "models/umt5/umt5_loader.h"

namespace td::models::umt5 {

// T5's bidirectional bucket of rel = key - query: half the buckets per
// direction (positive rel in the upper half), exact below num_buckets/4, then
// logarithmic up to max_distance, computed in fp32 as HF does.
int64_t relative_position_bucket(int64_t rel, int64_t num_buckets, int64_t max_distance);

// The attention core on host fp32 tensors. q, k, v: [B, L, H, d] (contiguous);
// bias: [H, L, L] added to the scores; key_mask: [B, L] int64, 0 = padding key
// (excluded, as HF's dtype-minimum fill does). Returns [B, L, H, d] f32.
Tensor t5_attention_host(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const Tensor& key_mask);

class UMT5Encoder {
 public:
  explicit UMT5Encoder(UMT5Weights weights);
  const UMT5Config& config() const { return w_.config; }
  const UMT5Weights& weights() const { return w_; }

  // ids, mask: host int64 [B, L] (mask 1 = token, 0 = padding; every row needs
  // at least one token). Returns the last hidden state [B, L, d_model], f32, on
  // the weights' device; rows of padding positions are computed too (the
  // zero-pad rule is umt5_tokenizer.h's zero_pad_context).
  Tensor forward(const Tensor& ids, const Tensor& mask) const;

 private:
  UMT5Weights w_;
};

}  // namespace td::models::umt5
