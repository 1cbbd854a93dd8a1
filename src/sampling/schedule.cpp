#include "sampling/schedule.h"

#include <cmath>
#include <numbers>

#include "core/dtype.h"
#include "core/error.h"

namespace td::sampling {
namespace {

constexpr int kTrainTimesteps = 1000;

// numpy.linspace(start, stop, num)[i] for i < num - 1: i * step + start with
// step = (stop - start) / (num - 1), the operation order numpy uses.
double linspace_at(double start, double stop, int num, int i) {
  const double step = (stop - start) / double(num - 1);
  return double(i) * step + start;
}

double round_f32(double v) { return double(float(v)); }

void check_flow_args(int steps, double shift) {
  TD_CHECK(steps >= 1 && steps <= 10000, Usage, "flow-matching sampler: --steps ", steps,
           " is out of range; expected 1 to 10000");
  TD_CHECK(std::isfinite(shift) && shift > 0.0, Usage, "flow-matching sampler: --shift ", shift,
           " is invalid; expected a finite value > 0");
}

}  // namespace

double shift_sigma(double sigma, double shift) { return shift * sigma / (1.0 + (shift - 1.0) * sigma); }

FlowSchedule flow_schedule(FlowScheduleKind kind, int steps, double shift) {
  check_flow_args(steps, shift);
  FlowSchedule s;
  s.sigmas.reserve(size_t(steps) + 1);
  s.timesteps.reserve(size_t(steps));
  switch (kind) {
    case FlowScheduleKind::Wan: {
      // sigma_max is the first sigma of the float32 training grid 1 - linspace(1, 1/1000, 1000)[::-1].
      const double sigma_max = round_f32(0.999);
      for (int i = 0; i < steps; ++i) {
        const double sigma = shift_sigma(linspace_at(sigma_max, 0.0, steps + 1, i), shift);
        s.timesteps.push_back(std::trunc(sigma * kTrainTimesteps));
        s.sigmas.push_back(round_f32(sigma));
      }
      break;
    }
    case FlowScheduleKind::DiffusersUniPC: {
      for (int i = 0; i < steps; ++i) {
        double sigma = shift_sigma(linspace_at(1.0, 1.0 / kTrainTimesteps, steps + 1, i), shift);
        if (i == 0 && std::fabs(sigma - 1.0) < 1e-6) sigma -= 1e-6;
        s.timesteps.push_back(std::trunc(sigma * kTrainTimesteps));
        s.sigmas.push_back(round_f32(sigma));
      }
      break;
    }
    case FlowScheduleKind::DiffusersEuler: {
      // The constructor shifts the float32 grid linspace(1, 1000)/1000 in float32;
      // sigma_max = shift(1) = 1 and sigma_min = shift(1/1000), both float32.
      const float shift_f = float(shift);
      const float grid_min = 1.0f / float(kTrainTimesteps);
      const float sigma_min_f = shift_f * grid_min / (1.0f + float(shift - 1.0) * grid_min);
      const double sigma_max = 1.0, sigma_min = double(sigma_min_f);
      for (int i = 0; i < steps; ++i) {
        // set_timesteps: linspace over 1000 sigma (float64, endpoint included), back to sigma, shifted again.
        const double t = steps == 1 ? sigma_max * kTrainTimesteps
                         : i == steps - 1
                             ? sigma_min * kTrainTimesteps
                             : linspace_at(sigma_max * kTrainTimesteps, sigma_min * kTrainTimesteps, steps, i);
        const float sigma_f = float(shift_sigma(t / kTrainTimesteps, shift));
        s.sigmas.push_back(double(sigma_f));
        s.timesteps.push_back(double(sigma_f * float(kTrainTimesteps)));
      }
      break;
    }
  }
  s.sigmas.push_back(0.0);
  return s;
}

RcmSchedule rcm_schedule(int steps, double sigma_max, std::span<const double> mid_angles) {
  TD_CHECK(steps >= 1 && size_t(steps) <= mid_angles.size() + 1, Usage, "rCM sampler: --num-steps ", steps,
           " is out of range; expected 1 to ", mid_angles.size() + 1);
  TD_CHECK(std::isfinite(sigma_max) && sigma_max > 0.0, Usage, "rCM sampler: --sigma-max ", sigma_max,
           " is invalid; expected a finite value > 0");
  RcmSchedule s;
  s.angles.push_back(std::atan(sigma_max));
  for (int i = 0; i + 1 < steps; ++i) s.angles.push_back(mid_angles[size_t(i)]);
  s.angles.push_back(0.0);
  for (size_t i = 0; i < s.angles.size(); ++i) {
    const double a = s.angles[i];
    TD_CHECK(a >= 0.0 && a < std::numbers::pi / 2 && (i == 0 || a < s.angles[i - 1]), Usage,
             "rCM sampler: TrigFlow angle ", i, " = ", a, " must lie in [0, pi/2) and decrease");
    s.times.push_back(std::sin(a) / (std::cos(a) + std::sin(a)));
  }
  for (int i = 0; i < steps; ++i)
    s.timesteps.push_back(double(bf16_to_f32(f32_to_bf16(float(s.times[size_t(i)] * 1000.0)))));
  return s;
}

}  // namespace td::sampling
