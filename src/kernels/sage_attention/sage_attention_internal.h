// What the sage_attention CUDA files share (not part of the kernel interface):
// the workspace layout, the parameters of the pre-pass and attention kernels,
// and the sm_90a entry points the dispatcher calls.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/sage_attention/sage_attention.h"

namespace td::kernels::sage {

// Byte offsets into the workspace (each 256-byte aligned) and padded lengths.
struct Layout {
  int64_t lq_pad = 0, lk_pad = 0, n_chunks = 0;  // lengths padded to 128; stats chunks of K/V
  size_t partial = 0, km = 0, vscale = 0, vinv = 0, qscale = 0, qkm = 0, kscale = 0, qi8 = 0, ki8 = 0, v = 0;
  size_t total = 0;
};
// fp8_v: V as e4m3 [B, H, D, Lk_pad] (sm_90a), else FP16 [B, H, Lk_pad, D].
Layout layout_for(const AttnProblem& p, bool fp8_v);

struct PrepParams {
  const __nv_bfloat16* q = nullptr;
  const __nv_bfloat16* k = nullptr;
  const __nv_bfloat16* v = nullptr;
  AttnStrides qs, ks, vs;
  int heads = 0, len_q = 0, len_kv = 0, lq_pad = 0, lk_pad = 0, n_chunks = 0;
  float scale = 0, scale_log2 = 0;
  float* partial = nullptr;  // [B·H, n_chunks, 2, D]: Σ K, max|V|
  float* km = nullptr;       // [B·H, D]
  float* vscale = nullptr;   // [B·H, D] amax/448
  float* vinv = nullptr;     // [B·H, D] 448/amax (0 for an all-zero channel)
  float* qscale = nullptr;   // [B·H, lq_pad] sq·scale·log2 e
  float* qkm = nullptr;      // [B·H, lq_pad] scale·(q·km)
  float* kscale = nullptr;   // [B·H, lk_pad/64]
  uint8_t* qi8 = nullptr;    // [B·H, lq_pad, D]
  uint8_t* ki8 = nullptr;    // [B·H, lk_pad, D]
  __half* v16 = nullptr;     // [B·H, lk_pad, D]   (portable)
  uint8_t* v8 = nullptr;     // [B·H, D, lk_pad]   (sm_90a), same bytes as v16
  int v_fp8 = 0;             // write v8 (e4m3 Vᵀ, keys permuted per 32) instead of v16
};

struct AttnParams {
  const uint8_t* qi8 = nullptr;
  const uint8_t* ki8 = nullptr;
  const __half* v16 = nullptr;
  const uint8_t* v8 = nullptr;
  const float* qscale = nullptr;
  const float* qkm = nullptr;
  const float* kscale = nullptr;
  const float* vscale = nullptr;
  __nv_bfloat16* o = nullptr;
  float* lse = nullptr;
  AttnStrides os;
  int heads = 0, len_q = 0, len_kv = 0, lq_pad = 0, lk_pad = 0;
  const int32_t* lut = nullptr;  // null: dense
  int n_sel = 0, n_qblocks = 0;
};

PrepParams prep_params(const AttnProblem& p, const Layout& l, const void* q, const void* k, const void* v,
                       void* workspace);
AttnParams attn_params(const AttnProblem& p, const PrepParams& pp, void* o, float* lse, const SageSparse* sp);
Status run_stats(const PrepParams& pp, const AttnProblem& p, cudaStream_t stream);

// The quantize launch (after run_stats): Q, K, and V as v16 or v8 per pp.v_fp8.
Status run_quant(const PrepParams& pp, const AttnProblem& p, cudaStream_t stream);

// Position of key k (0..31) of a 32-key group in the sm_90a Vᵀ layout: the
// S accumulator of wgmma holds keys {2t, 2t+1, 2t+8, 2t+9} (+16) where the
// P̃·V A fragment expects k = 4t .. 4t+3 (+16).
__host__ __device__ inline int v_fp8_position(int k) {
  const int half = k / 16, r = k % 16;
  return r < 8 ? half * 16 + 4 * (r / 2) + r % 2 : half * 16 + 4 * ((r - 8) / 2) + 2 + (r - 8) % 2;
}

// sm_90a (sage_attention_sm90.cu when built for 90a).
bool sm90_available();
Status sm90_supports(const AttnProblem& p, const SageSparse* sp);
Status sm90_attention(const AttnParams& ap, const AttnProblem& p, const SageSparse* sp, cudaStream_t stream);

}  // namespace td::kernels::sage
