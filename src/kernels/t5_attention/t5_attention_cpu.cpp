// fp32 reference of the T5 attention core (contract in t5_attention.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/t5_attention/t5_attention.h"

namespace td::kernels {

Status t5_attention_check(const T5AttentionArgs& a) {
  if (a.batch < 1 || a.len < 1 || a.heads < 1 || a.head_dim < 1 || a.num_buckets < 1) return Status::InvalidArgument;
  const auto float_type = [](ElemType t) { return t == ElemType::F32 || t == ElemType::F16 || t == ElemType::BF16; };
  if (!float_type(a.qkv_type) || !float_type(a.out_type)) return Status::InvalidArgument;
  if (a.len > (int64_t(1) << 20) || a.heads > 65535 || a.batch > 65535) return Status::Unsupported;
  return Status::Ok;
}

Status t5_attention_cpu(const T5AttentionArgs& a) {
  if (const Status s = t5_attention_check(a); s != Status::Ok) return s;
  if (a.qkv_type != ElemType::F32 || a.out_type != ElemType::F32) return Status::Unsupported;
  const int64_t B = a.batch, L = a.len, H = a.heads, D = a.head_dim;
  for (int64_t b = 0; b < B; ++b) {
    bool any = false;
    for (int64_t j = 0; j < L; ++j) any |= a.key_mask[b * L + j] != 0;
    if (!any) return Status::InvalidArgument;
  }
  for (int64_t r = 0; r < 2 * L - 1; ++r)
    if (a.rel_bucket[r] < 0 || a.rel_bucket[r] >= a.num_buckets) return Status::InvalidArgument;
  const auto* qp = static_cast<const float*>(a.q);
  const auto* kp = static_cast<const float*>(a.k);
  const auto* vp = static_cast<const float*>(a.v);
  auto* op = static_cast<float*>(a.out);
  const int64_t row = H * D;  // elements between consecutive positions
  // One task per (sample, head, query): scores over the unmasked keys, an fp32
  // softmax, then the weighted sum of values.
  td::parallel_for(B * H * L, 16, [&](int64_t t0, int64_t t1) {
    std::vector<float> p(static_cast<size_t>(L));
    std::vector<float> acc(static_cast<size_t>(D));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / (H * L), h = (t / L) % H, i = t % L;
      const float* qi = qp + (b * L + i) * row + h * D;
      const int32_t* m = a.key_mask + b * L;
      float mx = -INFINITY;
      for (int64_t j = 0; j < L; ++j) {
        if (m[j] == 0) continue;
        const float* kj = kp + (b * L + j) * row + h * D;
        float s = 0.f;
        for (int64_t d = 0; d < D; ++d) s += qi[d] * kj[d];
        s += a.bias_table[int64_t(a.rel_bucket[j - i + L - 1]) * H + h];
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
  return Status::Ok;
}

}  // namespace td::kernels
