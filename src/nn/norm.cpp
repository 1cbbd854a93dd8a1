#include "nn/norm.h"

#include "ops/norm.h"

namespace td::nn {

Tensor RMSNorm::operator()(const Tensor& x, std::optional<DType> out_dtype) const {
  return ops::rms_norm(x, weight, eps, out_dtype);
}

Tensor LayerNorm::operator()(const Tensor& x, std::optional<DType> out_dtype) const {
  return ops::layer_norm(x, weight, bias, eps, out_dtype);
}

}  // namespace td::nn
