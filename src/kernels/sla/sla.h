// SLA (sparse-linear attention) as TurboDiffusion vendors it (thu-ml/SLA main,
// reference: shared/reference/attention-kernels.md §3.2, §4 and
// turbodiffusion.md §2). Self-attention only: Q, K, V share len tokens.
//
//   1. Block selection. K is smoothed by its mean over tokens (per batch, head);
//      Q and smoothed K are mean-pooled over blocks of block_q / block_k tokens
//      (a last partial block is the mean of the tokens it has). Pooled scores
//      pool(Q)·pool(K)ᵀ, unscaled and without softmax (only the ranking
//      matters). Each query block keeps the top n_sel key blocks,
//      n_sel = clamp(floor(topk · KB), 1, KB) with KB = ceil(len / block_k).
//      TurboDiffusion's int() would give 0 blocks for topk · KB < 1 (and the
//      sparse branch then divides by zero); we keep at least one, as
//      TurboT2AV's adapter does.
//      (The partial-block mean divides by the tokens present, as SLA's
//      compress_kernel does with nx = min(BLOCK_L, L - start).)
//      Ties: equal pooled scores rank the lower key-block index first. The LUT
//      lists a query block's selected key blocks by descending score (SLA calls
//      torch.topk(sorted=False), so its order is unspecified; the sparse
//      result does not depend on it), and the map is 1 where a block is selected.
//   2. Sparse branch: exact softmax attention (scale, max subtracted) of each
//      query over the tokens of its block's selected key blocks; LSE = ln Σ exp.
//   3. Linear branch over ALL keys (SLA main computes it globally, selected
//      blocks included; the paper's "marginal blocks only" is the SLA-1 branch):
//      φ = softmax over head_dim (or elu+1, relu), the same φ for Q and K,
//      o_l = φ(Q)(φ(K)ᵀV) / (φ(Q)·Σφ(K) + 1e-5).
//   4. o = o_s + proj_l(o_l), proj_l a Linear(head_dim, head_dim): W [out, in], b [out].
//
// TurboDiffusion's block sizes: `sla` inference 128 x 64 (q x k), `sagesla`
// 64 x 128 on sm90 and 128 x 64 elsewhere, SLA training 64 x 64.
//
// This is the fp32 CPU reference (the kernel style: raw pointers, a Status;
// reason in sla_last_error()). Everything is fp32 with fp64 row sums;
// multi-threaded over (batch, head) with td::parallel_for. Inputs and outputs
// are fp32 with AttnStrides (channels contiguous); block map / LUT / LSE are
// contiguous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/attention/attention.h"
#include "kernels/status.h"

