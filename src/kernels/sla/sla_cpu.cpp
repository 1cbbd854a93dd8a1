#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/sla/sla.h"

namespace td::kernels {
namespace {

thread_local std::string t_sla_error;

Status fail(Status s, const std::string& m) {
  t_sla_error = m;
  return s;
}

std::string str(int64_t v) { return std::to_string(v); }

// Element (b, h, t, 0) of a strided tensor.
inline const float* at(const float* base, const AttnStrides& s, int64_t b, int64_t h, int64_t t) {
  return base + b * s.batch + h * s.head + t * s.token;
}
inline float* at(float* base, const AttnStrides& s, int64_t b, int64_t h, int64_t t) {
  return base + b * s.batch + h * s.head + t * s.token;
}

// φ applied to one head_dim row, into out.
void feature_map(SlaFeatureMap fm, const float* x, float* out, int64_t D) {
  switch (fm) {
    case SlaFeatureMap::Softmax: {
      float mx = x[0];
      for (int64_t c = 1; c < D; ++c) mx = std::max(mx, x[c]);
      double sum = 0;
      for (int64_t c = 0; c < D; ++c) sum += (out[c] = std::exp(x[c] - mx));
      const float inv = float(1.0 / sum);
      for (int64_t c = 0; c < D; ++c) out[c] *= inv;
      return;
    }
    case SlaFeatureMap::Elu:
      for (int64_t c = 0; c < D; ++c) out[c] = x[c] > 0 ? x[c] + 1.0f : std::exp(x[c]);  // elu(x) + 1
      return;
    case SlaFeatureMap::Relu:
      for (int64_t c = 0; c < D; ++c) out[c] = std::max(x[c], 0.0f);
      return;
  }
}

// Block selection for one (b, h): LUT rows of n_sel for each query block.
void select_blocks(const SlaProblem& p, const float* q, const float* k, int64_t b, int64_t h, int64_t n_sel,
                   uint8_t* map, int32_t* lut) {
  const int64_t L = p.len, D = p.head_dim, QB = p.query_blocks(), KB = p.key_blocks();
  std::vector<double> kmean(size_t(D), 0.0);
  for (int64_t t = 0; t < L; ++t) {
    const float* r = at(k, p.k, b, h, t);
    for (int64_t c = 0; c < D; ++c) kmean[size_t(c)] += r[c];
  }
  for (auto& m : kmean) m /= double(L);
  // Pooled, smoothed K: [KB, D]; pooled Q: [QB, D].
  std::vector<float> pk(size_t(KB * D)), pq(size_t(QB * D));
  for (int64_t j = 0; j < KB; ++j) {
    const int64_t t0 = j * p.block_k, t1 = std::min(L, t0 + p.block_k);
    std::vector<double> acc(size_t(D), 0.0);
    for (int64_t t = t0; t < t1; ++t) {
      const float* r = at(k, p.k, b, h, t);
      for (int64_t c = 0; c < D; ++c) acc[size_t(c)] += double(r[c]) - kmean[size_t(c)];
    }
    for (int64_t c = 0; c < D; ++c) pk[size_t(j * D + c)] = float(acc[size_t(c)] / double(t1 - t0));
  }
  for (int64_t i = 0; i < QB; ++i) {
    const int64_t t0 = i * p.block_q, t1 = std::min(L, t0 + p.block_q);
    std::vector<double> acc(size_t(D), 0.0);
    for (int64_t t = t0; t < t1; ++t) {
      const float* r = at(q, p.q, b, h, t);
      for (int64_t c = 0; c < D; ++c) acc[size_t(c)] += r[c];
    }
    for (int64_t c = 0; c < D; ++c) pq[size_t(i * D + c)] = float(acc[size_t(c)] / double(t1 - t0));
  }
  std::vector<float> score(static_cast<size_t>(KB));
  std::vector<int32_t> order(static_cast<size_t>(KB));
  for (int64_t i = 0; i < QB; ++i) {
    for (int64_t j = 0; j < KB; ++j) {
      double s = 0;
      for (int64_t c = 0; c < D; ++c) s += double(pq[size_t(i * D + c)]) * pk[size_t(j * D + c)];
      score[size_t(j)] = float(s);
    }
    std::iota(order.begin(), order.end(), 0);
    // Descending score; equal scores: lower key-block index first (deterministic ties).
    std::partial_sort(order.begin(), order.begin() + n_sel, order.end(), [&](int32_t a, int32_t c) {
      return score[size_t(a)] > score[size_t(c)] || (score[size_t(a)] == score[size_t(c)] && a < c);
    });
    const int64_t row = (b * p.heads + h) * QB + i;
    if (map) {
      std::fill(map + row * KB, map + (row + 1) * KB, uint8_t(0));
      for (int64_t s = 0; s < n_sel; ++s) map[row * KB + order[size_t(s)]] = 1;
    }
    if (lut)
      for (int64_t s = 0; s < n_sel; ++s) lut[row * n_sel + s] = order[size_t(s)];
  }
}

// Sparse branch for one (b, h).
void sparse_head(const SlaProblem& p, const float* q, const float* k, const float* v, const int32_t* lut,
                 int64_t n_sel, float* o, float* lse, int64_t b, int64_t h) {
  const int64_t L = p.len, D = p.head_dim, QB = p.query_blocks();
  std::vector<int64_t> tokens;
  std::vector<float> s;
  std::vector<double> acc(static_cast<size_t>(D));
  for (int64_t i = 0; i < QB; ++i) {
    tokens.clear();
    const int32_t* row = lut + ((b * p.heads + h) * QB + i) * n_sel;
    for (int64_t e = 0; e < n_sel; ++e) {
      const int64_t t0 = int64_t(row[e]) * p.block_k, t1 = std::min(L, t0 + p.block_k);
      for (int64_t t = t0; t < t1; ++t) tokens.push_back(t);
    }
    s.resize(tokens.size());
    const int64_t q0 = i * p.block_q, q1 = std::min(L, q0 + p.block_q);
    for (int64_t t = q0; t < q1; ++t) {
      const float* qr = at(q, p.q, b, h, t);
      float mx = -INFINITY;
      for (size_t n = 0; n < tokens.size(); ++n) {
        const float* kr = at(k, p.k, b, h, tokens[n]);
        float d = 0;
        for (int64_t c = 0; c < D; ++c) d += qr[c] * kr[c];
        s[n] = d * p.scale;
        mx = std::max(mx, s[n]);
      }
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t n = 0; n < tokens.size(); ++n) {
        const float w = std::exp(s[n] - mx);
        sum += w;
        const float* vr = at(v, p.v, b, h, tokens[n]);
        for (int64_t c = 0; c < D; ++c) acc[size_t(c)] += double(w) * vr[c];
      }
      float* orow = at(o, p.o, b, h, t);
      for (int64_t c = 0; c < D; ++c) orow[c] = float(acc[size_t(c)] / sum);
      if (lse) lse[(b * p.heads + h) * L + t] = float(double(mx) + std::log(sum));
    }
  }
}

// Linear branch for one (b, h), o_l into o.
void linear_head(const SlaProblem& p, const float* q, const float* k, const float* v, float* o, int64_t b, int64_t h) {
  const int64_t L = p.len, D = p.head_dim;
  std::vector<double> kv(size_t(D * D), 0.0), ksum(size_t(D), 0.0);  // φ(K)ᵀV [D(feature), D(value)], Σφ(K)
  std::vector<float> phi(static_cast<size_t>(D));
  for (int64_t t = 0; t < L; ++t) {
    feature_map(p.feature_map, at(k, p.k, b, h, t), phi.data(), D);
    const float* vr = at(v, p.v, b, h, t);
    for (int64_t f = 0; f < D; ++f) {
      const double pf = phi[size_t(f)];
      ksum[size_t(f)] += pf;
      double* kr = kv.data() + f * D;
      for (int64_t c = 0; c < D; ++c) kr[c] += pf * vr[c];
    }
  }
  std::vector<float> kvf(kv.begin(), kv.end()), ksumf(ksum.begin(), ksum.end());
  std::vector<double> num(static_cast<size_t>(D));
  for (int64_t t = 0; t < L; ++t) {
    feature_map(p.feature_map, at(q, p.q, b, h, t), phi.data(), D);
    double den = 0;
    std::fill(num.begin(), num.end(), 0.0);
    for (int64_t f = 0; f < D; ++f) {
      const double pf = phi[size_t(f)];
      den += pf * ksumf[size_t(f)];
      const float* kr = kvf.data() + f * D;
      for (int64_t c = 0; c < D; ++c) num[size_t(c)] += pf * kr[c];
    }
    den += 1e-5;
    float* orow = at(o, p.o, b, h, t);
    for (int64_t c = 0; c < D; ++c) orow[c] = float(num[size_t(c)] / den);
  }
}

void for_each_head(const SlaProblem& p, const std::function<void(int64_t, int64_t)>& fn) {
  td::parallel_for(p.batch * p.heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) fn(bh / p.heads, bh % p.heads);
  });
}

}  // namespace

