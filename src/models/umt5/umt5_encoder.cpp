#include "models/umt5/umt5_encoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/norm.h"

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

Tensor t5_attention_host(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& bias_in,
                         const Tensor& key_mask_in) {
  for (const Tensor* t : {&q_in, &k_in, &v_in, &bias_in, &key_mask_in})
    TD_CHECK(t->device().is_cpu(), Unsupported, "t5_attention_host takes host tensors, got one on ",
             t->device().str());
  TD_CHECK(q_in.dim() == 4 && k_in.shape() == q_in.shape() && v_in.shape() == q_in.shape(), Shape,
           "t5_attention_host: q, k, v must share one [B, L, H, d] shape, got ", shape_str(q_in.shape()), ", ",
           shape_str(k_in.shape()), ", ", shape_str(v_in.shape()));
  const int64_t B = q_in.size(0), L = q_in.size(1), H = q_in.size(2), D = q_in.size(3);
  TD_CHECK(bias_in.shape() == Shape({H, L, L}), Shape, "t5_attention_host: bias is ", shape_str(bias_in.shape()),
           ", expected ", shape_str({H, L, L}));
  TD_CHECK(key_mask_in.shape() == Shape({B, L}) && key_mask_in.dtype() == DType::I64, Shape,
           "t5_attention_host: key_mask is ", dtype_name(key_mask_in.dtype()), shape_str(key_mask_in.shape()),
           ", expected i64", shape_str({B, L}));
  const Tensor q = q_in.contiguous().to(DType::F32), k = k_in.contiguous().to(DType::F32),
               v = v_in.contiguous().to(DType::F32), bias = bias_in.contiguous().to(DType::F32),
               mask = key_mask_in.contiguous();
  Tensor out = Tensor::empty({B, L, H, D}, DType::F32);
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  const float* bp = bias.data<float>();
  const int64_t* mp = mask.data<int64_t>();
  float* op = out.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    bool any = false;
    for (int64_t j = 0; j < L; ++j) any |= mp[b * L + j] != 0;
    TD_CHECK(any, Usage, "t5_attention_host: sample ", b, " of the batch has no unmasked token");
  }
  const int64_t row = H * D;  // elements between consecutive positions
  // One task per (sample, head, query): scores over the unmasked keys, an fp32
  // softmax, then the weighted sum of values.
  td::parallel_for(B * H * L, 16, [&](int64_t t0, int64_t t1) {
    std::vector<float> p(static_cast<size_t>(L));
    std::vector<float> acc(static_cast<size_t>(D));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / (H * L), h = (t / L) % H, i = t % L;
      const float* qi = qp + (b * L + i) * row + h * D;
      const float* brow = bp + (h * L + i) * L;
      const int64_t* m = mp + b * L;
      float mx = -INFINITY;
      for (int64_t j = 0; j < L; ++j) {
        if (m[j] == 0) continue;
        const float* kj = kp + (b * L + j) * row + h * D;
        float s = 0.f;
        for (int64_t d = 0; d < D; ++d) s += qi[d] * kj[d];
        s += brow[j];
        p[size_t(j)] = s;
        mx = std::max(mx, s);
      }
      float sum = 0.f;
      for (int64_t j = 0; j < L; ++j) {
        if (m[j] == 0) continue;
        p[size_t(j)] = std::exp(p[size_t(j)] - mx);
        sum += p[size_t(j)];
      }
      const float inv = 1.f / sum;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < L; ++j) {
        if (m[j] == 0) continue;
        const float w = p[size_t(j)] * inv;
        const float* vj = vp + (b * L + j) * row + h * D;
        for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += w * vj[d];
      }
      std::memcpy(op + (b * L + i) * row + h * D, acc.data(), size_t(D) * sizeof(float));
    }
  });
  return out;
}

namespace {

// bias[h][i][j] = table[bucket(j - i)][h] for one layer's [num_buckets, H] table.
Tensor relative_bias(const Tensor& table, int64_t L, const UMT5Config& c) {
  const int64_t H = c.num_heads;
  std::vector<int64_t> bucket_of(size_t(2 * L - 1));
  for (int64_t r = -(L - 1); r <= L - 1; ++r)
    bucket_of[size_t(r + L - 1)] = relative_position_bucket(r, c.num_buckets, c.max_distance);
  Tensor bias = Tensor::empty({H, L, L}, DType::F32);
  const float* tp = table.data<float>();
  float* bp = bias.data<float>();
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < L; ++j) bp[(h * L + i) * L + j] = tp[bucket_of[size_t(j - i + L - 1)] * H + h];
  return bias;
}

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
  if (dev.is_cuda())
    log_once(LogLevel::Warn, "umt5-host-attention",
             "umT5 on CUDA: the attention core (scores + relative bias + mask, softmax, PV) runs on the host; "
             "src/ops has no CUDA attention with an additive bias yet");

  Tensor x = gather_embedding(w_.token_embedding, ids, c.vocab);  // f32 [B*L, d_model], the residual stream
  if (dev.is_cuda()) x = x.to(dev);
  for (const UMT5Layer& l : w_.layers) {
    // Self-attention sub-layer.
    const Tensor h = ops::rms_norm(x, l.norm1, c.eps, run);
    Tensor q = ops::linear(h, l.q, Tensor()), k = ops::linear(h, l.k, Tensor()), v = ops::linear(h, l.v, Tensor());
    if (dev.is_cuda()) {
      q = q.to(Device::cpu());
      k = k.to(Device::cpu());
      v = v.to(Device::cpu());
    }
    Tensor a = t5_attention_host(q.view({B, L, H, D}), k.view({B, L, H, D}), v.view({B, L, H, D}),
                                 relative_bias(l.relative_bias, L, c), mask)
                   .view({B * L, H * D});
    if (a.dtype() != run) a = a.to(run);
    if (dev.is_cuda()) a = a.to(dev);
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
