#include "nn/ffn.h"

#include "ops/elementwise.h"

namespace td::nn {

Tensor FFN::operator()(const Tensor& x, std::optional<DType> out_dtype) const {
  const Tensor h = ops::gelu_tanh(fc1(x));
  return fc2(h, out_dtype.value_or(x.dtype()));
}

}  // namespace td::nn
