// SageAttention2-style quantized attention (`sage`, and the sparse branch of
// `sagesla`). Facts: shared/reference/attention-kernels.md §1-2.
//
//   K is smoothed by its mean over tokens (per batch, head); Q and smoothed K
//   are quantized to INT8 (granularity matched to the MMA fragment layout),
//   S = Q·Kᵀ in INT32 then dequantized, online softmax in the exp2 domain,
//   P in FP8-e4m3 (0..448) on sm_90a (FP16 on the portable kernel), V in FP8
//   with per-channel scales, P·V accumulated in two fp32 levels, scales folded
//   into the epilogue. The LSE (natural log, [B, H, Lq] contiguous) is
//   corrected for the K smoothing, so it equals exact attention's LSE.
//
// Block-sparse mode (SageSLA): `lut` lists, for each query block of
// `block_q` tokens, the `n_sel` key blocks of `block_k` tokens it attends to
// (int32 [B, H, QB, n_sel], each index in [0, KB), distinct, any order; the
// format kernels/sla/sla.h's block selection writes). A last partial key block
// only covers the tokens that exist. Null `sparse`: dense attention.
//
// Quantization passes (K mean, INT8 Q/K, FP8 V and their scales) run inside
// sage_attention_cuda on the given workspace: every timing includes them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/status.h"

namespace td::kernels {

struct SageSparse {
  const int32_t* lut = nullptr;  // device pointer, [B, H, QB, n_sel]
  int64_t n_sel = 0;
  int64_t block_q = 64, block_k = 128;  // SageSLA on sm_90a: 64 x 128; portable: 128 x 64
};

enum class SageBackend { Auto, Sm90, Portable };

// The quantization every backend and the CPU reference share (so that the
// kernels can be checked tightly against sage_attention_cpu):
//   km[b, h, c]  = mean of K[b, h, :, c] over the len_kv tokens (fp32)
//   Q  per token:        sq = amax|q| / 127, qi = round_half_away(q · (127 / amax)) in [-127, 127]
//   K  per 64-key block: k' = k - km, sk = amax|k'| / 127 over the block, ki likewise
//   S (log2 domain)      = float(Σ qi·ki) · (sq · scale · log2 e) · sk    (exact INT32 dot)
//   V  per channel:      sv = amax|v| / 448 over the tokens, vq = v · (448 / amax)
//                        rounded to FP16 (portable) or FP8-e4m3 (sm_90a)
//   Online softmax over key tiles (64 keys portable, 128 sm_90a) in the order
//   the kernel visits them (LUT order when sparse): m = running max of S,
//   P̃ = exp2(S - m) rounded to FP16 (portable) or P̃·448 to e4m3 (sm_90a),
//   l = Σ P̃ unrounded (fp32), O = (Σ P̃·vq) · sv / l; except sm_90a sparse
//   calls without an LSE: l = Σ of the e4m3-rounded P̃ (the kernel forms it on
//   the tensor cores as P̃·1, so numerator and denominator use the same weights),
//   LSE = (m + log2 l)·ln 2 + scale·(q·km)   (the K-smoothing correction).
// An all-zero Q row or K block gets scale 0 (its INT8 values are 0).
constexpr int64_t kSageKScaleBlock = 64;  // keys per K scale

// fp32 CPU reference of the quantized algorithm above, for the backend's
// formats (Auto and Portable: FP16 P/V over 64-key tiles; Sm90: e4m3 P/V over
// 128-key tiles). F32/F16/BF16 in and out, any head_dim, host pointers; `lse`
// may be null; `sparse` null for dense, else its `lut` is a HOST pointer and
// every index must be in [0, KB) (InvalidArgument otherwise). Multi-threaded
// over (batch, head) with td::parallel_for. For exact attention use
// attention_cpu; this one shows what the quantization costs.
Status sage_attention_cpu(const AttnProblem& p, const void* q, const void* k, const void* v, void* o, float* lse,
                          const SageSparse* sparse, SageBackend backend);

// Argument checks shared by the CPU reference and the kernels: attention_check,
// then the sparse block sizes (64 or 128 each, n_sel in [1, KB]).
Status sage_sparse_check(const AttnProblem& p, const SageSparse* sparse);

#if TURBODIFF_HAVE_CUDA
// Backends: Sm90 (built for 90a, Hopper GPU): dense, and sparse with 64x128
// blocks. Portable (sm_80+): dense, and sparse with block_q, block_k in
// {64, 128}. Auto: Sm90 where it takes the problem, else Portable.
//
// Ok if `backend` (Auto: the best one for the current device) takes the
// problem (BF16 Q/K/V/O, head_dim 64/128, the block sizes in `sparse`),
// Unsupported with the reason in attention_last_error() otherwise.
Status sage_attention_supports(const AttnProblem& p, const SageSparse* sparse, SageBackend backend);

// Bytes of device workspace the call needs (quantized Q, K, V and scales);
// for Auto, enough for whichever backend the call resolves to.
size_t sage_attention_workspace_size(const AttnProblem& p, SageBackend backend);

// Quantize Q/K/V into `workspace` and run the attention. Device pointers;
// `lse` may be null; `sparse` null for dense. `stream` is a cudaStream_t.
Status sage_attention_cuda(const AttnProblem& p, const void* q, const void* k, const void* v, void* o, float* lse,
                           const SageSparse* sparse, SageBackend backend, void* workspace, size_t workspace_bytes,
                           void* stream);
#endif

}  // namespace td::kernels
