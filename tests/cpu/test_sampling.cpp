// Samplers (src/sampling/): the Philox noise generator against Random123's
// known answers and an independent numpy implementation; the schedules
// against diffusers and the reference's published values; every sampler
// against (a) straightforward double loops written here from the formulas,
// (b) diffusers' own schedulers (UniPC as Wan's diffusers pipeline configures
// it, FlowMatchEuler) and the rCM loop of scripts/make_sampler_fixtures.py,
// all driven by the same closed-form velocity
//     v(x, ts) = a x + (b + c ts / 1000) u + w.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "harness/harness.h"
#include "io/safetensors.h"
#include "sampling/noise.h"
#include "sampling/samplers.h"
#include "sampling/schedule.h"

namespace td {
namespace {

using namespace sampling;

std::string fixture(const std::string& name) { return test::source_dir() + "/fixtures/sampling/" + name; }

std::vector<double> as_f64(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = t.item_f64(i);
  return v;
}

const Tensor& need(const io::TensorFile& f, const std::string& name) {
  const Tensor* t = f.find(name);
  if (!t) fail(ErrorKind::Format, "fixture tensor '", name, "' missing; rerun scripts/make_sampler_fixtures.py");
  return *t;
}

// The synthetic velocity field v(x, ts) = a x + (b + c ts/1000) u + w.
struct Field {
  double a = 0, b = 0, c = 0;
  std::vector<double> u, w;
  Shape shape;

  std::vector<double> eval(const std::vector<double>& x, double ts) const {
    std::vector<double> v(x.size());
    for (size_t i = 0; i < x.size(); ++i) v[i] = a * x[i] + (b + c * ts / 1000.0) * u[i] + w[i];
    return v;
  }
  // As a sampler callback; counts its calls.
  VelocityFn fn(int* calls = nullptr) const {
    return [this, calls](const Tensor& x, double ts) {
      if (calls) ++*calls;
      EXPECT_EQ(x.dtype(), DType::F64);
      const std::vector<double> v = eval(as_f64(x), ts);
      Tensor out = Tensor::empty(shape, DType::F64);
      std::copy(v.begin(), v.end(), out.data<double>());
      // Poison the input the sampler handed over: it must be a copy, not the state.
      test::poison(const_cast<Tensor&>(x));
      return out;
    };
  }
};

Field load_field(const io::TensorFile& f, const std::string& prefix) {
  Field fld;
  const std::vector<double> abc = as_f64(need(f, prefix + ".abc"));
  fld.a = abc[0], fld.b = abc[1], fld.c = abc[2];
  fld.u = as_f64(need(f, prefix + ".u"));
  fld.w = as_f64(need(f, prefix + ".w"));
  fld.shape = need(f, prefix + ".u").shape();
  return fld;
}

Field random_field(const Shape& shape) {
  Field fld;
  fld.shape = shape;
  std::uniform_real_distribution<double> d(-0.6, 0.6);
  fld.a = d(test::rng()) - 0.3, fld.b = d(test::rng()), fld.c = d(test::rng());
  const size_t n = size_t(shape_numel(shape));
  for (float v : test::randn(n)) fld.u.push_back(v);
  for (float v : test::randn(n, 0.f, 0.5f)) fld.w.push_back(v);
  return fld;
}

double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / den);
}

// ---------------------------------------------------------------- noise ----

