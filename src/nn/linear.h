// A Linear layer: y = x W^T + b, holding its weight on the device it runs on
// (BF16 or F32; F16 works too) and an optional bias (F32, or the dtype the
// layer writes, so cuBLASLt can fuse it). A Linear can also wrap an
// Int8Linear (nn/int8_linear.h, W8A8), so the model's layers (attention, FFN)
// hold either without knowing which.
#pragma once

#include <memory>
#include <optional>

#include "core/tensor.h"

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
  Tensor operator()(const Tensor& x, std::optional<DType> out_dtype = {}) const;

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
