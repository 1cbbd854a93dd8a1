// Noise schedules of the samplers: flow-matching sigmas with the Wan shift
// (teacher: UniPC / Euler) and rCM's TrigFlow times (few-step student).
// Facts: shared/reference/wan21-and-rcm.md §5 (teacher) and §6 (rCM),
// shared/reference/turbodiffusion.md §3; the diffusers variants follow
// diffusers 0.42's UniPCMultistepScheduler / FlowMatchEulerDiscreteScheduler.
#pragma once
#include <span>
#include <vector>

namespace td::sampling {

// Flow-matching convention: x_sigma = (1 - sigma) x0 + sigma eps, the network
// predicts v = eps - x0, and is called with timestep ~ 1000 sigma.
enum class FlowScheduleKind {
  // Wan's own FlowUniPCMultistepScheduler (generate.py): sigma = linspace(0.999, 0,
  // N+1)[:N] (0.999 as float32, the scheduler's sigma_max), shifted, then 0
  // appended; timestep = int(1000 sigma) truncated.
  Wan,
  // diffusers UniPCMultistepScheduler(use_flow_sigmas=True, flow_shift=shift):
  // sigma = linspace(1, 1/1000, N+1)[:N], shifted, sigma_0 = 1 - 1e-6 when it
  // is within 1e-6 of 1; timestep = int(1000 sigma) truncated.
  DiffusersUniPC,
  // diffusers FlowMatchEulerDiscreteScheduler(shift=shift): sigma_min is the
  // (float32) shifted 1/1000 of the training grid, shifted a second time in
  // set_timesteps as diffusers does; timestep = 1000 sigma in float32, not truncated.
  DiffusersEuler,
};

struct FlowSchedule {
  // N + 1 values, decreasing, the last 0. Rounded to float32 as both Wan and
  // diffusers store them; the solvers take these values as exact.
  std::vector<double> sigmas;
  // N values: the timestep the network receives at step i.
  std::vector<double> timesteps;
  int steps() const { return int(timesteps.size()); }
};

// The Wan/SD3 shift: shift sigma / (1 + (shift - 1) sigma), in this operation order.
double shift_sigma(double sigma, double shift);

FlowSchedule flow_schedule(FlowScheduleKind kind, int steps, double shift);

// rCM / TurboDiffusion defaults: intermediate TrigFlow angles, sigma_max of
// the T2V scripts (the Wan2.2 I2V script uses 200), 4 steps.
inline constexpr double kRcmMidAngles[3] = {1.5, 1.4, 1.0};
inline constexpr double kRcmDefaultSigmaMax = 80.0;
inline constexpr int kRcmDefaultSteps = 4;

// Wan teacher defaults (generate.py, T2V): 50 steps, shift 5, guidance 5.
inline constexpr int kWanDefaultSteps = 50;
inline constexpr double kWanDefaultShift = 5.0;
inline constexpr double kWanDefaultGuidance = 5.0;

struct RcmSchedule {
  // N + 1 TrigFlow angles [atan(sigma_max), mid[0 .. N-2], 0].
  std::vector<double> angles;
  // N + 1 rectified-flow times t = sin s / (cos s + sin s) (= sigma / (1 + sigma)); last 0.
  std::vector<double> times;
  // N network timesteps: 1000 t rounded to bfloat16, as the reference casts the
  // timestep tensor to bf16 before the model (988, 932, 852, 608 for sigma_max 80).
  std::vector<double> timesteps;
  int steps() const { return int(timesteps.size()); }
};

// steps in [1, 1 + mid.size()], sigma_max > 0.
RcmSchedule rcm_schedule(int steps = kRcmDefaultSteps, double sigma_max = kRcmDefaultSigmaMax,
                         std::span<const double> mid_angles = kRcmMidAngles);

}  // namespace td::sampling