TEST(SamplingNoise, PhiloxKnownAnswers) {
  // Random123 tests/kat_vectors, the three "philox4x32 10" lines.
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(SamplingNoise, MatchesIndependentNumpyImplementation) {
  const io::TensorFile rcm = io::read_safetensors(fixture("rcm.safetensors"));
  for (int steps = 1; steps <= 4; ++steps) {
    const std::string p = "s" + std::to_string(steps) + ".";
    const uint64_t seed = uint64_t(need(rcm, p + "params").item_f64(2));
    const Tensor& eps0 = need(rcm, p + "eps0");
    const Tensor mine = randn(eps0.shape(), seed, 0);
    // Both sides compute Box-Muller in double and round to float; libm
    // differences of an ulp in double almost never move the float rounding.
    const test::Accuracy acc = test::compare(mine, eps0);
    EXPECT_LE(acc.max_abs, 1e-6) << "seed " << seed << ": " << acc.str();
  }
  const io::TensorFile big = io::read_safetensors(fixture("philox_big_seed.safetensors"));
  const std::vector<double> want = as_f64(need(big, "normals"));
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(normal_at(0x123456789ABCDEF0ull, 0xFEDCBA9876543210ull, i), want[i], 1e-6) << "index " << i;
}

TEST(SamplingNoise, SameSeedSameNumbersAnyThreadCount) {
  const uint64_t seed = test::rng()();
  const int64_t n = 100003;  // not a multiple of 4 or of any chunk size
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2, 3, 7}) {
    ThreadPool pool(threads);
    std::vector<float> out(static_cast<size_t>(n));
    test::poison(out.data(), out.size() * sizeof(float), DType::F32);
    fill_normal(out.data(), n, seed, 5, 0, pool);
    runs.push_back(std::move(out));
  }
  for (size_t r = 1; r < runs.size(); ++r)
    EXPECT_EQ(std::memcmp(runs[0].data(), runs[r].data(), size_t(n) * sizeof(float)), 0) << "run " << r;
  // An offset range is the same numbers as the full range.
  std::vector<float> tail(1001);
  fill_normal(tail.data(), 1001, seed, 5, 77);
  for (size_t i = 0; i < tail.size(); ++i) ASSERT_EQ(tail[i], runs[0][77 + i]) << "index " << 77 + i;
  for (int64_t i : {int64_t(0), int64_t(1), int64_t(6), n - 1}) EXPECT_EQ(normal_at(seed, 5, uint64_t(i)), runs[0][size_t(i)]);
}

TEST(SamplingNoise, SeedsAndStreamsDifferAndLookGaussian) {
  const uint64_t seed = test::rng()();
  const Shape shape{3, 5, 7, 11};
  const Tensor a = randn(shape, seed, 0), a2 = randn(shape, seed, 0);
  const Tensor b = randn(shape, seed + 1, 0), c = randn(shape, seed, 1);
  EXPECT_EQ(std::memcmp(a.raw_data(), a2.raw_data(), a.nbytes()), 0);
  const test::Accuracy ab = test::compare(a, b), ac = test::compare(a, c);
  EXPECT_GT(ab.rel_l2, 1.0) << ab.str();  // independent N(0,1): rel L2 ~ sqrt(2)
  EXPECT_GT(ac.rel_l2, 1.0) << ac.str();
  EXPECT_LT(std::fabs(ab.cosine), 0.1) << ab.str();
  // Moments over 2^18 samples: 6-sigma bounds.
  const int64_t n = 1 << 18;
  std::vector<float> v(static_cast<size_t>(n));
  fill_normal(v.data(), n, seed, 3);
  double m1 = 0, m2 = 0, m4 = 0;
  for (float x : v) m1 += x, m2 += double(x) * x, m4 += double(x) * x * x * x;
  m1 /= double(n), m2 /= double(n), m4 /= double(n);
  EXPECT_LT(std::fabs(m1), 6.0 / std::sqrt(double(n)));
  EXPECT_LT(std::fabs(m2 - 1.0), 6.0 * std::sqrt(2.0 / double(n)));
  EXPECT_LT(std::fabs(m4 - 3.0), 6.0 * std::sqrt(96.0 / double(n)));
  const Tensor bf = randn({2, 9}, seed, 4, DType::BF16);
  EXPECT_EQ(bf.dtype(), DType::BF16);
  EXPECT_THROW(randn({2}, seed, 0, DType::I32), Error);
}

// ------------------------------------------------------------ schedules ----

