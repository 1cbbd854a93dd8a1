#include "sampling/samplers.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "sampling/noise.h"

namespace td::sampling {
namespace {

constexpr int64_t kGrain = 1 << 15;

// Runs fn(i) for every element; each element is independent, so the split
// over threads cannot change the result.
template <typename Fn>
void for_each_index(int64_t n, Fn&& fn) {
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fn(i);
  });
}

// The model's answer as a contiguous F64 host tensor of the latent's shape.
Tensor velocity_as_f64(const Tensor& v, const Shape& shape, const char* which, int step, double timestep) {
  TD_CHECK(v.defined(), Internal, "sampler: the ", which, " velocity callback returned no tensor at step ", step,
           " (timestep ", timestep, ")");
  TD_CHECK(v.shape() == shape, Shape, "sampler: the ", which, " velocity at step ", step, " (timestep ", timestep,
           ") has shape ", shape_str(v.shape()), "; expected the latent shape ", shape_str(shape));
  TD_CHECK(dtype_is_floating(v.dtype()), DType, "sampler: the ", which, " velocity at step ", step, " is ",
           dtype_name(v.dtype()), "; expected a float dtype");
  Tensor host = v.device().is_cpu() ? v : v.to(Device::cpu());
  Tensor out = host.contiguous().to(DType::F64);
  const double* p = out.data<double>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (!std::isfinite(p[i]))
      fail(ErrorKind::Internal, "sampler: the ", which, " velocity at step ", step, " (timestep ", timestep,
           ") has a non-finite value ", p[i], " at flat index ", i);
  }
  return out;
}

Tensor state_like(const Shape& shape) { return Tensor::empty(shape, DType::F64); }

// log(alpha / sigma) in flow units (alpha = 1 - sigma): UniPC's lambda.
double flow_lambda(double sigma) { return std::log(1.0 - sigma) - std::log(sigma); }

void check_schedule(const FlowSchedule& s) {
  TD_CHECK(s.steps() >= 1 && s.sigmas.size() == s.timesteps.size() + 1, Internal,
           "flow sampler: schedule with ", s.timesteps.size(), " timesteps and ", s.sigmas.size(),
           " sigmas; expected N >= 1 timesteps and N + 1 sigmas");
  TD_CHECK(s.sigmas.back() == 0.0, Internal, "flow sampler: the last sigma is ", s.sigmas.back(), "; expected 0");
  for (size_t i = 0; i + 1 < s.sigmas.size(); ++i)
    TD_CHECK(s.sigmas[i] > s.sigmas[i + 1] && s.sigmas[i] <= 1.0, Internal, "flow sampler: sigma ", i, " = ",
             s.sigmas[i], " (next ", s.sigmas[i + 1], "); expected strictly decreasing values in (0, 1]");
}

}  // namespace

Tensor initial_noise(const Shape& latent_shape, uint64_t seed) { return randn(latent_shape, seed, 0, DType::F64); }