namespace detail {
Status sla_fail(Status s, const std::string& message) { return fail(s, message); }
}  // namespace detail

int64_t sla_selected_blocks(double topk, int64_t key_blocks) {
  const double want = std::floor(topk * double(key_blocks));
  return std::clamp<int64_t>(int64_t(want), 1, key_blocks);
}

const char* sla_last_error() { return t_sla_error.c_str(); }

Status sla_check(const SlaProblem& p) {
  if (p.batch <= 0 || p.heads <= 0 || p.len <= 0 || p.head_dim <= 0)
    return fail(Status::InvalidArgument, "sla: sizes must be positive, got batch " + str(p.batch) + ", heads " +
                                             str(p.heads) + ", len " + str(p.len) + ", head_dim " + str(p.head_dim));
  if (p.block_q <= 0 || p.block_k <= 0)
    return fail(Status::InvalidArgument,
                "sla: block sizes must be positive, got " + str(p.block_q) + " x " + str(p.block_k));
  for (const AttnStrides* s : {&p.q, &p.k, &p.v, &p.o})
    if (s->batch < 0 || s->head < 0 || s->token < 0)
      return fail(Status::InvalidArgument, "sla: strides must be non-negative");
  if (!(std::isfinite(p.scale) && p.scale > 0))
    return fail(Status::InvalidArgument, "sla: scale must be finite and positive, got " + std::to_string(p.scale));
  if (!(p.topk > 0 && p.topk <= 1))
    return fail(Status::InvalidArgument, "sla: topk must be in (0, 1], got " + std::to_string(p.topk));
  t_sla_error.clear();
  return Status::Ok;
}

