// The SageAttention pre-pass and attention kernel as two calls on one
// workspace, for SageSLA's fused path (kernels/sla, ops::sla with
// SlaOptions::fused / TD_SLA_FUSED=1): block selection runs between them and
// pools from block sums that the quantize pass writes from the very loads that
// quantize Q and K, so Q and K are read from HBM once for both, and the
// selection's smoothing uses the K mean of the sage pass (no pooling pass, no
// K mean pass of its own). Quantization, workspace and kernels are those of
// sage_attention_cuda (sage_attention.h): prepare + attend == sage_attention_cuda
// bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/sage_attention/sage_attention.h"
#include "kernels/status.h"

namespace td::kernels {

#if TURBODIFF_HAVE_CUDA
// Block sums of the quantize pass (fp32, device, may each be null):
//   q_sum64 [B·H, sage_sum64_blocks(len_q), D]:  Σ q over each 64-row block (rows past len_q count 0);
//   k_sum64 [B·H, sage_sum64_blocks(len_kv), D]: Σ (k - km) over each 64-key block (keys past len_kv count 0),
//   km the K mean the pass smooths K with; each sum in a fixed order (deterministic).
// The quantize pass's kernel (the same bits either way; GPU test
// SlaGpu.SageQuantDirectEqualsDefaultBitForBit, bench_sla `*_direct` keys):
//   Default: the first kernel (64 rows per CTA; Q rows loaded one at a time
//     behind the previous row's INT8 store, Vᵀ by single-byte shared stores
//     that hit one bank for all 16 channel chunks of a warp: 16-way conflicts);
//   Direct: every row of the thread loaded first through the read-only path
//     (8 x 16 B in flight per thread), K kept as raw bf16 and re-smoothed for
//     the stores (half the registers: 8 CTAs per SM), Vᵀ without shared memory
//     (each thread owns 8 channels x the 8 keys of one 8-byte run of the
//     permuted order and stores them directly: full 32-byte sectors).
//   Auto: TD_SAGE_QUANT=direct|default, else Direct (the same bytes, measured
//   faster on the H200 on 2026-11-30: 0.149 vs 0.285 ms at 1x12x32760x128).
enum class SageQuantKernel { Auto, Default, Direct };

struct SagePoolSums {
  float* q_sum64 = nullptr;
  float* k_sum64 = nullptr;
  // The K mean and V scales are already in the workspace (written through
  // sage_stats_slots, e.g. by the SLA linear branch's K/V pass): skip the
  // statistics pass (which reads K and V once more).
  bool stats_given = false;
  SageQuantKernel quant_kernel = SageQuantKernel::Auto;
};

// Where the workspace keeps the statistics the quantize pass reads ([B·H, D]
// fp32 each): km (K mean), vscale (amax|V| / 448), vinv (448 / amax, 0 for an
// all-zero channel). For a caller that computes them itself (stats_given).
struct SageStatsSlots {
  float* km = nullptr;
  float* vscale = nullptr;
  float* vinv = nullptr;
};
SageStatsSlots sage_stats_slots(const AttnProblem& p, SageBackend backend, void* workspace);
// 64-token blocks per (b, h) in those arrays: the sage padding (len rounded up to 128) / 64.
int64_t sage_sum64_blocks(int64_t len);

// Runs the K/V statistics, the K mean / V scales and the quantize pass (with the
// block sums) into `workspace` (sage_attention_workspace_size bytes for the same
// backend). `backend` must be resolved (Sm90 or Portable, as
// sage_attention_supports accepted for `sparse`); `sparse` as for the attention
// (its LUT may still be unwritten: only the block sizes are read here).
Status sage_prepare_cuda(const AttnProblem& p, const void* q, const void* k, const void* v, const SageSparse* sparse,
                         SageBackend backend, const SagePoolSums& sums, void* workspace, size_t workspace_bytes,
                         void* stream);
// Then the attention kernel on the prepared workspace (the LUT written by now).
Status sage_attend_cuda(const AttnProblem& p, void* o, float* lse, const SageSparse* sparse, SageBackend backend,
                        void* workspace, size_t workspace_bytes, void* stream);
#endif

}  // namespace td::kernels
