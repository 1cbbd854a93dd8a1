// Tensor-level SLA (sparse-linear attention, `--attention sla|sagesla`) over
// kernels/sla: o = o_s (exact attention over the top-k key blocks of each
// query block) + proj_l(o_l) (global linear attention). Semantics, block sizes
// and tie rule: kernels/sla/sla.h. Host tensors only for now: the fp32 CPU
// reference (inputs of any float dtype are converted to fp32). CUDA tensors:
// Unsupported (issue 6).
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
};

// q, k, v: [B, L, H, D] (any strides with head_dim contiguous; BLHD or BHLD
// views). proj_weight [D, D] (out, in) and proj_bias [D]: the layer's proj_l,
// both undefined for proj_l = 0. Returns a fresh [B, L, H, D] in out_dtype
// (default q's dtype).
Tensor sla(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& proj_weight, const Tensor& proj_bias,
           const SlaOptions& options, std::optional<DType> out_dtype = {});

}  // namespace td::ops
