// Norm layers as Wan uses them: RMSNorm with a learned weight (q/k norms over
// the full model dim) and LayerNorm with or without affine parameters. Weights
// are f32 on the device the layer runs on; the output dtype is the caller's.
// The fused forms (modulation, gated residual) are called directly from
// ops/norm.h where the block structure allows.
#pragma once

#include <optional>

#include "core/tensor.h"

namespace td::nn {

struct RMSNorm {
  Tensor weight;  // f32 [dim] or undefined (no scale)
  float eps = 1e-6f;
  Tensor operator()(const Tensor& x, std::optional<DType> out_dtype = {}) const;
};

struct LayerNorm {
  Tensor weight, bias;  // f32 [dim] each, or undefined (elementwise_affine=False)
  float eps = 1e-6f;
  Tensor operator()(const Tensor& x, std::optional<DType> out_dtype = {}) const;
};

}  // namespace td::nn
