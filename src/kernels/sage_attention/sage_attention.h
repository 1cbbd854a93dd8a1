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

#if TURBODIFF_HAVE_CUDA
// Ok if `backend` (Auto: the best one for the current device) takes the
// problem (BF16 Q/K/V/O, head_dim 64/128, the block sizes in `sparse`),
// Unsupported with the reason in attention_last_error() otherwise.
Status sage_attention_supports(const AttnProblem& p, const SageSparse* sparse, SageBackend backend);

// Bytes of device workspace the call needs (quantized Q, K, V and scales).
size_t sage_attention_workspace_size(const AttnProblem& p, SageBackend backend);

// Quantize Q/K/V into `workspace` and run the attention. Device pointers;
// `lse` may be null; `sparse` null for dense. `stream` is a cudaStream_t.
Status sage_attention_cuda(const AttnProblem& p, const void* q, const void* k, const void* v, void* o, float* lse,
                           const SageSparse* sparse, SageBackend backend, void* workspace, size_t workspace_bytes,
                           void* stream);
#endif

}  // namespace td::kernels
