// The samplers, as pure math on host tensors: the model is a callback.
//
// - rcm_sample: rCM / TurboDiffusion few-step consistency sampling (1-4 steps)
//   of a distilled student, stochastic (fresh noise each step) or --ode.
//   Facts: shared/reference/wan21-and-rcm.md §6, turbodiffusion.md §3.
// - flow_sample: the Wan teacher with classifier-free guidance, Euler flow
//   matching or UniPC (bh2, order 2, data prediction, lower order at the first
//   and last steps) as diffusers' UniPCMultistepScheduler / Wan's
//   FlowUniPCMultistepScheduler run it. Facts: wan21-and-rcm.md §5.
//
// The sample state is kept in float64 (rCM's reference does its update in
// fp64; the teacher gains nothing from less). The callback gets the state as a
// contiguous F64 host tensor and may return a velocity of any float dtype on
// any device; the caller's adapter converts to the model's dtype and device
// (rCM's reference feeds the network bf16 latents).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "sampling/schedule.h"

namespace td::sampling {

// velocity = f(latent, timestep): the flow-matching velocity (eps - x0) of the
// network at `latent` for network timestep `timestep` (~1000 sigma).
using VelocityFn = std::function<Tensor(const Tensor& latent, double timestep)>;
// Called after step `step` (0-based) of `steps` with the new state.
using StepFn = std::function<void(int step, int steps, const Tensor& state)>;

struct RcmOptions {
  bool ode = false;  // deterministic Euler update x -= (t_cur - t_next) v instead of fresh noise
  StepFn on_step;
  // A batch of independent samples [N, ...]: sample k draws its initial and
  // per-step noise from sample_seeds[k] (noise.h randn_per_sample), so it
  // equals the one-sample run of that seed. Empty: the whole tensor from `seed`.
  std::vector<uint64_t> sample_seeds;
};

// Draws the initial noise eps0 (stream 0 of `seed`, noise.h), x = t0 eps0, and
// for each step: v = f(x, timestep_i), x0 = x - t_i v, then
// x = (1 - t_{i+1}) x0 + t_{i+1} eps_{i+1} (eps_{i+1} = stream 1 + i), or the
// ODE update; the last step (t = 0) returns x0. Returns the F64 latent.
Tensor rcm_sample(const Shape& latent_shape, uint64_t seed, const RcmSchedule& schedule, const VelocityFn& velocity,
                  const RcmOptions& options = {});

// Classifier-free guidance: v = v_uncond + g (v_cond - v_uncond); with g == 1
// or no `uncond` only `cond` is called (one forward per step).
struct GuidedVelocity {
  VelocityFn cond;
  VelocityFn uncond;
  double guidance = kWanDefaultGuidance;
};

enum class FlowSolver { Euler, UniPC };

struct FlowOptions {
  FlowSolver solver = FlowSolver::UniPC;
  StepFn on_step;
};

// The initial latent of the teacher: stream 0 of `seed` (the same noise rCM starts from).
Tensor initial_noise(const Shape& latent_shape, uint64_t seed);

// Integrates from `noise` (x at sigma_0, treated as exact) down the schedule.
// Returns the F64 latent at sigma = 0.
Tensor flow_sample(const Tensor& noise, const FlowSchedule& schedule, const GuidedVelocity& model,
                   const FlowOptions& options = {});

}  // namespace td::sampling
