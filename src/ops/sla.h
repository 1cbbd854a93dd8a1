// Tensor-level SLA (sparse-linear attention, `--attention sla|sagesla`) over
// kernels/sla: o = o_s (exact attention over the top-k key blocks of each
// query block) + proj_l(o_l) (global linear attention). Semantics, block sizes
// and tie rule: kernels/sla/sla.h. Host tensors: the fp32 CPU reference
// (inputs of any float dtype are converted to fp32). CUDA tensors (bf16 in and
// out, proj_l f32 or bf16): block_q x block_k = 128 x 64 is `sla`
// (kernels::sla_cuda: GPU block selection, BF16 block-sparse flash kernel,
// linear branch + proj_l); any other block shape is `sagesla`: the same
// selection and linear branch around the SageAttention-style block-sparse
// kernel (ops/sage_attention.h), Unsupported in builds without it.
#pragma once

#include <optional>

#include "core/tensor.h"
#include "kernels/sla/sla.h"

namespace td::ops {

struct SlaOptions {
  double topk = 0.1;          // fraction of key blocks kept per query block, (0, 1]
  int64_t block_q = 128;      // TurboDiffusion `sla` inference: 128 x 64
  int64_t block_k = 64;
  kernels::SlaFeatureMap feature_map = kernels::SlaFeatureMap::Softmax;
  std::optional<float> scale;  // default 1/sqrt(head_dim)
  // CUDA block selection's top-k: bitonic sort or radix select (the same LUT);
  // Auto: the radix select (measured faster), TD_SLA_TOPK=bitonic the sort.
  kernels::SlaTopkAlgo topk_algo = kernels::SlaTopkAlgo::Auto;
  // sagesla on CUDA with proj_l: the linear branch's K/V half (φ(K)ᵀV, Σφ(K),
  // proj_l folded in) on a second stream, forked before block selection and
  // joined before its Q half adds onto o (the same bits). Unset: on (measured
  // faster), TD_SLA_OVERLAP=0 turns it off.
  std::optional<bool> overlap_linear;
  // CUDA block selection's score GEMM: Simple or Tiled (the same scores bit
  // for bit, measured faster); Auto: Tiled, unless TD_SLA_SCORE=simple or
  // TD_SLA_FUSED=0.
  kernels::SlaScoreKernel score_kernel = kernels::SlaScoreKernel::Auto;
  // CUDA linear branch's kernels: Warp or Staged (8-lane φ rows, three K/V
  // stages, o prefetched with Q and stored in 16-byte rows; kernels/sla/sla.h;
  // measured faster); Auto: Staged, unless TD_SLA_LINEAR=warp or TD_SLA_FUSED=0.
  kernels::SlaLinearKernels linear_kernels = kernels::SlaLinearKernels::Auto;
  // sagesla on CUDA: the fused pipeline (the default, measured faster; issue 6):
  // the sage quantize pass also writes the 64-token block sums of Q and of
  // smoothed K from the loads that quantize them, block selection pools from
  // those (Tiled score GEMM, no pooling pass, the sage pass's K mean), then the
  // sage attention kernel on the already-quantized workspace; the linear
  // branch as without it (overlap_linear). Unset: on, unless TD_SLA_FUSED=0.
  // Its LUT can differ from the default's only at fp32 near-ties (other
  // summation orders of the same pooled means). Also picks the Tiled score
  // GEMM and the Staged linear kernels (for `sla` (128 x 64) too) where those are Auto.
  std::optional<bool> fused;
  // With fused and proj_l: the linear branch's K/V half runs first, in line,
  // and also writes the sage K mean and V scales (one read of K and V for both;
  // the sage statistics pass is skipped; no second stream). Unset: on, unless
  // TD_SLA_FUSED=1 (fused without it) or TD_SLA_FUSED=0 (neither).
  std::optional<bool> fused_kv_stats;
};

// q, k, v: [B, L, H, D] (any strides with head_dim contiguous; BLHD or BHLD
// views). proj_weight [D, D] (out, in) and proj_bias [D]: the layer's proj_l,
// both undefined for proj_l = 0. Returns a fresh [B, L, H, D] in out_dtype
// (default q's dtype).
// Whether ops::sla runs CUDA tensors with these options' block sizes in this build.
bool sla_cuda_available(const SlaOptions& options);

Tensor sla(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& proj_weight, const Tensor& proj_bias,
           const SlaOptions& options, std::optional<DType> out_dtype = {});

}  // namespace td::ops
