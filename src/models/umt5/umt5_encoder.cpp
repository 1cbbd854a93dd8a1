#include "models/umt5/umt5_encoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/t5_attention.h"

namespace td::models::umt5 {

int64_t relative_position_bucket(int64_t rel, int64_t num_buckets, int64_t max_distance) {
  const int64_t half = num_buckets / 2;
  int64_t bucket = rel > 0 ? half : 0;
  const int64_t n = rel < 0 ? -rel : rel;
  const int64_t max_exact = half / 2;
  if (n < max_exact) return bucket + n;
  // HF: log(n.float() / max_exact) / math.log(max_distance / max_exact) * (half - max_exact), in fp32
  // (torch casts the Python double divisor to the tensor's fp32), truncated toward zero.
  const float ratio = std::log(float(n) / float(max_exact)) / float(std::log(double(max_distance) / double(max_exact)));
  const float scaled = ratio * float(half - max_exact);
  const int64_t large = std::min<int64_t>(max_exact + int64_t(scaled), half - 1);
  return bucket + large;
}

std::vector<int32_t> relative_buckets(int64_t len, const UMT5Config& c) {
  std::vector<int32_t> out(static_cast<size_t>(2 * len - 1));
  for (int64_t r = -(len - 1); r <= len - 1; ++r)
    out[size_t(r + len - 1)] = int32_t(relative_position_bucket(r, c.num_buckets, c.max_distance));
  return out;
}

namespace {

// The rows of the (host) embedding table for ids, as f32 [B*L, d_model].
Tensor gather_embedding(const Tensor& table, const Tensor& ids, int64_t vocab) {
  const int64_t n = ids.numel(), d = table.size(1);
  const int64_t* ip = ids.data<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TD_CHECK(ip[i] >= 0 && ip[i] < vocab, Usage, "umT5 token id ", ip[i], " at position ", i,
             " is outside the encoder's vocabulary [0, ", vocab, ") (a tokenizer that does not belong to this encoder?)");
  Tensor out = Tensor::empty({n, d}, DType::F32);
  float* op = out.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const Tensor row = table.select(0, ip[i]).contiguous().to(DType::F32);
    std::memcpy(op + i * d, row.data<float>(), size_t(d) * sizeof(float));
  }
  return out;
}

}  // namespace

UMT5Encoder::UMT5Encoder(UMT5Weights weights) : w_(std::move(weights)) {}

Tensor UMT5Encoder::forward(const Tensor& ids_in, const Tensor& mask_in) const {
  const UMT5Config& c = w_.config;
  TD_CHECK(ids_in.device().is_cpu() && mask_in.device().is_cpu(), Usage,
           "umT5 forward: ids and mask must be host tensors (got ", ids_in.device().str(), ", ",
           mask_in.device().str(), ")");
  TD_CHECK(ids_in.dim() == 2 && ids_in.dtype() == DType::I64, Shape, "umT5 forward: ids must be i64 [B, L], got ",
           dtype_name(ids_in.dtype()), shape_str(ids_in.shape()));
  TD_CHECK(mask_in.shape() == ids_in.shape() && mask_in.dtype() == DType::I64, Shape,
           "umT5 forward: mask must be i64 ", shape_str(ids_in.shape()), " like ids, got ", dtype_name(mask_in.dtype()),
           shape_str(mask_in.shape()));
  const Tensor ids = ids_in.contiguous(), mask = mask_in.contiguous();
  const int64_t B = ids.size(0), L = ids.size(1), H = c.num_heads, D = c.d_kv;
  const Device dev = w_.device;
  const DType run = w_.dtype;
  const std::vector<int32_t> buckets = relative_buckets(L, c);
  Tensor x = gather_embedding(w_.token_embedding, ids, c.vocab);  // f32 [B*L, d_model], the residual stream
  if (dev.is_cuda()) x = x.to(dev);
  for (const UMT5Layer& l : w_.layers) {
    // Self-attention sub-layer.
    const Tensor h = ops::rms_norm(x, l.norm1, c.eps, run);
    const Tensor q = ops::linear(h, l.q, Tensor()), k = ops::linear(h, l.k, Tensor()),
                 v = ops::linear(h, l.v, Tensor());
    const Tensor a = ops::t5_attention(q.view({B, L, H, D}), k.view({B, L, H, D}), v.view({B, L, H, D}),
                                       l.relative_bias, buckets, mask)
                         .view({B * L, H * D});
    ops::add_(x, ops::linear(a, l.o, Tensor(), DType::F32));
    // Gated-GELU feed-forward sub-layer: gate (HF wi_0) takes the GELU.
    const Tensor h2 = ops::rms_norm(x, l.norm2, c.eps, run);
    const Tensor g = ops::gelu_tanh(ops::linear(h2, l.gate, Tensor()));
    const Tensor f = ops::mul(ops::linear(h2, l.fc1, Tensor()), g);
    ops::add_(x, ops::linear(f, l.fc2, Tensor(), DType::F32));
  }
  return ops::rms_norm(x, w_.final_norm, c.eps, DType::F32).view({B, L, c.d_model});
}

}  // namespace td::models::umt5
