#include "nn/linear.h"

#include "core/profile.h"
#include "nn/int8_linear.h"
#include "ops/elementwise.h"
#include "ops/linear.h"

namespace td::nn {

Linear::Linear(Tensor weight, Tensor bias) : weight_(std::move(weight)), bias_(std::move(bias)) {
  TD_CHECK(weight_.defined() && weight_.dim() == 2, Shape, "nn::Linear: weight must be 2-D [out, in], got ",
           weight_.defined() ? weight_.desc() : std::string("undefined"));
  TD_CHECK(!bias_.defined() || (bias_.dim() == 1 && bias_.size(0) == weight_.size(0)), Shape, "nn::Linear: bias ",
           bias_.defined() ? bias_.desc() : std::string(), " does not match weight ", weight_.desc());
}

Linear::Linear(Int8Linear int8) : int8_(std::make_shared<const Int8Linear>(std::move(int8))) {
  TD_CHECK(int8_->defined(), Internal, "nn::Linear: the INT8 layer it wraps has no weight");
}

int64_t Linear::in_features() const { return int8_ ? int8_->in_features() : weight_.size(1); }
int64_t Linear::out_features() const { return int8_ ? int8_->out_features() : weight_.size(0); }

Tensor Linear::operator()(const Tensor& x, std::optional<DType> out_dtype, bool gelu_tanh) const {
  TD_CHECK(defined(), Internal, "nn::Linear called before its weight was set");
  if (int8_) {
    const prof::Scope scope(prof::OpClass::Gemm, x.device().is_cuda());
    return (*int8_)(x, out_dtype, gelu_tanh);
  }
  Tensor y;
  {
    const prof::Scope scope(prof::OpClass::Gemm, x.device().is_cuda());
    y = ops::linear(x, weight_, bias_, out_dtype);
  }
  return gelu_tanh ? ops::gelu_tanh(y) : y;
}

Tensor Linear::operator()(const ops::QuantizedActivation& x, std::optional<DType> out_dtype, bool gelu_tanh) const {
  TD_CHECK(int8_ != nullptr, Internal, "nn::Linear: a quantized activation given to a floating-point layer");
  const prof::Scope scope(prof::OpClass::Gemm, x.x.device().is_cuda());
  return (*int8_)(x, out_dtype, gelu_tanh);
}

std::optional<ops::Int8ActScheme> Linear::int8_act_scheme() const {
  if (!int8_) return std::nullopt;
  return nn::int8_act_scheme(int8_->variant());
}

}  // namespace td::nn