Status sla_block_map_cpu(const SlaProblem& p, const float* q, const float* k, uint8_t* block_map, int32_t* lut) {
  if (Status s = sla_check(p); s != Status::Ok) return s;
  const int64_t n_sel = sla_selected_blocks(p.topk, p.key_blocks());
  for_each_head(p, [&](int64_t b, int64_t h) { select_blocks(p, q, k, b, h, n_sel, block_map, lut); });
  return Status::Ok;
}

Status sla_sparse_cpu(const SlaProblem& p, const float* q, const float* k, const float* v, const int32_t* lut,
                      int64_t n_sel, float* o, float* lse) {
  if (Status s = sla_check(p); s != Status::Ok) return s;
  const int64_t KB = p.key_blocks();
  if (n_sel < 1 || n_sel > KB)
    return fail(Status::InvalidArgument,
                "sla: n_sel must be in [1, " + str(KB) + "] key blocks, got " + str(n_sel));
  const int64_t entries = p.batch * p.heads * p.query_blocks() * n_sel;
  for (int64_t e = 0; e < entries; ++e)
    if (lut[e] < 0 || lut[e] >= KB)
      return fail(Status::InvalidArgument,
                  "sla: LUT entry " + str(e) + " is " + str(lut[e]) + ", outside [0, " + str(KB) + ")");
  for_each_head(p, [&](int64_t b, int64_t h) { sparse_head(p, q, k, v, lut, n_sel, o, lse, b, h); });
  return Status::Ok;
}

Status sla_linear_cpu(const SlaProblem& p, const float* q, const float* k, const float* v, float* o) {
  if (Status s = sla_check(p); s != Status::Ok) return s;
  for_each_head(p, [&](int64_t b, int64_t h) { linear_head(p, q, k, v, o, b, h); });
  return Status::Ok;
}

Status sla_cpu(const SlaProblem& p, const float* q, const float* k, const float* v, const float* proj_weight,
               const float* proj_bias, float* o, uint8_t* block_map, int32_t* lut, float* lse) {
  if (Status s = sla_check(p); s != Status::Ok) return s;
  if ((proj_weight == nullptr) != (proj_bias == nullptr))
    return fail(Status::InvalidArgument, "sla: proj_l weight and bias must both be given or both be null");
  const int64_t D = p.head_dim, L = p.len, n_sel = sla_selected_blocks(p.topk, p.key_blocks());
  const int64_t lut_per_head = p.query_blocks() * n_sel;
  std::vector<int32_t> own_lut;  // [B, H, QB, n_sel] when the caller wants no LUT back
  if (!lut) own_lut.resize(size_t(p.batch * p.heads * lut_per_head));
  int32_t* head_lut = lut ? lut : own_lut.data();
  for_each_head(p, [&](int64_t b, int64_t h) {
    select_blocks(p, q, k, b, h, n_sel, block_map, head_lut);
    sparse_head(p, q, k, v, head_lut, n_sel, o, lse, b, h);
    if (!proj_weight) return;
    // o_l for this head in a dense [L, D] scratch, then o += o_l Wᵀ + bias.
    std::vector<float> ol(size_t(L * D));
    SlaProblem lp = p;
    lp.o = {0, 0, D};
    linear_head(lp, q, k, v, ol.data(), b, h);  // lp.o ignores b and h
    for (int64_t t = 0; t < L; ++t) {
      const float* x = ol.data() + t * D;
      float* orow = at(o, p.o, b, h, t);
      for (int64_t r = 0; r < D; ++r) {
        const float* w = proj_weight + r * D;
        double acc = proj_bias[r];
        for (int64_t c = 0; c < D; ++c) acc += double(w[c]) * x[c];
        orow[r] += float(acc);
      }
    }
  });
  return Status::Ok;
}

}  // namespace td::kernels
