#include "models/wan/wan_random.h"

#include <cmath>

#include "models/wan/wan_keys.h"
#include "ops/random.h"

namespace td::models::wan {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Tensor filled(const Shape& shape, DType dtype, Device device, uint64_t seed, uint64_t stream, float lo, float hi) {
  Tensor t = Tensor::empty(shape, dtype, device);
  ops::random_fill_(t, seed, stream, lo, hi);
  return t;
}

}  // namespace

WanCheckpoint random_wan_checkpoint(const WanConfig& config, const RandomWanOptions& o) {
  config.validate();
  TD_CHECK(o.dtype == DType::F32 || o.dtype == DType::BF16, Usage, "random Wan DiT: run dtype f32 or bf16, got ",
           dtype_name(o.dtype));
  WanCheckpoint ck;
  ck.config = config;
  ck.detection.description = cat("random weights (seed ", o.seed, ")");
  ck.paths = {};
  ck.has_proj_l = o.with_proj_l;
  ck.int8_variant = o.int8_variant;
  const std::vector<WanTensorSpec> specs = wan_tensor_specs(config, o.with_proj_l);
  const float dim_bound = float(std::sqrt(3.0 / double(config.dim)));  // U(-a, a) with std 1/sqrt(dim)
  int64_t fan_in = 1;  // of the last weight seen: a bias follows its weight in the spec list
  for (size_t i = 0; i < specs.size(); ++i) {
    const WanTensorSpec& s = specs[i];
    const DType dt = s.dtype == WanParamDType::Run ? o.dtype : DType::F32;
    const uint64_t stream = uint64_t(i);
    const bool is_weight = ends_with(s.name, ".weight");
    const bool is_linear_weight = is_weight && s.shape.size() == 2;
    if (is_linear_weight) fan_in = s.shape[1];
    const float lin_bound = float(1.0 / std::sqrt(double(fan_in)));
    if (s.block_linear_weight && o.int8_variant) {
      const int64_t N = s.shape[0], K = s.shape[1];
      ops::Int8LinearWeight w;
      w.scheme = nn::int8_weight_scheme(*o.int8_variant);
      w.q = filled({N, K}, DType::I8, o.device, o.seed, stream, 0, 0);
      const Shape scale_shape = w.scheme == ops::Int8WeightScheme::PerChannel
                                    ? Shape{N}
                                    : Shape{(N + 127) / 128, (K + 127) / 128};
      const float base = lin_bound / 127.f;
      w.scale = filled(scale_shape, DType::F32, o.device, o.seed, stream + (uint64_t(1) << 32), 0.9f * base,
                       1.1f * base);
      ck.device_bytes += w.q.nbytes() + w.scale.nbytes();
      ck.int8_weights[s.name.substr(0, s.name.size() - std::string(".weight").size())] = std::move(w);
      ck.int8_quantized_at_load++;
      continue;
    }
    float lo, hi;
    if (s.name.find("modulation") != std::string::npos) {
      lo = -dim_bound, hi = dim_bound;
    } else if (is_linear_weight || s.proj_l) {
      lo = -lin_bound, hi = lin_bound;
    } else if (is_weight) {  // norm weights
      lo = 0.9f, hi = 1.1f;
    } else if (s.name.find("norm") != std::string::npos) {  // norm biases
      lo = -0.02f, hi = 0.02f;
    } else {  // linear biases
      lo = -lin_bound, hi = lin_bound;
    }
    Tensor t = filled(s.shape, dt, o.device, o.seed, stream, lo, hi);
    ck.device_bytes += t.nbytes();
    ck.tensors[s.name] = std::move(t);
  }
  return ck;
}

}  // namespace td::models::wan