Tensor rcm_sample(const Shape& latent_shape, uint64_t seed, const RcmSchedule& schedule, const VelocityFn& velocity,
                  const RcmOptions& options) {
  const int steps = schedule.steps();
  TD_CHECK(steps >= 1 && schedule.times.size() == size_t(steps) + 1 && schedule.times.back() == 0.0, Internal,
           "rCM sampler: schedule with ", steps, " timesteps and ", schedule.times.size(),
           " times; expected N + 1 times ending at 0");
  TD_CHECK(bool(velocity), Internal, "rCM sampler: no velocity callback");
  const std::vector<uint64_t>& seeds = options.sample_seeds;
  Tensor x = seeds.empty() ? randn(latent_shape, seed, 0, DType::F64)
                           : randn_per_sample(latent_shape, seeds, 0, DType::F64);
  const int64_t n = x.numel();
  double* xp = x.data<double>();
  const double t0 = schedule.times[0];
  for_each_index(n, [&](int64_t i) { xp[i] *= t0; });

  for (int step = 0; step < steps; ++step) {
    const double t_cur = schedule.times[size_t(step)], t_next = schedule.times[size_t(step) + 1];
    const double timestep = schedule.timesteps[size_t(step)];
    // The callback sees a copy, so a model that writes into its input cannot change the state.
    const Tensor v = velocity_as_f64(velocity(x.clone(), timestep), latent_shape, "rCM", step, timestep);
    const double* vp = v.data<double>();
    if (options.ode) {
      for_each_index(n, [&](int64_t i) { xp[i] -= (t_cur - t_next) * vp[i]; });
    } else if (t_next > 0.0) {
      std::vector<float> eps(size_t(n), 0.f);
      if (seeds.empty()) {
        fill_normal(eps.data(), n, seed, uint64_t(step) + 1);
      } else {
        const int64_t per = n / int64_t(seeds.size());
        for (size_t k = 0; k < seeds.size(); ++k)
          fill_normal(eps.data() + int64_t(k) * per, per, seeds[k], uint64_t(step) + 1);
      }
      for_each_index(n, [&](int64_t i) {
        const double x0 = xp[i] - t_cur * vp[i];
        xp[i] = (1.0 - t_next) * x0 + t_next * double(eps[size_t(i)]);
      });
    } else {
      // t_next = 0: the fresh noise has weight 0, so the reference's extra draw changes nothing.
      for_each_index(n, [&](int64_t i) { xp[i] -= t_cur * vp[i]; });
    }
    if (options.on_step) options.on_step(step, steps, x);
  }
  return x;
}

