// A W8A8 INT8 Linear layer (TurboDiffusion's Int8Linear, and the post-scale
// variant): the weight is held as INT8 codes with fp32 scales on the device
// it runs on, the activation is quantized on the fly, the bias (f32) and an
// optional GELU-tanh are fused into the GEMM epilogue (ops::int8_linear).
//
// Variants (what the weight and the activation scales are):
//   Token128   weight in TurboDiffusion's 128x128 blocks, activation in 1x128
//              token groups (block-scaled GEMM). The default: the most accurate
//              (docs/benchmarks.md, INT8 section, for the numbers and the choice).
//   Block128   weight and activation in 128x128 blocks: exact TurboDiffusion parity.
//   PostScale  weight per output channel, activation per token, one INT32
//              accumulation over all of K (the TurboT2AV kernel): the fastest
//              on the H200 but less accurate on outlier activations.
#pragma once

#include <optional>
#include <string_view>

#include "core/tensor.h"
#include "ops/int8_linear.h"

namespace td::nn {

enum class Int8LinearVariant { Token128, Block128, PostScale };
inline constexpr Int8LinearVariant kDefaultInt8LinearVariant = Int8LinearVariant::Token128;

const char* int8_linear_variant_name(Int8LinearVariant v);  // "token128", "block128", "post-scale"
std::optional<Int8LinearVariant> parse_int8_linear_variant(std::string_view s);
ops::Int8WeightScheme int8_weight_scheme(Int8LinearVariant v);
ops::Int8ActScheme int8_act_scheme(Int8LinearVariant v);

// Quantizes a floating-point weight [N, K] (any device; quantized on the host)
// into the variant's weight format: 128x128 blocks (TurboDiffusion's quantizer,
// quant_block128.h) or one scale per output channel (quant_per_row.h).
// Returns host tensors.
ops::Int8LinearWeight quantize_linear_weight(const Tensor& weight, Int8LinearVariant v);

// Takes a TurboDiffusion checkpoint's `*.int8_weight` (i8 [N, K]) and `*.scale`
// (f32 [ceil(N/128), ceil(K/128)]) as they are for the block-scaled variants;
// for PostScale it dequantizes them (w = q * scale) and re-quantizes per output
// channel (a second rounding: tests/cpu/test_int8_linear.cpp measures its cost).
// `what` names the tensors in errors. Returns host tensors.
ops::Int8LinearWeight int8_weight_from_turbodiffusion(const Tensor& int8_weight, const Tensor& scale,
                                                      Int8LinearVariant v, const std::string& what);

class Int8Linear {
 public:
  Int8Linear() = default;
  // weight: in the variant's scheme; bias: [N] (any float dtype; kept as f32)
  // or undefined. Both are moved to `device`.
  Int8Linear(ops::Int8LinearWeight weight, const Tensor& bias, Int8LinearVariant v, Device device);
  // From a floating-point weight, quantized here.
  static Int8Linear from_float(const Tensor& weight, const Tensor& bias, Int8LinearVariant v, Device device);

  // x: [..., in_features] -> [..., out_features] in out_dtype (default x's dtype).
  Tensor operator()(const Tensor& x, std::optional<DType> out_dtype = {}, bool gelu_tanh = false) const;
  // On an activation quantized once (ops::quantize_activation with
  // int8_act_scheme(variant())) for several layers that read the same x.
  Tensor operator()(const ops::QuantizedActivation& x, std::optional<DType> out_dtype = {},
                    bool gelu_tanh = false) const;

  bool defined() const { return weight_.q.defined(); }
  int64_t in_features() const { return weight_.in_features(); }
  int64_t out_features() const { return weight_.out_features(); }
  Int8LinearVariant variant() const { return variant_; }
  const ops::Int8LinearWeight& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  ops::Int8LinearWeight weight_;
  Tensor bias_;  // f32 [N] or undefined
  Int8LinearVariant variant_ = kDefaultInt8LinearVariant;
};

}  // namespace td::nn
