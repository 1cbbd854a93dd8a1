#include "nn/int8_linear.h"

#include "kernels/quant/quant_block128.h"
#include "kernels/quant/quant_common.h"
#include "kernels/quant/quant_per_row.h"
#include "ops/common.h"

namespace td::nn {
namespace {

Tensor host_contiguous(const Tensor& t) {
  const Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  return h.contiguous();
}

bool float_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

}  // namespace

const char* int8_linear_variant_name(Int8LinearVariant v) {
  switch (v) {
    case Int8LinearVariant::Token128: return "token128";
    case Int8LinearVariant::Block128: return "block128";
    case Int8LinearVariant::PostScale: return "post-scale";
  }
  return "?";
}

std::optional<Int8LinearVariant> parse_int8_linear_variant(std::string_view s) {
  if (s == "token128") return Int8LinearVariant::Token128;
  if (s == "block128") return Int8LinearVariant::Block128;
  if (s == "post-scale") return Int8LinearVariant::PostScale;
  return std::nullopt;
}

ops::Int8WeightScheme int8_weight_scheme(Int8LinearVariant v) {
  return v == Int8LinearVariant::PostScale ? ops::Int8WeightScheme::PerChannel : ops::Int8WeightScheme::Block128;
}

ops::Int8ActScheme int8_act_scheme(Int8LinearVariant v) {
  switch (v) {
    case Int8LinearVariant::Token128: return ops::Int8ActScheme::Token128;
    case Int8LinearVariant::Block128: return ops::Int8ActScheme::Block128;
    case Int8LinearVariant::PostScale: return ops::Int8ActScheme::PerToken;
  }
  return ops::Int8ActScheme::Token128;
}

ops::Int8LinearWeight quantize_linear_weight(const Tensor& weight, Int8LinearVariant v) {
  TD_CHECK(weight.defined() && weight.dim() == 2 && float_dtype(weight.dtype()), Shape,
           "quantize_linear_weight: weight must be a 2-D f32/bf16/f16 [out, in], got ",
           weight.defined() ? weight.desc() : std::string("nothing"));
  const Tensor w = host_contiguous(weight);
  const int64_t N = w.size(0), K = w.size(1);
  ops::Int8LinearWeight out;
  out.scheme = int8_weight_scheme(v);
  out.q = Tensor::empty({N, K}, DType::I8);
  const kernels::ElemType wt = ops::elem_type(w.dtype(), "quantize_linear_weight", "weight");
  kernels::Status st;
  if (out.scheme == ops::Int8WeightScheme::PerChannel) {
    out.scale = Tensor::empty({N}, DType::F32);
    st = kernels::quantize_per_row_cpu(wt, w.raw_data(), N, K, K, out.q.data<int8_t>(), K, out.scale.data<float>());
  } else {
    out.scale = Tensor::empty({kernels::quant_groups(N), kernels::quant_groups(K)}, DType::F32);
    st = kernels::quantize_block128_cpu(wt, w.raw_data(), N, K, K, out.q.data<int8_t>(), K, out.scale.data<float>());
  }
  ops::check_status(st, "quantize_linear_weight", weight.desc());
  return out;
}

ops::Int8LinearWeight int8_weight_from_turbodiffusion(const Tensor& int8_weight, const Tensor& scale,
                                                      Int8LinearVariant v, const std::string& what) {
  ops::Int8LinearWeight w;
  w.q = host_contiguous(int8_weight);
  w.scale = host_contiguous(scale);
  w.scheme = ops::Int8WeightScheme::Block128;
  ops::check_int8_weight(w, what.c_str());
  if (int8_weight_scheme(v) == ops::Int8WeightScheme::Block128) return w;
  // Post-scale: w = q * block scale, re-quantized with one scale per output channel.
  return quantize_linear_weight(ops::dequantize_int8_weight(w, DType::F32), v);
}

Int8Linear::Int8Linear(ops::Int8LinearWeight weight, const Tensor& bias, Int8LinearVariant v, Device device)
    : variant_(v) {
  TD_CHECK(weight.scheme == int8_weight_scheme(v), Usage, "nn::Int8Linear: a ",
           weight.scheme == ops::Int8WeightScheme::PerChannel ? "per-channel" : "128x128-block",
           " weight cannot serve the ", int8_linear_variant_name(v), " variant");
  ops::check_int8_weight(weight, "nn::Int8Linear");
  const auto place = [&](const Tensor& t) { return t.device() == device ? t : t.to(device); };
  weight_.scheme = weight.scheme;
  weight_.q = place(weight.q);
  weight_.scale = place(weight.scale);
  if (bias.defined()) {
    TD_CHECK(bias.dim() == 1 && bias.size(0) == weight_.out_features() && float_dtype(bias.dtype()), Shape,
             "nn::Int8Linear: bias ", bias.desc(), " must be a float vector of ", weight_.out_features(),
             " values (weight ", weight_.q.desc(), ")");
    const Tensor h = host_contiguous(bias);
    bias_ = place(h.dtype() == DType::F32 ? h : h.to(DType::F32));
  }
}

Int8Linear Int8Linear::from_float(const Tensor& weight, const Tensor& bias, Int8LinearVariant v, Device device) {
  return Int8Linear(quantize_linear_weight(weight, v), bias, v, device);
}

Tensor Int8Linear::operator()(const Tensor& x, std::optional<DType> out_dtype, bool gelu_tanh) const {
  TD_CHECK(defined(), Internal, "nn::Int8Linear called before its weight was set");
  return ops::int8_linear(x, weight_, bias_, int8_act_scheme(variant_), out_dtype, gelu_tanh);
}

Tensor Int8Linear::operator()(const ops::QuantizedActivation& x, std::optional<DType> out_dtype,
                              bool gelu_tanh) const {
  TD_CHECK(defined(), Internal, "nn::Int8Linear called before its weight was set");
  TD_CHECK(x.act == int8_act_scheme(variant_), Usage, "nn::Int8Linear (", int8_linear_variant_name(variant_),
           "): the activation was quantized as ", ops::int8_act_scheme_name(x.act), ", the layer reads ",
           ops::int8_act_scheme_name(int8_act_scheme(variant_)));
  return ops::int8_linear(x, weight_, bias_, out_dtype, gelu_tanh);
}

}  // namespace td::nn
