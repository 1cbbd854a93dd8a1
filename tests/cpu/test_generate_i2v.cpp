// I2V, several samples and the residency plan of `turbodiff generate`, on the
// CPU with tiny random models (scripts/make_generate_fixtures.py):
// - the image reader (PNG, JPEG, bad files) and the resize / adaptive size
//   against PIL and hand-computed values,
// - the 36-channel condition against diffusers' WanImageToVideoPipeline.prepare_latents,
// - which expert runs which step (rCM and flow rules),
// - end to end: I2V frames against diffusers' pipeline (Euler + CFG, two
//   experts, boundary_ratio) and against TurboDiffusion's rCM loop written in
//   torch, both from our Philox noise,
// - --num-samples (names, seeds, determinism), --offload plans and that they
//   do not change the frames,
// - bad input: refused with a message naming the fault and no file written.
#include <gtest/gtest.h>
#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "core/error.h"
#include "harness/harness.h"
#include "io/checkpoint.h"
#include "io/image_reader.h"
#include "io/video_writer.h"
#include "models/wan_vae/wan_vae.h"
#include "pipeline/generate.h"
#include "pipeline/image_condition.h"
#include "pipeline/residency.h"
#include "sampling/noise.h"
#include "sampling/samplers.h"
#include "sampling/schedule.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