Tensor flow_sample(const Tensor& noise, const FlowSchedule& schedule, const GuidedVelocity& model,
                   const FlowOptions& options) {
  check_schedule(schedule);
  TD_CHECK(bool(model.cond), Internal, "flow sampler: no conditional velocity callback");
  TD_CHECK(std::isfinite(model.guidance), Usage, "flow sampler: --guidance ", model.guidance, " is not finite");
  const bool guided = model.guidance != 1.0 && bool(model.uncond);
  TD_CHECK(model.guidance == 1.0 || guided, Usage, "flow sampler: --guidance ", model.guidance,
           " needs an unconditional (negative-prompt) model call; none was given");
  TD_CHECK(dtype_is_floating(noise.dtype()), DType, "flow sampler: initial noise is ", dtype_name(noise.dtype()),
           "; expected a float dtype");
  const Shape shape = noise.shape();
  Tensor x = (noise.device().is_cpu() ? noise : noise.to(Device::cpu())).contiguous().to(DType::F64).clone();
  const int64_t n = x.numel();
  double* xp = x.data<double>();
  const int steps = schedule.steps();
  const std::vector<double>& sig = schedule.sigmas;

  // The guided velocity at the current state (an F64 host tensor).
  auto guided_velocity = [&](int step) -> Tensor {
    const double ts = schedule.timesteps[size_t(step)];
    Tensor vc = velocity_as_f64(model.cond(x.clone(), ts), shape, "conditional", step, ts);
    if (!guided) return vc;
    const Tensor vu = velocity_as_f64(model.uncond(x.clone(), ts), shape, "unconditional", step, ts);
    Tensor out = state_like(shape);
    const double* c = vc.data<double>();
    const double* u = vu.data<double>();
    double* o = out.data<double>();
    const double g = model.guidance;
    for_each_index(n, [&](int64_t i) { o[i] = u[i] + g * (c[i] - u[i]); });
    return out;
  };

  if (options.solver == FlowSolver::Euler) {
    for (int step = 0; step < steps; ++step) {
      const Tensor v_t = guided_velocity(step);
      const double* v = v_t.data<double>();
      const double dt = sig[size_t(step) + 1] - sig[size_t(step)];
      for_each_index(n, [&](int64_t i) { xp[i] += dt * v[i]; });
      if (options.on_step) options.on_step(step, steps, x);
    }
    return x;
  }

  // UniPC, bh2 variant (B(h) = expm1(-h) in the data-prediction form),
  // order 2 with order 1 at the first step (no history) and at the last step
  // (lower_order_final). m_k = x_k - sigma_k v_k is the data prediction at
  // step k, computed at the predicted (not yet corrected) state, as diffusers
  // converts the model output before running the corrector.
  const size_t count = static_cast<size_t>(n);
  TD_CHECK(sig[0] < 1.0, Usage, "UniPC sampler: the schedule starts at sigma = ", sig[0],
           "; UniPC needs sigma < 1 (it takes log(1 - sigma)): use the Wan or diffusers-UniPC schedule");
  std::vector<double> m_new(count), m0(count), m1(count), last(count);
  int prev_order = 0;
  for (int step = 0; step < steps; ++step) {
    const size_t k = size_t(step);
    const Tensor v_t = guided_velocity(step);
    const double* v = v_t.data<double>();
    for_each_index(n, [&](int64_t i) { m_new[size_t(i)] = xp[i] - sig[k] * v[i]; });

    if (step > 0) {
      // Corrector (UniC) of the step k-1 -> k just taken, using the fresh m_k:
      // x_k = sigma_k/sigma_{k-1} x_{k-1} - alpha_k expm1(-h) m_{k-1}
      //       - alpha_k B(h) (rho_0 D1 + rho_last (m_k - m_{k-1})),  D1 = (m_{k-2} - m_{k-1}) / r.
      const double s_t = sig[k], s_0 = sig[k - 1], a_t = 1.0 - s_t;
      const double h = flow_lambda(s_t) - flow_lambda(s_0);
      const double hh = -h, phi1 = std::expm1(hh), b_h = std::expm1(hh);
      double rho_d1 = 0.0, rho_last = 0.5, r = 1.0;
      if (prev_order == 2) {
        r = (flow_lambda(sig[k - 2]) - flow_lambda(s_0)) / h;
        // rho solves [[1, 1], [r, 1]] rho = [b1, b2] with b_j = j! phi_j-terms / B(h).
        const double hk1 = phi1 / hh - 1.0;
        const double hk2 = hk1 / hh - 0.5;
        const double b1 = hk1 / b_h, b2 = 2.0 * hk2 / b_h;
        rho_d1 = (b1 - b2) / (1.0 - r);
        rho_last = b1 - rho_d1;
      }
      const double ratio = s_t / s_0, c_m0 = a_t * phi1, c_b = a_t * b_h;
      const bool use_d1 = prev_order == 2;
      for_each_index(n, [&](int64_t ii) {
        const size_t i = size_t(ii);
        const double d1 = use_d1 ? (m1[i] - m0[i]) / r : 0.0;
        xp[ii] = ratio * last[i] - c_m0 * m0[i] - c_b * (rho_d1 * d1 + rho_last * (m_new[i] - m0[i]));
      });
    }

    // History: m1 = m_{k-1}, m0 = m_k.
    m1.swap(m0);
    m0.swap(m_new);
    const int order = std::min({2, steps - step, step + 1});
    for_each_index(n, [&](int64_t i) { last[size_t(i)] = xp[i]; });

    // Predictor (UniP) from sigma_k to sigma_{k+1}.
    const double s_t = sig[k + 1], s_0 = sig[k];
    if (s_t == 0.0) {
      // alpha = 1, h = +inf, expm1(-h) = -1: the update is x = m_k exactly
      // (lower_order_final makes the last step order 1).
      TD_CHECK(order == 1, Internal, "UniPC: order ", order, " at sigma 0 (step ", step, " of ", steps, ")");
      for_each_index(n, [&](int64_t i) { xp[i] = m0[size_t(i)]; });
    } else {
      const double a_t = 1.0 - s_t;
      const double h = flow_lambda(s_t) - flow_lambda(s_0);
      const double phi1 = std::expm1(-h), b_h = phi1;
      const double ratio = s_t / s_0, c_m0 = a_t * phi1;
      const double r = order == 2 ? (flow_lambda(sig[k - 1]) - flow_lambda(s_0)) / h : 1.0;
      // Order 2 predictor: rho_p = 0.5 (diffusers' closed form for p = 2).
      const double c_d1 = order == 2 ? a_t * b_h * 0.5 / r : 0.0;
      for_each_index(n, [&](int64_t ii) {
        const size_t i = size_t(ii);
        xp[ii] = ratio * xp[ii] - c_m0 * m0[i] - (order == 2 ? c_d1 * (m1[i] - m0[i]) : 0.0);
      });
    }
    prev_order = order;
    if (options.on_step) options.on_step(step, steps, x);
  }
  return x;
}

}  // namespace td::sampling
