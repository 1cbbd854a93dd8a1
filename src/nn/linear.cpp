#include "nn/linear.h"

#include "ops/linear.h"

namespace td::nn {

Linear::Linear(Tensor weight, Tensor bias) : weight_(std::move(weight)), bias_(std::move(bias)) {
  TD_CHECK(weight_.defined() && weight_.dim() == 2, Shape, "nn::Linear: weight must be 2-D [out, in], got ",
           weight_.defined() ? weight_.desc() : std::string("undefined"));
  TD_CHECK(!bias_.defined() || (bias_.dim() == 1 && bias_.size(0) == weight_.size(0)), Shape, "nn::Linear: bias ",
           bias_.defined() ? bias_.desc() : std::string(), " does not match weight ", weight_.desc());
}

Tensor Linear::operator()(const Tensor& x, std::optional<DType> out_dtype) const {
  TD_CHECK(defined(), Internal, "nn::Linear called before its weight was set");
  return ops::linear(x, weight_, bias_, out_dtype);
}

}  // namespace td::nn
