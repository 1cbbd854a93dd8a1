#include "ops/smoke.h"

#include <cmath>
#include <sstream>

#include "ops/elementwise.h"
#include "ops/norm.h"

namespace td::ops::smoke {

Tensor host_randn(const Shape& shape, DType dtype, uint64_t seed, float stddev, float mean) {
  std::vector<float> v(size_t(shape_numel(shape)));
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  auto uniform = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return (double(s >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  };
  for (auto& x : v) x = float(mean + stddev * std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()));
  return Tensor::from_f32(shape, v, dtype);
}

SmokeResult compare(const Tensor& got, const Tensor& ref, double max_rel_l2) {
  const auto g = got.to_f32_vector();
  const auto r = ref.to_f32_vector();
  if (g.size() != r.size()) return {false, "size mismatch"};
  double d2 = 0, r2 = 0;
  size_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) {
      ++bad;
      continue;
    }
    d2 += double(g[i] - r[i]) * double(g[i] - r[i]);
    r2 += double(r[i]) * double(r[i]);
  }
  const double rel = r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
  std::ostringstream os;
  os << "rel_l2 " << rel << " (bar " << max_rel_l2 << ")";
  if (bad) os << ", " << bad << " non-finite";
  return {bad == 0 && rel <= max_rel_l2, os.str()};
}

Results norm_family(int device) {
  const Device gpu = Device::cuda(device);
  const int64_t rows = 37, dim = 192, batch = 1;
  Tensor x = host_randn({rows, dim}, DType::BF16, 1);
  Tensor y = host_randn({rows, dim}, DType::BF16, 2);
  Tensor w = host_randn({dim}, DType::F32, 3, 0.1f, 1.f);
  Tensor b = host_randn({dim}, DType::F32, 4, 0.1f);
  Tensor scale = host_randn({batch, dim}, DType::F32, 5, 0.1f);
  Tensor shift = host_randn({batch, dim}, DType::F32, 6, 0.1f);
  Tensor gate = host_randn({batch, dim}, DType::F32, 7, 0.5f);
  const double bar = 1e-2;  // bf16 outputs
  Results out;
  out.push_back({"rms_norm", guarded([&] {
    return compare(rms_norm(x.to(gpu), w.to(gpu), 1e-6f), rms_norm(x, w, 1e-6f), bar);
  })});
  out.push_back({"layer_norm", guarded([&] {
    return compare(layer_norm(x.to(gpu), w.to(gpu), b.to(gpu), 1e-6f), layer_norm(x, w, b, 1e-6f), bar);
  })});
  out.push_back({"adaln_modulate", guarded([&] {
    return compare(adaln_modulate(x.to(gpu), scale.to(gpu), shift.to(gpu), 1e-6f),
                   adaln_modulate(x, scale, shift, 1e-6f), bar);
  })});
  out.push_back({"residual_gate_norm", guarded([&] {
    Tensor xr = x.to(DType::F32), xg = xr.to(gpu);
    ResidualNormArgs a{gate, Tensor(), Tensor(), scale, shift, 1e-6f, DType::BF16};
    ResidualNormArgs ag{gate.to(gpu), Tensor(), Tensor(), scale.to(gpu), shift.to(gpu), 1e-6f, DType::BF16};
    Tensor ref = residual_gate_norm(xr, y, a);
    Tensor got = residual_gate_norm(xg, y.to(gpu), ag);
    SmokeResult r = compare(got, ref, bar);
    SmokeResult rx = compare(xg, xr, 1e-6);  // the fp32 residual written back in place
    if (!rx.ok) return SmokeResult{false, "residual: " + rx.detail};
    return r;
  })});
  return out;
}

Results elementwise_family(int device) {
  const Device gpu = Device::cuda(device);
  Tensor x = host_randn({29, 160}, DType::BF16, 11);
  Tensor v = host_randn({160}, DType::F32, 12);
  const double bar = 1e-2;
  Results out;
  out.push_back({"gelu_tanh", guarded([&] { return compare(gelu_tanh(x.to(gpu)), gelu_tanh(x), bar); })});
  out.push_back({"silu", guarded([&] { return compare(silu(x.to(gpu)), silu(x), bar); })});
  out.push_back({"add_vector", guarded([&] { return compare(add(x.to(gpu), v.to(gpu)), add(x, v), bar); })});
  return out;
}

}  // namespace td::ops::smoke
