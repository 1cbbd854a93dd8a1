// fp32 CPU reference of SageAttention-style quantized attention (see
// sage_attention.h for the quantization contract). It simulates the kernels'
// arithmetic step by step: the same INT8 quantization of Q (per token) and of
// smoothed K (per 64-key block), exact integer dot products, the same fp32
// dequantization factor, the online softmax over key tiles in the kernel's
// order, P̃ and V rounded to the backend's format (FP16 or FP8-e4m3). What it
// cannot reproduce bit for bit: exp2 (the GPU uses ex2.approx), the order of
// fp32 sums (row sums, P·V, the K mean), hence kernel-vs-reference bars of
// ~1e-3 rather than 0.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/sage_attention/sage_attention.h"

namespace td::kernels {
namespace {

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

// Round half away from zero, clamped to [-127, 127]: the kernels' roundf.
int8_t quant_i8(float x) { return int8_t(std::max(-127.f, std::min(127.f, std::round(x)))); }

}  // namespace

Status sage_sparse_check(const AttnProblem& p, const SageSparse* sparse) {
  using detail::attn_fail;
  if (Status s = attention_check(p); s != Status::Ok) return s;
  if (!sparse) return Status::Ok;
  auto ok_block = [](int64_t b) { return b == 64 || b == 128; };
  if (!ok_block(sparse->block_q) || !ok_block(sparse->block_k))
    return attn_fail(Status::InvalidArgument, "sage_attention: sparse block sizes must be 64 or 128, got block_q " +
                                                  std::to_string(sparse->block_q) + ", block_k " +
                                                  std::to_string(sparse->block_k));
  const int64_t kb = (p.len_kv + sparse->block_k - 1) / sparse->block_k;
  if (sparse->n_sel < 1 || sparse->n_sel > kb)
    return attn_fail(Status::InvalidArgument, "sage_attention: n_sel must be in [1, " + std::to_string(kb) +
                                                  "] (key blocks), got " + std::to_string(sparse->n_sel));
  if (!sparse->lut) return attn_fail(Status::InvalidArgument, "sage_attention: sparse mode without a LUT");
  return Status::Ok;
}

Status sage_attention_cpu(const AttnProblem& p, const void* q, const void* k, const void* v, void* o, float* lse,
                          const SageSparse* sparse, SageBackend backend) {
  using detail::attn_fail;
  if (Status s = sage_sparse_check(p, sparse); s != Status::Ok) return s;
  if (!q || !k || !v || !o) return attn_fail(Status::InvalidArgument, "sage_attention_cpu: null pointer");
  const bool fp8 = backend == SageBackend::Sm90;
  // The sm_90a sparse kernel without an LSE takes its row sums from the tensor
  // cores (P̃·1 on the e4m3-rounded P̃): l sums the rounded values (sage_attention.h).
  const bool l_rounded = fp8 && sparse != nullptr && lse == nullptr;
  const int64_t tile = fp8 ? 128 : 64;
  const int64_t B = p.batch, H = p.heads, Lq = p.len_q, Lk = p.len_kv, D = p.head_dim;
  const int64_t n_kblocks = (Lk + kSageKScaleBlock - 1) / kSageKScaleBlock;
  const int64_t QB = sparse ? (Lq + sparse->block_q - 1) / sparse->block_q : 0;
  const int64_t KB = sparse ? (Lk + sparse->block_k - 1) / sparse->block_k : 0;
  if (sparse) {
    const int64_t n = B * H * QB * sparse->n_sel;
    for (int64_t i = 0; i < n; ++i)
      if (sparse->lut[i] < 0 || sparse->lut[i] >= KB)
        return attn_fail(Status::InvalidArgument, "sage_attention_cpu: LUT entry " + std::to_string(i) + " = " +
                                                      std::to_string(sparse->lut[i]) + " is outside [0, " +
                                                      std::to_string(KB) + ")");
  }
  const float scale_log2 = float(double(p.scale) * 1.4426950408889634);
  constexpr float kLn2 = 0.69314718055994531f;

  parallel_for(B * H, 1, [&](int64_t begin, int64_t end) {
    const size_t nkd = size_t(Lk * D), nd = size_t(D);
    std::vector<float> kf(nkd), vq(nkd), km(nd), sv(nd), ks(static_cast<size_t>(n_kblocks)), qf(nd), acc(nd);
    std::vector<float> s(static_cast<size_t>(tile));
    std::vector<int8_t> ki(nkd), qi(nd);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      // K mean, smoothed K per 64-key block.
      for (int64_t t = 0; t < Lk; ++t)
        for (int64_t c = 0; c < D; ++c) kf[size_t(t * D + c)] = load_elem(k, p.qkv_type, b * p.k.batch + h * p.k.head + t * p.k.token + c);
      for (int64_t c = 0; c < D; ++c) {
        double sum = 0;
        for (int64_t t = 0; t < Lk; ++t) sum += kf[size_t(t * D + c)];
        km[size_t(c)] = float(sum / double(Lk));
      }
      for (int64_t kb = 0; kb < n_kblocks; ++kb) {
        const int64_t t0 = kb * kSageKScaleBlock, t1 = std::min(Lk, t0 + kSageKScaleBlock);
        float amax = 0;
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t c = 0; c < D; ++c) {
            float& x = kf[size_t(t * D + c)];
            x = x - km[size_t(c)];
            amax = std::max(amax, std::abs(x));
          }
        const float inv = amax > 0 ? 127.f / amax : 0.f;
        ks[size_t(kb)] = amax / 127.f;
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t c = 0; c < D; ++c) ki[size_t(t * D + c)] = quant_i8(kf[size_t(t * D + c)] * inv);
      }
      // V per channel.
      for (int64_t c = 0; c < D; ++c) {
        float amax = 0;
        for (int64_t t = 0; t < Lk; ++t)
          amax = std::max(amax, std::abs(load_elem(v, p.qkv_type, b * p.v.batch + h * p.v.head + t * p.v.token + c)));
        const float inv = amax > 0 ? 448.f / amax : 0.f;
        sv[size_t(c)] = amax / 448.f;
        for (int64_t t = 0; t < Lk; ++t) {
          const float x = load_elem(v, p.qkv_type, b * p.v.batch + h * p.v.head + t * p.v.token + c) * inv;
          vq[size_t(t * D + c)] = fp8 ? f8e4m3_to_f32(f32_to_f8e4m3(x)) : f16_to_f32(f32_to_f16(x));
        }
      }

      for (int64_t i = 0; i < Lq; ++i) {
        float amax = 0;
        for (int64_t c = 0; c < D; ++c) {
          qf[size_t(c)] = load_elem(q, p.qkv_type, b * p.q.batch + h * p.q.head + i * p.q.token + c);
          amax = std::max(amax, std::abs(qf[size_t(c)]));
        }
        const float qinv = amax > 0 ? 127.f / amax : 0.f;
        const float qs = (amax / 127.f) * scale_log2;
        float qkm = 0;
        for (int64_t c = 0; c < D; ++c) {
          qi[size_t(c)] = quant_i8(qf[size_t(c)] * qinv);
          qkm += qf[size_t(c)] * km[size_t(c)];
        }

        float m = -INFINITY, l = 0;
        std::fill(acc.begin(), acc.end(), 0.f);
        // One online-softmax step over keys [t0, t1).
        auto step = [&](int64_t t0, int64_t t1) {
          float mx = -INFINITY;
          for (int64_t t = t0; t < t1; ++t) {
            int32_t dot = 0;
            const int8_t* kr = &ki[size_t(t * D)];
            for (int64_t c = 0; c < D; ++c) dot += int32_t(qi[size_t(c)]) * int32_t(kr[c]);
            const float cscale = qs * ks[size_t(t / kSageKScaleBlock)];
            s[size_t(t - t0)] = float(dot) * cscale;
            mx = std::max(mx, s[size_t(t - t0)]);
          }
          const float m_new = std::max(m, mx);
          const float alpha = std::exp2(m - m_new);
          m = m_new;
          l *= alpha;
          for (int64_t c = 0; c < D; ++c) acc[size_t(c)] *= alpha;
          for (int64_t t = t0; t < t1; ++t) {
            float pt = std::exp2(s[size_t(t - t0)] - m);
            if (fp8) pt *= 448.f;
            const float pr = fp8 ? f8e4m3_to_f32(f32_to_f8e4m3(pt)) : f16_to_f32(f32_to_f16(pt));
            l += l_rounded ? pr : pt;
            const float* vr = &vq[size_t(t * D)];
            for (int64_t c = 0; c < D; ++c) acc[size_t(c)] += pr * vr[c];
          }
        };
        if (!sparse) {
          for (int64_t t0 = 0; t0 < Lk; t0 += tile) step(t0, std::min(Lk, t0 + tile));
        } else {
          const int32_t* row = sparse->lut + ((b * H + h) * QB + i / sparse->block_q) * sparse->n_sel;
          for (int64_t j = 0; j < sparse->n_sel; ++j) {
            const int64_t k0 = int64_t(row[j]) * sparse->block_k, k1 = std::min(Lk, k0 + sparse->block_k);
            for (int64_t t0 = k0; t0 < k1; t0 += tile) step(t0, std::min(k1, t0 + tile));
          }
        }
        const float inv_l = 1.f / l;
        for (int64_t c = 0; c < D; ++c)
          store_elem(o, p.o_type, b * p.o.batch + h * p.o.head + i * p.o.token + c, acc[size_t(c)] * inv_l * sv[size_t(c)]);
        // FP8: l summed P̃·448, so log2 448 comes off.
        if (lse) lse[(b * H + h) * Lq + i] = (m + std::log2(fp8 ? l / 448.f : l)) * kLn2 + p.scale * qkm;
      }
    }
  });
  detail::attn_clear_error();
  return Status::Ok;
}

}  // namespace td::kernels
