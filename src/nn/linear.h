// A Linear layer: y = x W^T + b, holding its weight on the device it runs on
// (BF16 or F32; F16 works too) and an optional bias (F32, or the dtype the
// layer writes, so cuBLASLt can fuse it). The INT8 (W8A8) variant will sit
// beside it.
#pragma once

#include <optional>

#include "core/tensor.h"

namespace td::nn {

class Linear {
 public:
  Linear() = default;
  // weight: [out_features, in_features]; bias: [out_features] or undefined.
  Linear(Tensor weight, Tensor bias);

  // x: [..., in_features] -> [..., out_features] in out_dtype (default x's dtype).
  Tensor operator()(const Tensor& x, std::optional<DType> out_dtype = {}) const;

  bool defined() const { return weight_.defined(); }
  int64_t in_features() const { return weight_.size(1); }
  int64_t out_features() const { return weight_.size(0); }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  Tensor weight_, bias_;
};

}  // namespace td::nn