namespace td::kernels {

enum class SlaFeatureMap { Softmax, Elu, Relu };

// How the CUDA block selection picks each query block's top n_sel key blocks
// (the result is the same for both: the same ranking and tie rule, the same LUT
// order). Bitonic: a full bitonic sort of every row (the default). Radix: a
// radix select of the n_sel-th best (score, index) key (8-bit digits, shared
// histograms), then only the n_sel selected keys ranked by counting: a warp
// per row (keys in registers) where a row has <= 1024 key blocks and n_sel <=
// 640, else a CTA per row (RadixCta: always the CTA per row); rows with n_sel
// > 1024 fall back to the bitonic sort. Auto: Bitonic when the environment
// variable TD_SLA_TOPK is "bitonic", RadixCta when it is "radix_cta", else
// Radix (measured faster on the H200).
enum class SlaTopkAlgo { Auto, Bitonic, Radix, RadixCta };

// The CUDA block selection's pooled-score GEMM (both give the same fp32 scores
// bit for bit: each score is one fmaf chain over the channels in order, on the
// same pooled values; so the same LUT). Simple: 16 query x 64 key blocks per
// CTA, 4 outputs per thread (the earlier default; 75 us at 1x12x32760 on the H200,
// 63 GB/s, issue-bound on shared loads). Tiled: 64 x 64 blocks per CTA, a 4 x 4
// register block per thread, 32-channel slices staged transposed in shared
// memory with the next slice prefetched into registers. Auto: Tiled (measured
// faster), Simple when the environment has TD_SLA_SCORE=simple or TD_SLA_FUSED=0.
enum class SlaScoreKernel { Auto, Simple, Tiled };

// The CUDA linear branch's kernels (both halves; the same for sla_linear_add_cuda
// and the prepare / apply calls). Warp (the earlier default; on the H200 at 1x12x32760
// prepare 0.27 ms and apply 0.27 ms, ~2.7x over their bytes): φ rows by a whole
// warp each (10 dependent shuffles, the warp's rows one after the other), two
// K/V stages in kv_partial, o read-modified-written 4 bytes at a time from the
// mma fragments after everything else in linear_apply. Staged: φ rows by 8-lane
// groups (4 rows of a warp at once, 6 shuffles); kv_partial with three K/V
// stages; linear_apply fetches the o tile by cp.async together with Q (its
// latency behind φ and the mma), forms o + acc/den + bias in shared memory and
// stores 16-byte rows. Same formulas; φ's row sums in another order, so the bits
// may differ from Warp's in the last place. Auto: Staged (measured faster),
// Warp when the environment has TD_SLA_LINEAR=warp or TD_SLA_FUSED=0.
// StagedPersist: Staged's kv_partial, kv_project by 16 feature rows per CTA
// (proj_l read once per 16 rows, 8 independent partial sums per thread), the Q
// half by a persistent kernel (one CTA per SM walking a range of 128-row tiles,
// M loaded once per head, Q and o of the next tile in flight while one
// computes); the same bits as Staged in both halves.
// TD_SLA_LINEAR=persist picks it under Auto (and in ops::sla's fused path).
enum class SlaLinearKernels { Auto, Warp, Staged, StagedPersist };

struct SlaProblem {
  int64_t batch = 0, heads = 0, len = 0, head_dim = 0;
  AttnStrides q, k, v, o;
  float scale = 0;              // softmax scale of the sparse branch, usually 1/sqrt(head_dim)
  int64_t block_q = 128, block_k = 64;
  double topk = 0.1;            // fraction of key blocks kept, in (0, 1]
  SlaFeatureMap feature_map = SlaFeatureMap::Softmax;
  SlaTopkAlgo topk_algo = SlaTopkAlgo::Auto;  // CUDA block selection only
  SlaScoreKernel score_kernel = SlaScoreKernel::Auto;  // CUDA block selection only
  SlaLinearKernels linear_kernels = SlaLinearKernels::Auto;  // CUDA linear branch only

