#include "nn/ffn.h"


namespace td::nn {

Tensor FFN::operator()(const Tensor& x, std::optional<DType> out_dtype) const {
  // An INT8 fc1 applies the GELU in its GEMM epilogue (no pass over the
  // [L, F] hidden activation); a floating-point one after its output.
  const Tensor h = fc1(x, std::nullopt, /*gelu_tanh=*/true);
  return fc2(h, out_dtype.value_or(x.dtype()));
}

Tensor FFN::operator()(const ops::QuantizedActivation& x, std::optional<DType> out_dtype) const {
  const Tensor h = fc1(x, std::nullopt, /*gelu_tanh=*/true);
  return fc2(h, out_dtype.value_or(x.x.dtype()));
}

}  // namespace td::nn
