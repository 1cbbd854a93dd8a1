// The fp32 CPU reference of exact attention (see attention.h). Every GPU
// attention backend is tested against it, so it favours plain, checkable
// arithmetic: scores in fp32 (exact products of the bf16 inputs, 8 partial
// sums), the row maximum subtracted before exp, row sums in fp64, P·V in fp32,
// one division at the end. Work is split over (batch, head, tile of query rows)
// so that a tile's rows reuse each K/V row while it is in cache.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/attention/attention.h"

namespace td::kernels {
namespace {

constexpr int64_t kQueryTile = 16;

float load_elem(const void* base, ElemType t, int64_t i) {
  if (t == ElemType::F32) return static_cast<const float*>(base)[i];
  uint16_t h;
  std::memcpy(&h, static_cast<const uint8_t*>(base) + 2 * i, 2);
  return t == ElemType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

void store_elem(void* base, ElemType t, int64_t i, float v) {
  if (t == ElemType::F32) {
    static_cast<float*>(base)[i] = v;
    return;
  }
  const uint16_t h = t == ElemType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
  std::memcpy(static_cast<uint8_t*>(base) + 2 * i, &h, 2);
}

// Eight independent partial sums: the compiler vectorises them, and the
// result does not depend on the thread count.
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int u = 0; u < 8; ++u) acc[u] += a[i + u] * b[i + u];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// K or V of every (batch, head) as fp32, [batch*heads][len][head_dim] contiguous.
std::vector<float> gather_f32(const void* x, ElemType t, const AttnStrides& s, int64_t batch, int64_t heads,
                              int64_t len, int64_t dim) {
  std::vector<float> out(size_t(batch * heads * len * dim));
  parallel_for(batch * heads * len, 256, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t bh = r / len, tok = r % len, b = bh / heads, h = bh % heads;
      const int64_t src = b * s.batch + h * s.head + tok * s.token;
      float* dst = out.data() + r * dim;
      for (int64_t c = 0; c < dim; ++c) dst[c] = load_elem(x, t, src + c);
    }
  });
  return out;
}

}  // namespace

Status attention_cpu(const AttnProblem& p, const void* q, const void* k, const void* v, void* o, float* lse) {
  if (Status s = attention_check(p); s != Status::Ok) return s;
  if (!q || !k || !v || !o)
    return detail::attn_fail(Status::InvalidArgument, std::string("attention_cpu: null pointer for ") +
                                                          (!q ? "Q" : !k ? "K" : !v ? "V" : "O"));
  const int64_t B = p.batch, H = p.heads, Lq = p.len_q, Lk = p.len_kv, D = p.head_dim;
  const std::vector<float> kf = gather_f32(k, p.qkv_type, p.k, B, H, Lk, D);
  const std::vector<float> vf = gather_f32(v, p.qkv_type, p.v, B, H, Lk, D);

  const int64_t tiles = (Lq + kQueryTile - 1) / kQueryTile;
  parallel_for(B * H * tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qt(size_t(kQueryTile * D)), scores(size_t(kQueryTile * Lk)), acc(size_t(kQueryTile * D));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / tiles, b = bh / H, h = bh % H;
      const int64_t i0 = (task % tiles) * kQueryTile, rows = std::min(kQueryTile, Lq - i0);
      const float* kb = kf.data() + bh * Lk * D;
      const float* vb = vf.data() + bh * Lk * D;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t src = b * p.q.batch + h * p.q.head + (i0 + r) * p.q.token;
        for (int64_t c = 0; c < D; ++c) qt[size_t(r * D + c)] = load_elem(q, p.qkv_type, src + c);
      }
      // Scores, key-major so each K row is read once per tile.
      for (int64_t j = 0; j < Lk; ++j)
        for (int64_t r = 0; r < rows; ++r)
          scores[size_t(r * Lk + j)] = p.scale * dot(qt.data() + r * D, kb + j * D, D);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t r = 0; r < rows; ++r) {
        float* s = scores.data() + r * Lk;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < Lk; ++j) mx = std::max(mx, s[j]);
        double sum = 0;
        for (int64_t j = 0; j < Lk; ++j) {
          s[j] = std::exp(s[j] - mx);
          sum += s[j];
        }
        float* a = acc.data() + r * D;
        for (int64_t j = 0; j < Lk; ++j) {
          const float pj = s[j];
          const float* vj = vb + j * D;
          for (int64_t c = 0; c < D; ++c) a[c] += pj * vj[c];
        }
        const int64_t dst = b * p.o.batch + h * p.o.head + (i0 + r) * p.o.token;
        const float inv = float(1.0 / sum);
        for (int64_t c = 0; c < D; ++c) store_elem(o, p.o_type, dst + c, a[c] * inv);
        if (lse) lse[(bh)*Lq + i0 + r] = float(double(mx) + std::log(sum));
      }
    }
  });
  return Status::Ok;
}

}  // namespace td::kernels