  int64_t query_blocks() const { return (len + block_q - 1) / block_q; }
  int64_t key_blocks() const { return (len + block_k - 1) / block_k; }
};

// Key blocks each query block keeps: clamp(floor(topk * key_blocks), 1, key_blocks).
int64_t sla_selected_blocks(double topk, int64_t key_blocks);

// Positive sizes, block sizes, strides, a finite positive scale, topk in (0, 1].
Status sla_check(const SlaProblem& p);
const char* sla_last_error();

// Block selection. block_map: uint8 [B, H, QB, KB] (0/1), may be null;
// lut: int32 [B, H, QB, n_sel] (key-block indices by descending score), may be null.
Status sla_block_map_cpu(const SlaProblem& p, const float* q, const float* k, uint8_t* block_map, int32_t* lut);

// Sparse branch with the given LUT (n_sel entries per query block, each a key
// block index in [0, KB)). Writes o (p.o strides) and, if non-null, lse
// [B, H, len] (natural log).
Status sla_sparse_cpu(const SlaProblem& p, const float* q, const float* k, const float* v, const int32_t* lut,
                      int64_t n_sel, float* o, float* lse);

// Linear branch before proj_l: o_l into o (p.o strides).
Status sla_linear_cpu(const SlaProblem& p, const float* q, const float* k, const float* v, float* o);

// The whole layer: o = o_s + proj_l(o_l). proj_weight [D, D] (out, in) and
// proj_bias [D] fp32; both null means proj_l = 0 (an untrained SLA layer,
// whose proj_l TurboDiffusion zero-initialises). block_map / lut / lse may be null.
Status sla_cpu(const SlaProblem& p, const float* q, const float* k, const float* v, const float* proj_weight,
               const float* proj_bias, float* o, uint8_t* block_map = nullptr, int32_t* lut = nullptr,
               float* lse = nullptr);

namespace detail {
// Records the reason for sla_last_error(); returns s.
Status sla_fail(Status s, const std::string& message);
}  // namespace detail

#if TURBODIFF_HAVE_CUDA
// ---- CUDA (sm_80+). Q/K/V/O are BF16 device tensors with p's strides
// (multiples of 8 elements, 16-byte aligned); everything else is contiguous.
// `stream` is a cudaStream_t; workspace comes from the caller. Reasons for a
// non-Ok status in sla_last_error(). ----

// Block selection (sla_block_select.cu): K block sums and Q block means
// (fp32), the K mean from the block sums in a fixed order, pooled scores of
// each query block against every key block (fp32), a bitonic sort of
// (score descending, index ascending) keys: the reference's ranking and tie rule.
// Any head_dim <= 256; key blocks <= 16384. lut [B, H, QB, n_sel] int32 (by
// descending score) and block_map uint8 [B, H, QB, KB] may each be null.
size_t sla_block_select_workspace_size(const SlaProblem& p);
Status sla_block_select_cuda(const SlaProblem& p, const void* q, const void* k, uint8_t* block_map, int32_t* lut,
                             void* workspace, size_t workspace_bytes, void* stream);

// Block selection from block sums another pass already made (SageSLA's fused
// path, SlaOptions::fused: the sage quantization pass writes them from the
// loads that quantize Q and K, kernels/sage_attention/sage_prepass.h, so Q
// and K are not read again for pooling and no K mean pass runs):
//   q_sum64 [B·H, q_sub_stride, D]: Σ q over each 64-token block (rows past len
//           count 0), k_sum64 [B·H, k_sub_stride, D]: Σ (k - km) over each
//           64-key block, km the K mean of the sage pass (already smoothed).
// Pooled Q = (Σ of the block's block_q/64 sums) / tokens, pooled K likewise;
// then the Tiled score GEMM and the top-k of sla_block_select_cuda (p.topk_algo).
// block_q, block_k multiples of 64; q_sub_stride >= ceil(len/64) rounded up to
// whole query blocks (k likewise). Same workspace size as sla_block_select_cuda.
Status sla_block_select_from_sums_cuda(const SlaProblem& p, const float* q_sum64, int64_t q_sub_stride,
                                       const float* k_sum64, int64_t k_sub_stride, uint8_t* block_map, int32_t* lut,
                                       void* workspace, size_t workspace_bytes, void* stream);

// Sparse branch in BF16: attention_flash_block_sparse_cuda (128 x 64 blocks
// only, head_dim 64/128). lse [B, H, len] fp32 may be null.
Status sla_sparse_cuda(const SlaProblem& p, const void* q, const void* k, const void* v, const int32_t* lut,
                       int64_t n_sel, void* o, float* lse, void* stream);

// Linear branch plus proj_l added onto o (sla_linear.cu; head_dim 64/128):
//   o += proj_l(o_l) = (φ(Q)·M) / (φ(Q)·Σφ(K) + 1e-5) + bias,  M = (φ(K)ᵀV)·Wᵀ.
// φ(K)ᵀV and Σφ(K) are reduced over the tokens in fixed chunks (mma.sync BF16
// products, fp32 partial sums), then summed over the chunks in a fixed order:
// no atomics, the same input gives the same bits. proj weight [D, D] (out, in)
// and bias [D] on the device, fp32 or bf16 (proj_type).
size_t sla_linear_workspace_size(const SlaProblem& p);
// The same in two halves (prepare then apply on one workspace == sla_linear_add_cuda,
// bit for bit), so the K/V half can run on a second stream while the sparse
// branch writes o: prepare reads K, V and proj_l only (φ(K)ᵀV, Σφ(K), M and
// the bias into the workspace); apply reads Q and the workspace and adds onto o.
Status sla_linear_prepare_cuda(const SlaProblem& p, const void* k, const void* v, const void* proj_weight,
                               const void* proj_bias, ElemType proj_type, void* workspace, size_t workspace_bytes,
                               void* stream);
Status sla_linear_apply_cuda(const SlaProblem& p, const void* q, void* o, void* workspace, size_t workspace_bytes,
                             void* stream);
// The SageAttention statistics the K/V half can make in the same pass over K
// and V (SageSLA's fused path with proj_l: the sage pre-pass then skips its own
// K/V statistics pass, sage_prepass.h): [B·H, D] fp32 each, the sage
// workspace's slots (sage_stats_slots): km = mean of K over the tokens,
// vscale = amax|V| / 448, vinv = 448 / amax (0 for an all-zero channel).
struct SlaSageStats {
  float* km = nullptr;
  float* vscale = nullptr;
  float* vinv = nullptr;
  // SageSLA's fused chain: sla_linear_prepare_stats_cuda runs the K/V pass and
  // the statistics only; the projection (M, Σφ(K), the bias) runs later, in
  // sla_linear_project_apply_cuda, after the block-sparse kernel (whose last
  // wave leaves SMs idle for it).
  bool defer_projection = false;
};
// sla_linear_prepare_cuda with the Staged kernels (StagedPersist's kv_project
// when p.linear_kernels or TD_SLA_LINEAR asks for it) that also writes `stats`: Σ K and max |V| per chunk from the K/V tiles
// already in shared memory, reduced in chunk order by kv_project. The same M,
// Σφ(K) and bias as the Staged prepare, bit for bit.
Status sla_linear_prepare_stats_cuda(const SlaProblem& p, const void* k, const void* v, const void* proj_weight,
                                     const void* proj_bias, ElemType proj_type, const SlaSageStats& stats,
                                     void* workspace, size_t workspace_bytes, void* stream);
// The linear branch's rest after sla_linear_prepare_stats_cuda with
// stats.defer_projection, on the stream of SageSLA's fused chain right after
// the block-sparse kernel that wrote o: the projection (kv_project's M rows,
// Σφ(K), the bias), then o += proj_l(o_l) as sla_linear_apply_cuda. Both are
// launched as programmatic dependents (pdl.cuh): the projection runs in the
// sparse kernel's tail, the apply loads Q before its wait, so Q must not be
// written by the kernels of the chain. The same bits as prepare (without the
// deferral) + apply.
Status sla_linear_project_apply_cuda(const SlaProblem& p, const void* q, void* o, const void* proj_weight,
                                     const void* proj_bias, ElemType proj_type, void* workspace,
                                     size_t workspace_bytes, void* stream);
// `waiting` waits for the work queued on `source` so far (cudaEvent_t `event`
// recorded on source, then cudaStreamWaitEvent): the fork and the join of the
// linear branch's K/V half on a second stream (sla_layer.cu).
Status sla_stream_wait(void* waiting, void* source, void* event);
Status sla_linear_add_cuda(const SlaProblem& p, const void* q, const void* k, const void* v, const void* proj_weight,
                           const void* proj_bias, ElemType proj_type, void* o, void* workspace,
                           size_t workspace_bytes, void* stream);

// The whole `sla` layer: selection (p.block_q x p.block_k must be 128 x 64),
// BF16 sparse branch into o, then the linear branch when proj_weight is given
// (null weight and bias: proj_l = 0, the linear branch is skipped).
// block_map, lut and lse may be null.
size_t sla_workspace_size(const SlaProblem& p);
Status sla_cuda(const SlaProblem& p, const void* q, const void* k, const void* v, const void* proj_weight,
                const void* proj_bias, ElemType proj_type, void* o, uint8_t* block_map, int32_t* lut, float* lse,
                void* workspace, size_t workspace_bytes, void* stream);
#endif

}  // namespace td::kernels
