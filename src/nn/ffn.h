// Wan's feed-forward: Linear(D -> F) -> GELU(tanh) -> Linear(F -> D). With an
// INT8 fc1 the GELU runs in its GEMM epilogue, on the fp32 result before its
// one rounding (the floating-point path rounds fc1's output first, as
// diffusers does).
#pragma once

#include <optional>

#include "nn/linear.h"

namespace td::nn {

struct FFN {
  Linear fc1, fc2;
  // x: [..., D] -> [..., D] in out_dtype (default x's dtype); the hidden
  // activation is kept in x's dtype, as the model computes it.
  Tensor operator()(const Tensor& x, std::optional<DType> out_dtype = {}) const;
  // On x already quantized for an INT8 fc1 (input_act_scheme()); out_dtype
  // defaults to x.x's dtype.
  Tensor operator()(const ops::QuantizedActivation& x, std::optional<DType> out_dtype = {}) const;
  // The activation scheme fc1 reads x in (INT8), or nothing.
  std::optional<ops::Int8ActScheme> input_act_scheme() const { return fc1.int8_act_scheme(); }
};

}  // namespace td::nn