TEST(SamplingSchedule, WanMatchesReferenceTimesteps) {
  // shared/reference/wan21-and-rcm.md §5: N = 50, shift 5 -> 999, 995, 991, 987, 982, ... 241, 172, 92.
  const FlowSchedule s = flow_schedule(FlowScheduleKind::Wan, kWanDefaultSteps, kWanDefaultShift);
  ASSERT_EQ(s.steps(), 50);
  const std::vector<double> head{999, 995, 991, 987, 982}, tail{241, 172, 92};
  for (size_t i = 0; i < head.size(); ++i) EXPECT_EQ(s.timesteps[i], head[i]) << i;
  for (size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(s.timesteps[47 + i], tail[i]) << 47 + i;
  // Direct formula: sigma = linspace(0.999, 0, N + 1)[:N], shifted, float32.
  const int n = 1 + int(test::rng()() % 60);
  const double shift = 1.0 + double(test::rng()() % 100) / 10.0;
  const FlowSchedule r = flow_schedule(FlowScheduleKind::Wan, n, shift);
  ASSERT_EQ(r.sigmas.size(), size_t(n) + 1);
  for (int i = 0; i < n; ++i) {
    const double lin = double(float(0.999)) * (1.0 - double(i) / n);
    const double sh = shift * lin / (1.0 + (shift - 1.0) * lin);
    EXPECT_NEAR(r.sigmas[size_t(i)], sh, 1e-7) << "step " << i << " of " << n << ", shift " << shift;
    EXPECT_EQ(r.sigmas[size_t(i)], double(float(r.sigmas[size_t(i)])));
    EXPECT_NEAR(r.timesteps[size_t(i)], std::floor(sh * 1000.0), 1.0) << i;
  }
  EXPECT_EQ(r.sigmas.back(), 0.0);
  EXPECT_THROW(flow_schedule(FlowScheduleKind::Wan, 0, 5.0), Error);
  EXPECT_THROW(flow_schedule(FlowScheduleKind::Wan, 10, -1.0), Error);
}

TEST(SamplingSchedule, RcmTimesFromReference) {
  // turbodiffusion.md §3 / wan21-and-rcm.md §6: sigma_max 80, 4 steps -> t = 0.9877, 0.9338, 0.8529, 0.6090, 0,
  // the network sees bf16(1000 t) = 988, 932, 852, 608.
  const RcmSchedule s = rcm_schedule();  // defaults: 4 steps, sigma_max 80
  const std::vector<double> t{0.987654, 0.933781, 0.852895, 0.608979, 0.0}, ts{988, 932, 852, 608};
  ASSERT_EQ(s.times.size(), 5u);
  for (size_t i = 0; i < t.size(); ++i) EXPECT_NEAR(s.times[i], t[i], 1e-6) << i;
  for (size_t i = 0; i < ts.size(); ++i) EXPECT_EQ(s.timesteps[i], ts[i]) << i;
  EXPECT_NEAR(s.times[0], 80.0 / 81.0, 1e-15);
  EXPECT_NEAR(rcm_schedule(1, 200.0).times[0], 0.995025, 1e-6);
  EXPECT_NEAR(rcm_schedule(1, 1600.0).times[0], 0.999375, 1e-6);
  // 1 step: [t0, 0]; 2: [t0, t(1.5), 0]; 3 adds t(1.4).
  for (int n = 1; n <= 4; ++n) {
    const RcmSchedule r = rcm_schedule(n, 80.0);
    ASSERT_EQ(r.times.size(), size_t(n) + 1);
    for (int i = 0; i < n; ++i) EXPECT_EQ(r.times[size_t(i)], s.times[size_t(i)]) << n << " steps, " << i;
    EXPECT_EQ(r.times.back(), 0.0);
  }
  EXPECT_THROW(rcm_schedule(0, 80.0), Error);
  EXPECT_THROW(rcm_schedule(5, 80.0), Error);
  EXPECT_THROW(rcm_schedule(2, 0.0), Error);
  const double increasing[] = {1.0, 1.4};
  EXPECT_THROW(rcm_schedule(3, 80.0, increasing), Error);
}

// ------------------------------------------------ samplers vs diffusers ----

struct TeacherCase {
  const char* file;
  FlowScheduleKind kind;
  FlowSolver solver;
  double shift;
  double max_rel_l2;  // of the final latent and of every step, vs diffusers
};

void run_teacher_fixture(const TeacherCase& c) {
  SCOPED_TRACE(c.file);
  const io::TensorFile f = io::read_safetensors(fixture(std::string(c.file) + ".safetensors"));
  const std::vector<double> want_ts = as_f64(need(f, "timesteps")), want_sig = as_f64(need(f, "sigmas"));
  const int steps = int(want_ts.size());
  const FlowSchedule s = flow_schedule(c.kind, steps, c.shift);
  ASSERT_EQ(s.timesteps.size(), want_ts.size());
  ASSERT_EQ(s.sigmas.size(), want_sig.size());
  for (int i = 0; i < steps; ++i) EXPECT_EQ(s.timesteps[size_t(i)], want_ts[size_t(i)]) << "timestep " << i;
  for (size_t i = 0; i < want_sig.size(); ++i) EXPECT_EQ(s.sigmas[i], want_sig[i]) << "sigma " << i;

  const Field cond = load_field(f, "cond"), uncond = load_field(f, "uncond");
  const double g = need(f, "guidance").item_f64(0);
  int cond_calls = 0, uncond_calls = 0;
  GuidedVelocity model{cond.fn(&cond_calls), uncond.fn(&uncond_calls), g};
  const Tensor& traj = need(f, "trajectory");
  const int64_t n = shape_numel(cond.shape);
  double worst = 0;
  FlowOptions opt;
  opt.solver = c.solver;
  opt.on_step = [&](int step, int total, const Tensor& x) {
    EXPECT_EQ(total, steps);
    std::vector<double> ref(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ref[size_t(i)] = traj.item_f64(int64_t(step) * n + i);
    worst = std::max(worst, rel_l2(as_f64(x), ref));
  };
  const Tensor out = flow_sample(need(f, "noise"), s, model, opt);
  EXPECT_EQ(cond_calls, steps);
  EXPECT_EQ(uncond_calls, g == 1.0 ? 0 : steps);
  std::vector<double> ref_final(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ref_final[size_t(i)] = traj.item_f64(int64_t(steps - 1) * n + i);
  const double final_err = rel_l2(as_f64(out), ref_final);
  EXPECT_LE(final_err, c.max_rel_l2);
  EXPECT_LE(worst, c.max_rel_l2);
  std::printf("  %-28s final rel L2 %.3g, worst step %.3g\n", c.file, final_err, worst);
}

TEST(SamplingTeacher, UniPCMatchesDiffusers) {
  // diffusers computes the UniPC coefficients in float32 (its sigmas tensor is
  // float32), this code in double: ~1e-7 per coefficient, so 1e-6 bars. The
  // _f64 fixture runs diffusers with the same sigma values upcast to float64,
  // which leaves only summation-order rounding.
  run_teacher_fixture({"unipc_s50_shift5_g5", FlowScheduleKind::DiffusersUniPC, FlowSolver::UniPC, 5.0, 1e-6});
  run_teacher_fixture({"unipc_s50_shift5_g5_f64", FlowScheduleKind::DiffusersUniPC, FlowSolver::UniPC, 5.0, 1e-12});
  run_teacher_fixture({"unipc_s7_shift3_g1", FlowScheduleKind::DiffusersUniPC, FlowSolver::UniPC, 3.0, 1e-6});
  run_teacher_fixture({"unipc_s2_shift3_g4", FlowScheduleKind::DiffusersUniPC, FlowSolver::UniPC, 3.0, 1e-6});
}

TEST(SamplingTeacher, EulerMatchesDiffusers) {
  // FlowMatchEulerDiscreteScheduler.step rounds the sample to float32 each
  // step (sample.to(float32)); this code keeps double: bars of 1e-6.
  run_teacher_fixture({"euler_s50_shift5_g5", FlowScheduleKind::DiffusersEuler, FlowSolver::Euler, 5.0, 1e-6});
  run_teacher_fixture({"euler_s9_shift3_g1", FlowScheduleKind::DiffusersEuler, FlowSolver::Euler, 3.0, 1e-6});
}

TEST(SamplingRcm, MatchesReferenceLoop) {
  const io::TensorFile f = io::read_safetensors(fixture("rcm.safetensors"));
  const Field field = load_field(f, "field");
  for (const std::string p : {"s1", "s2", "s3", "s4", "ode"}) {
    SCOPED_TRACE(p);
    const std::vector<double> params = as_f64(need(f, p + ".params"));
    const int steps = int(params[0]);
    const RcmSchedule s = rcm_schedule(steps, params[1]);
    const std::vector<double> times = as_f64(need(f, p + ".times")), ts = as_f64(need(f, p + ".timesteps"));
    ASSERT_EQ(s.times.size(), times.size());
    for (size_t i = 0; i < times.size(); ++i) EXPECT_NEAR(s.times[i], times[i], 1e-15) << i;
    for (size_t i = 0; i < ts.size(); ++i) EXPECT_EQ(s.timesteps[i], ts[i]) << i;
    int calls = 0;
    RcmOptions opt;
    opt.ode = params[3] != 0.0;
    const Tensor out = rcm_sample(field.shape, uint64_t(params[2]), s, field.fn(&calls), opt);
    EXPECT_EQ(calls, steps);
    const test::Accuracy acc = test::compare(out, need(f, p + ".result"));
    // Same formulas in double on both sides; the noise agrees to float32 bits.
    TD_EXPECT_CLOSE(acc, 1e-12, 1.0 - 1e-12);
  }
}

// ----------------------------------------- samplers vs direct formulas -----

// rCM written out: x = t0 eps0; x0 = x - t v; x = (1 - t') x0 + t' eps_k.
std::vector<double> rcm_direct(const Field& fld, uint64_t seed, int steps, double sigma_max, bool ode) {
  std::vector<double> ang{std::atan(sigma_max), 1.5, 1.4, 1.0};
  ang.resize(size_t(steps));
  ang.push_back(0.0);
  std::vector<double> t;
  for (double a : ang) t.push_back(std::tan(a) / (1.0 + std::tan(a)));  // sigma / (1 + sigma)
  const size_t n = fld.u.size();
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = t[0] * double(normal_at(seed, 0, i));
  for (int k = 0; k < steps; ++k) {
    const double ts = double(bf16_to_f32(f32_to_bf16(float(t[size_t(k)] * 1000.0))));
    const std::vector<double> v = fld.eval(x, ts);
    for (size_t i = 0; i < n; ++i) {
      const double x0 = x[i] - t[size_t(k)] * v[i];
      x[i] = ode ? x[i] + (t[size_t(k) + 1] - t[size_t(k)]) * v[i]
                 : (1.0 - t[size_t(k) + 1]) * x0 + t[size_t(k) + 1] * double(normal_at(seed, uint64_t(k) + 1, i));
    }
  }
  return x;
}

TEST(SamplingRcm, MatchesDirectFormulasAndIsDeterministic) {
  const Shape shape{1, 3, 2, 5, 7};
  const Field fld = random_field(shape);
  const uint64_t seed = test::rng()();
  for (int steps = 1; steps <= 4; ++steps) {
    for (bool ode : {false, true}) {
      SCOPED_TRACE("steps " + std::to_string(steps) + (ode ? " ode" : " stochastic"));
      const RcmSchedule s = rcm_schedule(steps, 80.0);
      RcmOptions opt;
      opt.ode = ode;
      int seen = 0;
      opt.on_step = [&](int step, int total, const Tensor&) { EXPECT_EQ(step, seen++); EXPECT_EQ(total, steps); };
      const Tensor out = rcm_sample(shape, seed, s, fld.fn(), opt);
      EXPECT_EQ(seen, steps);
      // tan-based t differs from sin/(cos+sin) by rounding only.
      EXPECT_LE(rel_l2(as_f64(out), rcm_direct(fld, seed, steps, 80.0, ode)), 1e-12);
      opt.on_step = nullptr;
      const Tensor again = rcm_sample(shape, seed, s, fld.fn(), opt);
      EXPECT_EQ(std::memcmp(out.raw_data(), again.raw_data(), out.nbytes()), 0) << "same seed, different result";
      const Tensor other = rcm_sample(shape, seed ^ 0x9e3779b97f4a7c15ull, s, fld.fn(), opt);
      EXPECT_GT(rel_l2(as_f64(other), as_f64(out)), 1e-3) << "different seeds, same result";
    }
  }
}

// Euler and UniPC (bh2, order 2, lower_order_final) written as the UniPC
// paper states them, keeping every model output: predictor
//   x_t = (s_t/s_s) x - a_t (e^-h - 1) m_s - a_t B(h) sum_k rho_p_k D_k,
// corrector with the fresh m_t, rho from R rho = b (p x p, Cramer's rule).
std::vector<double> teacher_direct(const Field& c, const Field& u, double g, const std::vector<double>& noise,
                                   const FlowSchedule& s, FlowSolver solver) {
  const size_t n = noise.size();
  const int N = s.steps();
  std::vector<double> x = noise;
  auto vel = [&](const std::vector<double>& at, int k) {
    const std::vector<double> vc = c.eval(at, s.timesteps[size_t(k)]);
    if (g == 1.0) return vc;
    const std::vector<double> vu = u.eval(at, s.timesteps[size_t(k)]);
    std::vector<double> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = vu[i] + g * (vc[i] - vu[i]);
    return v;
  };
  if (solver == FlowSolver::Euler) {
    for (int k = 0; k < N; ++k) {
      const std::vector<double> v = vel(x, k);
      for (size_t i = 0; i < n; ++i) x[i] = x[i] + (s.sigmas[size_t(k) + 1] - s.sigmas[size_t(k)]) * v[i];
    }
    return x;
  }
  auto lam = [](double sg) { return std::log((1.0 - sg) / sg); };
  std::vector<std::vector<double>> m;  // data predictions m_0 .. m_k
  std::vector<double> x_before;        // state before the last predictor
  int last_order = 0;
  // One UniP/UniC update from sigma index k0 to t_index with history order p;
  // m_t (corrector only) is the fresh prediction at t.
  auto update = [&](const std::vector<double>& xs, size_t k0, size_t t_index, int p, const std::vector<double>* m_t) {
    const double st = s.sigmas[t_index], ss = s.sigmas[k0], at = 1.0 - st;
    std::vector<double> out(n);
    if (st == 0.0) return m[k0];
    const double h = lam(st) - lam(ss);
    const double Bh = std::exp(-h) - 1.0;
    double rho_d = 0.0, rho_t = 0.0, r = 1.0;
    if (p == 2) r = (lam(s.sigmas[k0 - 1]) - lam(ss)) / h;
    if (m_t == nullptr) {
      rho_d = p == 2 ? 0.5 : 0.0;
    } else if (p == 1) {
      rho_t = 0.5;
    } else {
      // b_1 = (phi_1(-h)/(-h) - 1)/B(h)... written with phi_2, phi_3 of hh = -h.
      const double hh = -h;
      const double phi2 = (std::exp(hh) - 1.0) / hh - 1.0;  // h phi_1/hh - 1
      const double phi3 = phi2 / hh - 0.5;
      const double b1 = phi2 / Bh, b2 = 2.0 * phi3 / Bh;
      // [[1, 1], [r, 1]] (rho_d, rho_t) = (b1, b2)
      const double det = 1.0 * 1.0 - 1.0 * r;
      rho_d = (b1 * 1.0 - 1.0 * b2) / det;
      rho_t = (1.0 * b2 - r * b1) / det;
    }
    for (size_t i = 0; i < n; ++i) {
      const double D = p == 2 ? (m[k0 - 1][i] - m[k0][i]) / r : 0.0;
      const double Dt = m_t ? (*m_t)[i] - m[k0][i] : 0.0;
      out[i] = st / ss * xs[i] - at * (std::exp(-h) - 1.0) * m[k0][i] - at * Bh * (rho_d * D + rho_t * Dt);
    }
    return out;
  };
  for (int k = 0; k < N; ++k) {
    const std::vector<double> v = vel(x, k);
    std::vector<double> mk(n);
    for (size_t i = 0; i < n; ++i) mk[i] = x[i] - s.sigmas[size_t(k)] * v[i];
    if (k > 0) x = update(x_before, size_t(k) - 1, size_t(k), last_order, &mk);
    m.push_back(mk);
    const int p = std::min({2, k + 1, N - k});
    x_before = x;
    x = update(x, size_t(k), size_t(k) + 1, p, nullptr);
    last_order = p;
  }
  return x;
}

TEST(SamplingTeacher, MatchesDirectFormulas) {
  const Shape shape{1, 4, 3, 3, 5};
  const Field c = random_field(shape), u = random_field(shape);
  const std::vector<float> nf = test::randn(size_t(shape_numel(shape)));
  const std::vector<double> noise(nf.begin(), nf.end());
  Tensor noise_t = Tensor::from_f32(shape, nf);
  for (FlowSolver solver : {FlowSolver::Euler, FlowSolver::UniPC}) {
    for (auto [kind, steps, shift, g] : {std::tuple{FlowScheduleKind::Wan, 50, 5.0, 5.0},
                                        std::tuple{FlowScheduleKind::Wan, 1, 3.0, 1.0},
                                        std::tuple{FlowScheduleKind::DiffusersUniPC, 3, 3.0, 6.0},
                                        std::tuple{FlowScheduleKind::DiffusersEuler, 13, 8.0, 1.0}}) {
      SCOPED_TRACE(std::string(solver == FlowSolver::Euler ? "euler" : "unipc") + " steps " + std::to_string(steps));
      const FlowSchedule s = flow_schedule(kind, steps, shift);
      int cond_calls = 0, uncond_calls = 0;
      FlowOptions opt;
      opt.solver = solver;
      if (solver == FlowSolver::UniPC && kind == FlowScheduleKind::DiffusersEuler) {
        // That schedule starts at sigma = 1, where UniPC's log(1 - sigma) is undefined.
        EXPECT_THROW(flow_sample(noise_t, s, {c.fn(), u.fn(), g}, opt), Error);
        continue;
      }
      const Tensor out = flow_sample(noise_t, s, {c.fn(&cond_calls), u.fn(&uncond_calls), g}, opt);
      EXPECT_EQ(cond_calls, steps);
      EXPECT_EQ(uncond_calls, g == 1.0 ? 0 : steps);
      EXPECT_LE(rel_l2(as_f64(out), teacher_direct(c, u, g, noise, s, solver)), 1e-12);
    }
  }
}

// With the ideal denoiser of a single data point x*, v = (x - x*) / sigma,
// every sampler lands on x* (the data prediction is exact at every step).
TEST(SamplingAll, IdealDenoiserRecoversTheDataPoint) {
  const Shape shape{2, 3, 5};
  const std::vector<float> star_f = test::randn(size_t(shape_numel(shape)));
  const std::vector<double> star(star_f.begin(), star_f.end());
  auto ideal = [&](const std::vector<double>* sigmas, int* call) {
    return [&star, sigmas, call, shape](const Tensor& x, double) {
      const double sg = (*sigmas)[size_t((*call)++)];
      Tensor v = Tensor::empty(shape, DType::F64);
      for (int64_t i = 0; i < x.numel(); ++i) v.data<double>()[i] = (x.item_f64(i) - star[size_t(i)]) / sg;
      return v;
    };
  };
  for (FlowSolver solver : {FlowSolver::Euler, FlowSolver::UniPC}) {
    const FlowSchedule s = flow_schedule(FlowScheduleKind::Wan, 20, 5.0);
    int call = 0;
    const Tensor out =
        flow_sample(initial_noise(shape, test::rng()()), s, {ideal(&s.sigmas, &call), nullptr, 1.0}, {solver, {}});
    EXPECT_LE(rel_l2(as_f64(out), star), 1e-12) << (solver == FlowSolver::Euler ? "euler" : "unipc");
  }
  for (bool ode : {false, true}) {
    const RcmSchedule s = rcm_schedule(4, 80.0);
    int call = 0;
    RcmOptions opt;
    opt.ode = ode;
    const Tensor out = rcm_sample(shape, test::rng()(), s, ideal(&s.times, &call), opt);
    EXPECT_LE(rel_l2(as_f64(out), star), 1e-12) << (ode ? "rcm ode" : "rcm");
  }
}

TEST(SamplingAll, BadCallbacksAndArgumentsAreClearErrors) {
  const Shape shape{1, 2, 3};
  const FlowSchedule s = flow_schedule(FlowScheduleKind::Wan, 4, 5.0);
  const Tensor noise = initial_noise(shape, 1);
  const VelocityFn wrong_shape = [](const Tensor&, double) { return Tensor::zeros({1, 2, 4}, DType::F32); };
  try {
    flow_sample(noise, s, {wrong_shape, nullptr, 1.0});
    ADD_FAILURE() << "a velocity of the wrong shape was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Shape);
    EXPECT_NE(std::string(e.what()).find("[1, 2, 4]"), std::string::npos) << e.what();
  }
  const VelocityFn nan_v = [&](const Tensor&, double) {
    Tensor t = Tensor::zeros(shape, DType::F32);
    t.data<float>()[4] = std::nanf("");
    return t;
  };
  EXPECT_THROW(rcm_sample(shape, 3, rcm_schedule(2, 80.0), nan_v), Error);
  const VelocityFn zero = [&](const Tensor&, double) { return Tensor::zeros(shape, DType::BF16); };
  try {
    flow_sample(noise, s, {zero, nullptr, 5.0});
    ADD_FAILURE() << "guidance without an unconditional model was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
  }
  // BF16 velocities are accepted (converted).
  EXPECT_NO_THROW(flow_sample(noise, s, {zero, nullptr, 1.0}));
}

}  // namespace
}  // namespace td