namespace td {
namespace {
namespace fs = std::filesystem;
using pipeline::Component;
using pipeline::MoveKind;

std::string fixture(const std::string& rel) { return test::source_dir() + "/fixtures/" + rel; }
std::string i2v_fixture(const std::string& rel) { return fixture("generate/i2v/" + rel); }

std::string fresh_dir() {
  static int n = 0;
  const std::string d = test::temp_dir() + "/i2v_case" + std::to_string(n++);
  fs::create_directories(d);
  return d;
}

std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

Tensor fixture_tensor(const std::string& file, const std::string& name) {
  const io::TensorFile f = io::read_tensor_file(file);
  for (const auto& [n, t] : f.tensors)
    if (n == name) return t.contiguous().clone();
  ADD_FAILURE() << name << " not in " << file;
  return {};
}

io::RgbImage random_image(int64_t w, int64_t h) {
  io::RgbImage img;
  img.width = w;
  img.height = h;
  img.rgb.resize(size_t(w * h * 3));
  std::uniform_int_distribution<int> u(0, 255);
  for (auto& v : img.rgb) v = uint8_t(u(test::rng()));
  return img;
}

// ---- image reader -------------------------------------------------------------

TEST(ImageReader, PngFixtureMatchesPil) {
  const io::RgbImage img = io::read_image_rgb(i2v_fixture("image.png"));
  ASSERT_EQ(img.width, 64);
  ASSERT_EQ(img.height, 48);
  // The condition fixture holds the same pixels as diffusers read them (x / 255 * 2 - 1).
  const Tensor ref = fixture_tensor(i2v_fixture("condition.safetensors"), "image");
  const Tensor ours = pipeline::image_to_tensor(img);
  ASSERT_EQ(ours.shape(), ref.shape());
  const auto acc = test::compare(ours, ref);
  EXPECT_LE(acc.max_abs, 1e-6) << acc.str();  // tolerance: float rounding of v / 255 only
}

TEST(ImageReader, JpegAndPngRoundTrip) {
  const io::RgbImage img = random_image(37, 21);  // odd sizes
  const std::string dir = fresh_dir();
  ASSERT_TRUE(stbi_write_png((dir + "/a.png").c_str(), 37, 21, 3, img.rgb.data(), 37 * 3));
  const io::RgbImage png = io::read_image_rgb(dir + "/a.png");
  EXPECT_EQ(png.rgb, img.rgb);  // lossless
  // A smooth image survives JPEG at quality 100 to within a few levels.
  io::RgbImage smooth = img;
  for (int64_t y = 0; y < 21; ++y)
    for (int64_t x = 0; x < 37; ++x)
      for (int c = 0; c < 3; ++c) smooth.rgb[size_t((y * 37 + x) * 3 + c)] = uint8_t(4 * x + 5 * y + 40 * c);
  ASSERT_TRUE(stbi_write_jpg((dir + "/b.jpg").c_str(), 37, 21, 3, smooth.rgb.data(), 100));
  const io::RgbImage jpg = io::read_image_rgb(dir + "/b.jpg");
  ASSERT_EQ(jpg.width, 37);
  ASSERT_EQ(jpg.height, 21);
  double err = 0;
  for (size_t i = 0; i < jpg.rgb.size(); ++i) err += std::abs(int(jpg.rgb[i]) - int(smooth.rgb[i]));
  EXPECT_LE(err / double(jpg.rgb.size()), 3.0);  // tolerance: mean 3 levels (JPEG q100, 4:2:0 chroma)
  // Grey + alpha PNG -> RGB (grey replicated, alpha dropped).
  std::vector<uint8_t> ga(5 * 3 * 2);
  for (size_t i = 0; i < ga.size(); ++i) ga[i] = uint8_t(i * 7);
  ASSERT_TRUE(stbi_write_png((dir + "/ga.png").c_str(), 5, 3, 2, ga.data(), 10));
  const io::RgbImage g = io::read_image_rgb(dir + "/ga.png");
  for (int64_t i = 0; i < 15; ++i)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(g.rgb[size_t(i * 3 + c)], ga[size_t(i * 2)]);
}

TEST(ImageReader, BadFilesNamed) {
  const std::string dir = fresh_dir();
  auto expect_error = [](const std::string& path, ErrorKind kind) {
    try {
      io::read_image_rgb(path);
      ADD_FAILURE() << "no error for " << path;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  };
  expect_error(dir + "/missing.png", ErrorKind::Io);
  expect_error(dir, ErrorKind::Io);
  { std::ofstream(dir + "/text.png") << "this is not an image"; }
  expect_error(dir + "/text.png", ErrorKind::Format);
  { std::ofstream(dir + "/empty.jpg"); }
  expect_error(dir + "/empty.jpg", ErrorKind::Format);
  // A truncated PNG.
  const io::RgbImage img = random_image(40, 30);
  ASSERT_TRUE(stbi_write_png((dir + "/full.png").c_str(), 40, 30, 3, img.rgb.data(), 40 * 3));
  std::ifstream f(dir + "/full.png", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), {});
  std::ofstream(dir + "/cut.png", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  expect_error(dir + "/cut.png", ErrorKind::Format);
}

// ---- resize and size ----------------------------------------------------------

TEST(ImageCondition, ResizeMatchesPilBilinear) {
  const std::string file = i2v_fixture("resize.safetensors");
  for (int k = 0; k < 5; ++k) {
    const Tensor in = fixture_tensor(file, "in_" + std::to_string(k));
    const Tensor out = fixture_tensor(file, "out_" + std::to_string(k));
    io::RgbImage src;
    src.height = in.shape()[0];
    src.width = in.shape()[1];
    src.rgb.assign(in.data<uint8_t>(), in.data<uint8_t>() + in.numel());
    const io::RgbImage got = pipeline::resize_bilinear_antialias(src, out.shape()[1], out.shape()[0]);
    ASSERT_EQ(got.width, out.shape()[1]);
    ASSERT_EQ(got.height, out.shape()[0]);
    int worst = 0, off = 0;
    for (int64_t i = 0; i < out.numel(); ++i) {
      const int d = std::abs(int(got.rgb[size_t(i)]) - int(out.data<uint8_t>()[i]));
      worst = std::max(worst, d);
      off += d != 0;
    }
    // Tolerance: PIL works in 22-bit fixed point, we in double: at most one
    // level apart, on at most 2% of the values.
    EXPECT_LE(worst, 1) << "case " << k;
    EXPECT_LE(off, int(out.numel() / 50) + 1) << "case " << k;
  }
  // Same size is the identity.
  const io::RgbImage img = random_image(19, 11);
  EXPECT_EQ(pipeline::resize_bilinear_antialias(img, 19, 11).rgb, img.rgb);
}

TEST(ImageCondition, AdaptiveResolution) {
  // 1000x750 at the area of 1280x720: w = sqrt(921600 / 0.75) = 1108.5 -> 69.28 x 16 -> 1104,
  // h = sqrt(921600 * 0.75) = 831.4 -> 51.96 x 16 -> 832.
  EXPECT_EQ(pipeline::adaptive_resolution(1000, 750, 1280, 720), std::make_pair(int64_t(1104), int64_t(832)));
  // A square image keeps the area: 960x960.
  EXPECT_EQ(pipeline::adaptive_resolution(333, 333, 1280, 720), std::make_pair(int64_t(960), int64_t(960)));
  // Portrait 9:16 image at the area of 480p 16:9 (399360 px): w = sqrt(399360 / 1.778) = 474.0 -> 29.6 -> 480,
  // h = sqrt(399360 * 1.778) = 842.6 -> 52.7 -> 848 (not the transpose: the area decides).
  EXPECT_EQ(pipeline::adaptive_resolution(900, 1600, 832, 480), std::make_pair(int64_t(480), int64_t(848)));
  // Ties round half to even as Python's round: 40 / 16 = 2.5 -> 2 -> 32.
  EXPECT_EQ(pipeline::adaptive_resolution(7, 7, 40, 40), std::make_pair(int64_t(32), int64_t(32)));
  EXPECT_EQ(pipeline::adaptive_resolution(7, 7, 56, 56), std::make_pair(int64_t(64), int64_t(64)));  // 3.5 -> 4
  EXPECT_THROW(pipeline::adaptive_resolution(20000, 2, 832, 480), Error);  // h = sqrt(39.9) rounds to 0
}

// ---- the condition ------------------------------------------------------------

TEST(ImageCondition, MaskFoldsTheFirstFrame) {
  const Tensor m = pipeline::i2v_latent_mask(13, 4, 3, 5);
  ASSERT_EQ(m.shape(), (Shape{1, 4, 4, 3, 5}));
  for (int64_t c = 0; c < 4; ++c)
    for (int64_t t = 0; t < 4; ++t)
      for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(m.data<float>()[(c * 4 + t) * 15 + i], t == 0 ? 1.f : 0.f);
}

TEST(ImageCondition, MatchesDiffusersPrepareLatents) {
  const models::wan_vae::WanVae vae(models::wan_vae::load_wan_vae(fixture("vae/diffusion_pytorch_model.safetensors")));
  const Tensor image = pipeline::image_to_tensor(io::read_image_rgb(i2v_fixture("image.png")));
  const Tensor y = pipeline::i2v_condition(vae, image, 9, {});
  const Tensor ref = fixture_tensor(i2v_fixture("condition.safetensors"), "condition");
  ASSERT_EQ(y.shape(), ref.shape());
  ASSERT_EQ(y.shape(), (Shape{1, 20, 3, 6, 8}));
  // The mask exactly, the latent as the VAE encoder test's bar (rel L2 1e-5).
  TD_EXPECT_CLOSE(test::compare(y.slice(1, 0, 4).contiguous(), ref.slice(1, 0, 4).contiguous()), 0.0, 1.0);
  const auto acc = test::compare(y.slice(1, 4, 20).contiguous(), ref.slice(1, 4, 20).contiguous());
  TD_EXPECT_CLOSE(acc, 1e-5, 0.99999);
  std::printf("I2V condition latent vs diffusers prepare_latents: %s\n", acc.str().c_str());
}

// ---- the expert switch --------------------------------------------------------

TEST(Experts, RcmSwitchesBelowTheBoundary) {
  // sigma_max 200, 4 steps: times 0.995, 0.934, 0.853, 0.609 (turbodiffusion.md §3).
  const auto s = sampling::rcm_schedule(4, 200.0);
  EXPECT_EQ(pipeline::rcm_high_noise_steps(s, 0.9), (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(pipeline::rcm_high_noise_steps(s, 0.95), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(pipeline::rcm_high_noise_steps(s, 0.0), (std::vector<bool>{true, true, true, true}));
  EXPECT_EQ(pipeline::rcm_high_noise_steps(s, 1.0), (std::vector<bool>{false, false, false, false}));
  // A boundary equal to a step's time keeps that step on the high-noise expert (t_cur < boundary switches).
  EXPECT_EQ(pipeline::rcm_high_noise_steps(s, s.times[2]), (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(pipeline::rcm_high_noise_steps(sampling::rcm_schedule(2, 80.0), 0.9),
            (std::vector<bool>{true, true}));  // 0.988, 0.934
}

TEST(Experts, FlowSwitchesAtTheBoundaryTimestep) {
  const auto e = sampling::flow_schedule(sampling::FlowScheduleKind::DiffusersEuler, 4, 3.0);
  // 1000, 857.7, 602.2, 8.9 (diffusers, in fixtures/generate/i2v/meta.json).
  EXPECT_EQ(pipeline::flow_high_noise_steps(e, 0.7299), (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(pipeline::flow_high_noise_steps(e, e.timesteps[1] / 1000.0), (std::vector<bool>{true, true, false, false}));
  // Wan2.2 I2V A14B defaults: 40 UniPC steps, shift 5, boundary 0.9: the steps
  // with int(1000 sigma) >= 900 run the high-noise expert.
  const auto w = sampling::flow_schedule(sampling::FlowScheduleKind::Wan, 40, 5.0);
  const auto high = pipeline::flow_high_noise_steps(w, 0.9);
  int n_high = 0;
  for (size_t i = 0; i < high.size(); ++i) {
    EXPECT_EQ(high[i], w.timesteps[i] >= 900.0) << i;
    if (i > 0) EXPECT_TRUE(!high[i] || high[i - 1]) << "high-noise steps come first";
    n_high += high[i];
  }
  EXPECT_GT(n_high, 0);
  EXPECT_LT(n_high, 40);
}

// ---- residency ----------------------------------------------------------------

std::vector<Component> i2v_stages(int samples) {
  std::vector<Component> s{Component::TextEncoder, Component::Vae};
  for (int k = 0; k < samples; ++k)
    s.insert(s.end(), {Component::Dit, Component::LowNoiseDit, Component::Vae});
  return s;
}
const std::set<Component> kGpu{Component::TextEncoder, Component::Dit, Component::LowNoiseDit};

TEST(Residency, ModelPolicyI2VTwoSamples) {
  const auto plan = pipeline::plan_residency(i2v_stages(2), pipeline::OffloadPolicy::Model, kGpu);
  using M = pipeline::ResidencyMove;
  const std::vector<std::vector<M>> want = {
      {{MoveKind::Load, Component::TextEncoder}},
      {{MoveKind::Release, Component::TextEncoder}, {MoveKind::Load, Component::Vae}},
      {{MoveKind::Stage, Component::Dit}, {MoveKind::Upload, Component::Dit}},
      {{MoveKind::Offload, Component::Dit}, {MoveKind::Stage, Component::LowNoiseDit},
       {MoveKind::Upload, Component::LowNoiseDit}},
      {},  // the VAE runs on the host: the low-noise expert stays
      {{MoveKind::Offload, Component::LowNoiseDit}, {MoveKind::Upload, Component::Dit}},
      {{MoveKind::Release, Component::Dit}, {MoveKind::Upload, Component::LowNoiseDit}},
      {{MoveKind::Release, Component::LowNoiseDit}},
  };
  ASSERT_EQ(plan.steps.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(plan.steps[i].before, want[i]) << "step " << i;
  EXPECT_EQ(plan.final_moves, (std::vector<M>{{MoveKind::Release, Component::Vae}}));
  EXPECT_EQ(plan.max_on_gpu(), 1u);
}

TEST(Residency, NonePolicyKeepsModelsFromFirstToLastUse) {
  const auto plan = pipeline::plan_residency(i2v_stages(2), pipeline::OffloadPolicy::None, kGpu);
  EXPECT_EQ(plan.max_on_gpu(), 2u);  // both experts from the switch of sample 0 on
  EXPECT_EQ(plan.steps[3].on_gpu, (std::set<Component>{Component::Dit, Component::LowNoiseDit}));
  for (const auto& s : plan.steps)
    for (const auto& m : s.before) {
      EXPECT_NE(m.kind, MoveKind::Offload);
      EXPECT_NE(m.kind, MoveKind::Stage);
      EXPECT_NE(m.kind, MoveKind::Upload);
    }
  // One sample: each expert's uses are contiguous, so both policies load straight
  // to the GPU and release after the last use; the text encoder goes before the DiT.
  for (const auto p : {pipeline::OffloadPolicy::None, pipeline::OffloadPolicy::Model}) {
    const auto one = pipeline::plan_residency(i2v_stages(1), p, kGpu);
    EXPECT_EQ(one.max_on_gpu(), 1u);
    EXPECT_EQ(one.steps[1].before.front(), (pipeline::ResidencyMove{MoveKind::Release, Component::TextEncoder}));
  }
}

// Invariants on random stage sequences: a stage's model is present (on the GPU
// when it is a GPU model) when it runs; nothing is used after its release; the
// model policy never holds two GPU models; none never moves a model back.
TEST(Residency, RandomSequencesKeepInvariants) {
  std::uniform_int_distribution<int> comp(0, 3), len(1, 12);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<Component> stages;
    const int n = len(test::rng());
    for (int i = 0; i < n; ++i) stages.push_back(Component(comp(test::rng())));
    for (const auto p : {pipeline::OffloadPolicy::None, pipeline::OffloadPolicy::Model}) {
      const auto plan = pipeline::plan_residency(stages, p, kGpu);
      std::map<Component, int> state;  // 0 absent, 1 host, 2 gpu
      for (size_t i = 0; i < stages.size(); ++i) {
        for (const auto& m : plan.steps[i].before) {
          switch (m.kind) {
            case MoveKind::Load: state[m.component] = kGpu.count(m.component) ? 2 : 1; break;
            case MoveKind::Stage: state[m.component] = 1; break;
            case MoveKind::Upload: EXPECT_EQ(state[m.component], 1); state[m.component] = 2; break;
            case MoveKind::Offload: EXPECT_EQ(state[m.component], 2); state[m.component] = 1; break;
            case MoveKind::Release:
              state[m.component] = 0;
              EXPECT_EQ(std::count(stages.begin() + long(i), stages.end(), m.component), 0) << "released before use";
              break;
          }
          if (p == pipeline::OffloadPolicy::None) EXPECT_NE(m.kind, MoveKind::Offload);
        }
        const Component c = stages[i];
        EXPECT_EQ(state[c], kGpu.count(c) ? 2 : 1) << "trial " << trial << " step " << i;
        int gpu_models = 0;
        for (const auto& [k, v] : state) gpu_models += v == 2;
        if (p == pipeline::OffloadPolicy::Model) EXPECT_LE(gpu_models, kGpu.count(c) ? 1 : 2);
        std::set<Component> on;
        for (const auto& [k, v] : state)
          if (v == 2) on.insert(k);
        EXPECT_EQ(plan.steps[i].on_gpu, on);
      }
      for (const auto& m : plan.final_moves) state[m.component] = m.kind == MoveKind::Release ? 0 : state[m.component];
      for (const auto& [k, v] : state) EXPECT_EQ(v, 0) << "not released at the end";
    }
  }
}

TEST(Residency, AutoResolvesByFreeMemory) {
  using P = pipeline::OffloadPolicy;
  EXPECT_EQ(pipeline::resolve_offload(P::Auto, 60, 10, 80), P::None);
  EXPECT_EQ(pipeline::resolve_offload(P::Auto, 60, 30, 80), P::Model);
  EXPECT_EQ(pipeline::resolve_offload(P::Model, 1, 1, 80), P::Model);
  EXPECT_EQ(pipeline::resolve_offload(P::None, 100, 1, 80), P::None);
  EXPECT_EQ(pipeline::parse_offload_policy("model"), P::Model);
  EXPECT_THROW(pipeline::parse_offload_policy("disk"), Error);
}

TEST(Samples, OutputNames) {
  EXPECT_EQ(pipeline::sample_output_path("out.mp4", 0, 1), "out.mp4");
  EXPECT_EQ(pipeline::sample_output_path("out.mp4", 0, 3), "out_0.mp4");
  EXPECT_EQ(pipeline::sample_output_path("dir/clip.v2.mp4", 2, 3), "dir/clip.v2_2.mp4");
  EXPECT_EQ(pipeline::sample_output_path("frames/f_%04d.png", 1, 2), "frames/f_%04d_1.png");
  EXPECT_EQ(io::png_frame_name(pipeline::sample_output_path("f_%04d.png", 1, 2), 3), "f_0003_1.png");
}

// A batch of samples draws each sample's noise from its own seed: batched rCM
// equals the one-sample runs (a synthetic per-sample velocity, no model).
TEST(Samples, BatchedRcmEqualsOneSampleRuns) {
  const Shape one{1, 3, 2, 5, 7}, three{3, 3, 2, 5, 7};
  const std::vector<uint64_t> seeds{test::rng()(), test::rng()(), 42};
  const Tensor batch_noise = sampling::randn_per_sample(three, seeds, 0);
  for (int k = 0; k < 3; ++k) {
    const Tensor single = sampling::randn(one, seeds[size_t(k)], 0);
    EXPECT_TRUE(std::equal(single.data<float>(), single.data<float>() + single.numel(),
                           batch_noise.data<float>() + k * single.numel()));
  }
  auto velocity = [](const Tensor& x, double t) {  // v = 0.7 x + t / 1000, elementwise
    Tensor v = Tensor::empty(x.shape(), DType::F64);
    for (int64_t i = 0; i < x.numel(); ++i) v.data<double>()[i] = 0.7 * x.data<double>()[i] + t / 1000.0;
    return v;
  };
  const auto schedule = sampling::rcm_schedule(3, 80.0);
  sampling::RcmOptions ro;
  ro.sample_seeds = seeds;
  const Tensor batched = sampling::rcm_sample(three, seeds[0], schedule, velocity, ro);
  for (int k = 0; k < 3; ++k) {
    const Tensor single = sampling::rcm_sample(one, seeds[size_t(k)], schedule, velocity);
    EXPECT_TRUE(std::equal(single.data<double>(), single.data<double>() + single.numel(),
                           batched.data<double>() + k * single.numel()))
        << "sample " << k;  // tolerance: exact (same arithmetic per element)
  }
}

// ---- end to end ---------------------------------------------------------------

std::string models_i2v(const std::string& high = i2v_fixture("high"), const std::string& low = i2v_fixture("low")) {
  return "generate --high-noise-dit " + high + " --low-noise-dit " + low + " --vae " +
         fixture("vae/diffusion_pytorch_model.safetensors") + " --text-encoder " + fixture("umt5/hf") +
         " --tokenizer " + fixture("umt5/tokenizer") + " --device cpu";
}
const char* kPrompt = " --prompt 'A cat sits on a red chair in the sun.'";

// [F, H, W, 3] in [0, 1] from PNG frames.
std::vector<float> read_frames(const std::string& pattern, int frames, int64_t w, int64_t h) {
  std::vector<float> out;
  for (int i = 0; i < frames; ++i) {
    const io::RgbImage img = io::read_image_rgb(io::png_frame_name(pattern, i));
    EXPECT_EQ(img.width, w);
    EXPECT_EQ(img.height, h);
    for (const uint8_t v : img.rgb) out.push_back(float(v) / 255.f);
  }
  return out;
}

void expect_frames_match(const std::string& pattern, const std::string& reference) {
  const Tensor ref = fixture_tensor(reference, "frames");
  ASSERT_EQ(ref.shape(), (Shape{9, 48, 64, 3}));
  const std::vector<float> got = read_frames(pattern, 9, 64, 48);
  ASSERT_EQ(int64_t(got.size()), ref.numel());
  double worst = 0, sum = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(double(got[i]) - double(ref.data<float>()[i])) * 255.0;
    worst = std::max(worst, d);
    sum += d;
  }
  // Tolerance: the 8-bit rounding of the PNG (0.5 level) plus fp32 drift
  // between two implementations through 4 steps: at most 1 level, mean 0.35.
  EXPECT_LE(worst, 1.0) << reference;
  EXPECT_LE(sum / double(got.size()), 0.35) << reference;
  std::printf("frames vs %s: max %.3f levels, mean %.3f levels\n", reference.c_str(), worst, sum / double(got.size()));
}

TEST(GenerateI2V, EulerTwoExpertsMatchesDiffusersPipeline) {
  const std::string dir = fresh_dir();
  const auto r = test::run_cli(models_i2v() + kPrompt + " --image " + i2v_fixture("image.png") +
                               " --width 64 --height 48 --num-frames 9 --sampler euler --steps 4 --shift 3 "
                               "--guidance 3 --negative-prompt 'blurry, static' --boundary 0.7299 --seed 11 --json "
                               "-o " + dir + "/e_%04d.png");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"mode\": \"i2v\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"step_experts\": [\"high\", \"high\", \"low\", \"low\"]"), std::string::npos) << r.out;
  expect_frames_match(dir + "/e_%04d.png", i2v_fixture("euler.safetensors"));
}

TEST(GenerateI2V, RcmTwoExpertsMatchesTurboDiffusionLoop) {
  const std::string dir = fresh_dir();
  // --sigma-max defaults to 200 for I2V, as TurboDiffusion's I2V script.
  const auto r = test::run_cli(models_i2v() + kPrompt + " --image " + i2v_fixture("image.png") +
                               " --width 64 --height 48 --num-frames 9 --seed 5 --json -o " + dir + "/r_%04d.png");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"step_experts\": [\"high\", \"high\", \"low\", \"low\"]"), std::string::npos) << r.out;
  expect_frames_match(dir + "/r_%04d.png", i2v_fixture("rcm.safetensors"));
  // The experts really are used as the switch says: swapping them changes the video.
  const std::string dir2 = fresh_dir();
  const auto s = test::run_cli(models_i2v(i2v_fixture("low"), i2v_fixture("high")) + kPrompt + " --image " +
                               i2v_fixture("image.png") + " --width 64 --height 48 --num-frames 9 --seed 5 --quiet -o " +
                               dir2 + "/s_%04d.png");
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(read_frames(dir2 + "/s_%04d.png", 9, 64, 48), read_frames(dir + "/r_%04d.png", 9, 64, 48));
}

TEST(GenerateI2V, Mp4AdaptiveResolution) {
  if (std::system("command -v ffprobe > /dev/null 2>&1") != 0) GTEST_SKIP() << "ffprobe not installed (Debian ffmpeg)";
  // A 64x48 image at the area of 64x64 (4096 px): w = round(73.9 / 16) 16 = 80,
  // h = round(55.4 / 16) 16 = 48.
  const std::string dir = fresh_dir(), out = dir + "/clip.mp4";
  const auto r = test::run_cli(models_i2v() + kPrompt + " --image " + i2v_fixture("image.png") +
                               " --width 64 --height 64 --adaptive-resolution --num-frames 5 --num-steps 2 --json -o " +
                               out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"width\": 80, \"height\": 48"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"image_size\": [64, 48]"), std::string::npos) << r.out;
  EXPECT_EQ(listing(dir), std::vector<std::string>{"clip.mp4"});
  std::string probe;
  if (FILE* p = popen(("ffprobe -v error -count_frames -select_streams v:0 -show_entries "
                       "stream=width,height,nb_read_frames -of default=noprint_wrappers=1 " + out).c_str(), "r")) {
    char buf[256];
    while (size_t n = fread(buf, 1, sizeof buf, p)) probe.append(buf, n);
    pclose(p);
  }
  EXPECT_NE(probe.find("width=80"), std::string::npos) << probe;
  EXPECT_NE(probe.find("height=48"), std::string::npos) << probe;
  EXPECT_NE(probe.find("nb_read_frames=5"), std::string::npos) << probe;
}

// Several samples: sample k is the one-sample video of seed + k; the models
// are loaded once; --offload none and model give the same frames.
TEST(GenerateI2V, NumSamplesSeedsAndOffloadPolicies) {
  const uint64_t seed = test::rng()() % 1000000;
  const std::string base = models_i2v() + kPrompt + " --image " + i2v_fixture("image.png") +
                           " --width 64 --height 48 --num-frames 5 --num-steps 3 --json";
  const std::string dir = fresh_dir();
  const auto many = test::run_cli(base + " --seed " + std::to_string(seed) +
                                  " --num-samples 3 --offload model -o " + dir + "/m_%02d.png");
  ASSERT_EQ(many.exit_code, 0) << many.err;
  EXPECT_NE(many.out.find("\"seeds\": [" + std::to_string(seed) + ", " + std::to_string(seed + 1) + ", " +
                          std::to_string(seed + 2) + "]"),
            std::string::npos)
      << many.out;
  EXPECT_EQ(listing(dir).size(), 15u);  // 3 samples x 5 frames, nothing else
  // Each expert is read from disk once (staged), then only uploaded.
  EXPECT_NE(many.out.find("\"high_noise_dit: offload vae, stage high_noise_dit, upload high_noise_dit"),
            std::string::npos)
      << many.out;
  // The VAE runs on the run's device too (here the host), so it takes its turn: decode offloads
  // the low-noise expert, the next sample's high-noise stage offloads the VAE.
  EXPECT_NE(many.out.find("\"vae: offload low_noise_dit, upload vae | gpu: vae\""), std::string::npos) << many.out;
  EXPECT_NE(many.out.find("\"high_noise_dit: offload vae, upload high_noise_dit | gpu: high_noise_dit\""),
            std::string::npos)
      << many.out;
  for (const char* load : {": load high_noise_dit", ", load high_noise_dit", ": load low_noise_dit", ", load low_noise_dit"})
    EXPECT_EQ(many.out.find(load), std::string::npos) << "an expert was read from disk without staging: " << many.out;
  EXPECT_EQ(many.out.find("stage high_noise_dit"), many.out.rfind("stage high_noise_dit")) << "staged twice";
  const auto none = test::run_cli(base + " --seed " + std::to_string(seed) + " --num-samples 3 --offload none -o " +
                                  dir + "/n_%02d.png");
  ASSERT_EQ(none.exit_code, 0) << none.err;
  EXPECT_NE(none.out.find("\"offload\": \"none\""), std::string::npos);
  EXPECT_EQ(none.out.find("offload low_noise_dit"), std::string::npos) << none.out;
  const auto one = test::run_cli(base + " --seed " + std::to_string(seed + 1) + " -o " + dir + "/o_%02d.png");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  auto frames = [&](const std::string& pattern) { return read_frames(dir + "/" + pattern, 5, 64, 48); };
  EXPECT_EQ(frames("m_%02d_1.png"), frames("o_%02d.png")) << "sample 1 must be the video of seed + 1";
  for (int k = 0; k < 3; ++k) {
    const std::string m = "m_%02d_" + std::to_string(k) + ".png", n = "n_%02d_" + std::to_string(k) + ".png";
    EXPECT_EQ(frames(m), frames(n)) << "offload policy changed sample " << k;
  }
  // The samples as one DiT batch: the same videos (to one 8-bit level: the
  // batched GEMMs may round differently), with the same residency per batch.
  const auto batched = test::run_cli(base + " --seed " + std::to_string(seed) + " --num-samples 3 --sample-batch 0 "
                                     "--offload model -o " + dir + "/b_%02d.png");
  ASSERT_EQ(batched.exit_code, 0) << batched.err;
  EXPECT_NE(batched.out.find("\"sample_batch\": 3"), std::string::npos) << batched.out;
  for (int k = 0; k < 3; ++k) {
    const auto a = frames("m_%02d_" + std::to_string(k) + ".png"), b = frames("b_%02d_" + std::to_string(k) + ".png");
    ASSERT_EQ(a.size(), b.size());
    float worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
    EXPECT_LE(worst * 255.f, 1.01f) << "sample " << k;
  }
  EXPECT_NE(frames("m_%02d_0.png"), frames("m_%02d_1.png"));
  EXPECT_NE(frames("m_%02d_1.png"), frames("m_%02d_2.png"));
}

TEST(GenerateT2V, NumSamplesWritesNumberedMp4s) {
  const std::string dir = fresh_dir();
  const auto r = test::run_cli("generate --dit " + fixture("generate/dit") + " --vae " +
                               fixture("vae/diffusion_pytorch_model.safetensors") + " --text-encoder " +
                               fixture("umt5/hf") + " --tokenizer " + fixture("umt5/tokenizer") +
                               " --device cpu --prompt 'a red ocean' --num-frames 5 --width 64 --height 48 "
                               "--num-steps 1 --num-samples 2 --seed 4 --quiet -o " + dir + "/v.mp4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(listing(dir), (std::vector<std::string>{"v_0.mp4", "v_1.mp4"}));
}

// ---- bad input ----------------------------------------------------------------

void expect_refused(const std::string& args, const std::string& dir, const std::vector<std::string>& needles) {
  const auto r = test::run_cli(args);
  EXPECT_NE(r.exit_code, 0) << args;
  for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "expected '" << n << "' in: " << r.err;
  EXPECT_TRUE(listing(dir).empty()) << "output left behind for: " << args;
}

TEST(GenerateI2V, BadInputsRefusedWithoutOutput) {
  const std::string dir = fresh_dir(), out = " -o " + dir + "/bad.mp4";
  const std::string size = " --width 64 --height 48 --num-frames 5";
  const std::string image = " --image " + i2v_fixture("image.png");
  expect_refused(models_i2v() + kPrompt + size + out, dir, {"missing --image"});
  expect_refused(models_i2v() + kPrompt + size + " --image " + dir + "/nope.png" + out, dir,
                 {"--image", dir + "/nope.png", "does not exist"});
  const std::string garbage = test::temp_dir() + "/garbage.png";
  { std::ofstream(garbage) << "GIF89a but not really"; }
  expect_refused(models_i2v() + kPrompt + size + " --image " + garbage + out, dir, {garbage, "cannot be decoded"});
  expect_refused(models_i2v() + kPrompt + size + image + " --boundary 1.5" + out, dir, {"--boundary 1.5"});
  expect_refused(models_i2v() + kPrompt + size + image + " --boundary -0.1" + out, dir, {"--boundary -0.1"});
  // fixtures/dit/i2v is another I2V DiT (dim 48, text_dim 24): the experts do not belong together.
  const std::string other = fixture("dit/i2v/wan_original.pth");
  expect_refused(models_i2v(i2v_fixture("high"), other) + kPrompt + size + image + out, dir,
                 {"do not belong together", i2v_fixture("high"), other});
  expect_refused(models_i2v(other, i2v_fixture("low")) + kPrompt + size + image + out, dir,
                 {"do not belong together", i2v_fixture("low"), other});
  expect_refused(models_i2v() + kPrompt + size + image + " --num-samples 0" + out, dir, {"--num-samples 0"});
  expect_refused(models_i2v() + kPrompt + size + image + " --num-samples -2" + out, dir, {"--num-samples -2"});
  // One expert alone, or experts with --dit.
  std::string high_only = models_i2v();
  high_only.erase(high_only.find(" --low-noise-dit"), std::string(" --low-noise-dit " + i2v_fixture("low")).size());
  expect_refused(high_only + kPrompt + size + image + out, dir, {"--low-noise-dit"});
  expect_refused(models_i2v() + " --dit " + fixture("generate/dit") + kPrompt + size + image + out, dir,
                 {"exclude each other"});
  // A T2V DiT with an image: its 16 input channels cannot take the condition.
  const std::string t2v = "generate --dit " + fixture("generate/dit") + " --vae " +
                          fixture("vae/diffusion_pytorch_model.safetensors") + " --text-encoder " +
                          fixture("umt5/hf") + " --tokenizer " + fixture("umt5/tokenizer") + " --device cpu";
  expect_refused(t2v + kPrompt + size + image + out, dir, {"in_dim 16", "I2V needs in_dim"});
  expect_refused(t2v + kPrompt + size + " --boundary 0.5" + out, dir, {"--boundary"});
  expect_refused(t2v + kPrompt + size + " --adaptive-resolution" + out, dir, {"--adaptive-resolution needs --image"});
  expect_refused(t2v + kPrompt + size + " --num-samples 0" + out, dir, {"--num-samples 0"});
  expect_refused(t2v + kPrompt + size + " --offload disk" + out, dir, {"--offload"});
  expect_refused(t2v + kPrompt + size + " --model Wan2.2-A14B" + out, dir, {"Wan2.2-A14B"});
  // The tiny experts are not the published A14B size.
  expect_refused(models_i2v() + kPrompt + size + image + " --model Wan2.2-A14B" + out, dir,
                 {"Wan2.2-I2V-A14B", "dim 5120", i2v_fixture("high")});
  // Samples: each name is checked before anything runs.
  expect_refused(models_i2v() + kPrompt + size + image + " --num-samples 2 -o " + dir + "/missing/x.mp4", dir,
                 {"does not exist"});
}

}  // namespace
}  // namespace td
