// The umT5 encoder forward (Wan's T5Encoder / HF UMT5EncoderModel):
//   x = token_embedding[ids]
//   per layer: x += O(Attn(RMSNorm1(x)))  -- no 1/sqrt(d_kv) scaling, the
//                 layer's own relative-position bias, padded keys masked out,
//                 softmax in fp32
//              x += fc2(fc1(h) * gelu_tanh(gate(h))), h = RMSNorm2(x)
//   out = RMSNorm(x)   (T5 RMSNorm: x * rsqrt(mean(x^2) + eps) * w, no mean, no bias)
// Everything goes through src/ops: the CPU fp32 reference on host tensors,
// the CUDA kernels / cuBLASLt BF16 on device tensors (the attention core is
// ops::t5_attention, kernels/t5_attention).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "models/umt5/umt5_loader.h"

namespace td::models::umt5 {

// T5's bidirectional bucket of rel = key - query: half the buckets per
// direction (positive rel in the upper half), exact below num_buckets/4, then
// logarithmic up to max_distance, computed in fp32 as HF does.
int64_t relative_position_bucket(int64_t rel, int64_t num_buckets, int64_t max_distance);

// The 2L - 1 buckets of rel = key - query in [-(L - 1), L - 1], as ops::t5_attention takes them.
std::vector<int32_t> relative_buckets(int64_t len, const UMT5Config& config);

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
