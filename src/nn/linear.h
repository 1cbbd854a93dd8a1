// A Linear layer: y = x W^T + b, holding its weight on the device it runs on
// (BF16 or F32; F16 works too) and an optional bias (F32, or the dtype the
// layer writes, so cuBLASLt can fuse it). A Linear can also wrap an
// Int8Linear (nn/int8_linear.h, W8A8), so the model's layers (attention, FFN)
// hold either without knowing which.
#pragma once

#include <memory>
#include <optional>

#include "core/tensor.h"
#include "ops/int8_linear.h"

namespace td::nn {

class Int8Linear;

class Linear {
 public:
  Linear() = default;
  // weight: [out_features, in_features]; bias: [out_features] or undefined.
  Linear(Tensor weight, Tensor bias);
  // The W8A8 layer behind the same interface.
  explicit Linear(Int8Linear int8);

  // x: [..., in_features] -> [..., out_features] in out_dtype (default x's dtype).
  // gelu_tanh: then PyTorch's gelu(approximate="tanh"); a floating-point layer
  // applies it to the rounded output (as the model's separate op does), an
  // INT8 one in its GEMM epilogue, before the one rounding.
  Tensor operator()(const Tensor& x, std::optional<DType> out_dtype = {}, bool gelu_tanh = false) const;
  // INT8 layers only: on an activation quantized once for several layers
  // (ops::quantize_activation with int8_act_scheme()).
  Tensor operator()(const ops::QuantizedActivation& x, std::optional<DType> out_dtype = {},
                    bool gelu_tanh = false) const;
  // The activation scheme of an INT8 layer; nothing for a floating-point one.
  std::optional<ops::Int8ActScheme> int8_act_scheme() const;

  bool defined() const { return weight_.defined() || int8_ != nullptr; }
  int64_t in_features() const;
  int64_t out_features() const;
  // The floating-point weight; undefined when the layer is INT8 (int8() is set).
  const Tensor& weight() const { return weight_; }
  const Int8Linear* int8() const { return int8_.get(); }
  const Tensor& bias() const { return bias_; }

 private:
  Tensor weight_, bias_;
  std::shared_ptr<const Int8Linear> int8_;
};

}  // namespace td::nn
