// `turbodiff generate --device cuda` on the tiny models of the CPU tests
// (tests/cpu/test_generate.cpp, test_generate_i2v.cpp): checked against the
// CPU f32 run of the same seed (--ode, so both follow the same deterministic
// path) on the decoded frames.
// - T2V: text encoder and DiT on the GPU in bf16, the VAE on the CPU
//   (--vae-device cpu), so the bar measures the DiT path alone.
// - I2V: the two experts and the VAE (encode and decode) on the GPU.
// - --offload none / model with two I2V samples: the same frames, the plan's
//   moves in the trace, and the model policy's lower diffusion peak.
#include <gtest/gtest.h>
#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "harness/harness.h"
#include "io/video_writer.h"

namespace td {
namespace {

std::string fixture(const std::string& rel) { return test::source_dir() + "/fixtures/" + rel; }

// RGB bytes of a PNG written by io::write_video (8-bit RGB).
std::vector<uint8_t> read_png_rgb(const std::string& path, int64_t& w, int64_t& h) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, path.c_str())) return {};
  image.format = PNG_FORMAT_RGB;
  std::vector<uint8_t> rgb(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, rgb.data(), 0, nullptr)) return {};
  w = image.width;
  h = image.height;
  return rgb;
}

TEST(GenerateGpu, CudaMatchesCpuFrames) {
  TD_REQUIRE_GPU();
  const uint64_t seed = test::rng()();
  const std::string base = "generate --dit " + fixture("generate/dit") + " --vae " +
                           fixture("vae/diffusion_pytorch_model.safetensors") + " --text-encoder " +
                           fixture("umt5/hf") + " --tokenizer " + fixture("umt5/tokenizer") +
                           " --prompt 'a red bicycle in the rain' --num-frames 9 --width 80 --height 48 --ode "
                           "--vae-device cpu --json --seed " + std::to_string(seed);
  const std::string dir = test::temp_dir();
  const auto gpu = test::run_cli(base + " --device cuda -o " + dir + "/gpu_%04d.png");
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  EXPECT_NE(gpu.out.find("\"device\": \"cuda:0\""), std::string::npos) << gpu.out;
  EXPECT_EQ(gpu.out.find("\"peak_gpu_bytes\": 0,"), std::string::npos) << "peak GPU memory not measured: " << gpu.out;
  EXPECT_EQ(gpu.out.find("\"peak_gpu_bytes\": 0}"), std::string::npos) << "peak GPU memory not measured: " << gpu.out;
  const auto cpu = test::run_cli(base + " --device cpu -o " + dir + "/cpu_%04d.png");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  // bf16 linears and latents on the GPU vs f32 on the CPU through 4 steps of a
  // random 2-layer DiT: a mean absolute difference of 6/255 per channel is the
  // bar (not yet measured on a GPU; the VAE and PNG quantisation are shared).
  for (int i = 0; i < 9; ++i) {
    int64_t wg = 0, hg = 0, wc = 0, hc = 0;
    const auto g = read_png_rgb(io::png_frame_name(dir + "/gpu_%04d.png", i), wg, hg);
    const auto c = read_png_rgb(io::png_frame_name(dir + "/cpu_%04d.png", i), wc, hc);
    ASSERT_FALSE(g.empty() || c.empty()) << "frame " << i << " missing or unreadable";
    ASSERT_EQ(wg, 80);
    ASSERT_EQ(hg, 48);
    ASSERT_EQ(g.size(), c.size());
    double sum = 0;
    for (size_t k = 0; k < g.size(); ++k) sum += std::abs(int(g[k]) - int(c[k]));
    EXPECT_LE(sum / double(g.size()), 6.0) << "frame " << i;
  }
}

std::string i2v_models() {
  return "generate --high-noise-dit " + fixture("generate/i2v/high") + " --low-noise-dit " +
         fixture("generate/i2v/low") + " --image " + fixture("generate/i2v/image.png") + " --vae " +
         fixture("vae/diffusion_pytorch_model.safetensors") + " --text-encoder " + fixture("umt5/hf") +
         " --tokenizer " + fixture("umt5/tokenizer") +
         " --prompt 'A cat sits on a red chair in the sun.' --width 64 --height 48 --num-frames 9 --ode --json";
}

// Mean absolute difference in 8-bit levels between two runs' PNG frames.
double mean_level_diff(const std::string& a, const std::string& b, int frames, int64_t w, int64_t h,
                       int* worst = nullptr) {
  double sum = 0;
  size_t n = 0;
  for (int i = 0; i < frames; ++i) {
    int64_t wa = 0, ha = 0, wb = 0, hb = 0;
    const auto x = read_png_rgb(io::png_frame_name(a, i), wa, ha);
    const auto y = read_png_rgb(io::png_frame_name(b, i), wb, hb);
    EXPECT_FALSE(x.empty() || y.empty()) << "frame " << i << " missing: " << a << " / " << b;
    EXPECT_EQ(wa, w);
    EXPECT_EQ(ha, h);
    if (x.size() != y.size() || x.empty()) return 1e9;
    for (size_t k = 0; k < x.size(); ++k) {
      const int d = std::abs(int(x[k]) - int(y[k]));
      if (worst) *worst = std::max(*worst, d);
      sum += d;
    }
    n += x.size();
  }
  return sum / double(n);
}

// The number after `"key": ` inside the object that follows `"object": {`.
size_t json_number_in(const std::string& json, const std::string& object, const std::string& key) {
  const size_t o = json.find("\"" + object + "\": {");
  if (o == std::string::npos) return 0;
  const size_t k = json.find("\"" + key + "\": ", o);
  if (k == std::string::npos) return 0;
  return std::strtoull(json.c_str() + k + key.size() + 4, nullptr, 10);
}

TEST(GenerateGpu, I2VCudaMatchesCpuFrames) {
  TD_REQUIRE_GPU();
  const std::string base = i2v_models() + " --seed " + std::to_string(test::rng()() % 100000);
  const std::string dir = test::temp_dir();
  const auto gpu = test::run_cli(base + " --device cuda -o " + dir + "/i2v_gpu_%04d.png");
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  EXPECT_NE(gpu.out.find("\"vae_device\": \"cuda:0\""), std::string::npos) << gpu.out;
  EXPECT_NE(gpu.out.find("\"step_experts\": [\"high\", \"high\", \"low\", \"low\"]"), std::string::npos) << gpu.out;
  EXPECT_GT(json_number_in(gpu.out, "peak_gpu_bytes_by_stage", "image"), 0u) << "VAE encode not on the GPU: " << gpu.out;
  EXPECT_GT(json_number_in(gpu.out, "peak_gpu_bytes_by_stage", "vae"), 0u) << "VAE decode not on the GPU: " << gpu.out;
  const auto cpu = test::run_cli(base + " --device cpu -o " + dir + "/i2v_cpu_%04d.png");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  // BF16 everywhere on the GPU (umT5, both experts, the VAE encode of the
  // condition and the decode) against f32 on the CPU: a mean of 8 levels per
  // channel is the bar (not yet measured on a GPU).
  EXPECT_LE(mean_level_diff(dir + "/i2v_gpu_%04d.png", dir + "/i2v_cpu_%04d.png", 9, 64, 48), 8.0);
}

TEST(GenerateGpu, OffloadPoliciesSameFramesLowerPeak) {
  TD_REQUIRE_GPU();
  const std::string base = i2v_models() + " --device cuda --num-samples 2 --seed " +
                           std::to_string(test::rng()() % 100000);
  const std::string dir = test::temp_dir();
  const auto none = test::run_cli(base + " --offload none -o " + dir + "/off_none_%04d.png");
  ASSERT_EQ(none.exit_code, 0) << none.err;
  const auto model = test::run_cli(base + " --offload model -o " + dir + "/off_model_%04d.png");
  ASSERT_EQ(model.exit_code, 0) << model.err;
  const auto automatic = test::run_cli(base + " -o " + dir + "/off_auto_%04d.png");
  ASSERT_EQ(automatic.exit_code, 0) << automatic.err;
  // Tiny models fit on any GPU: auto keeps everything resident.
  EXPECT_NE(automatic.out.find("\"offload\": \"none\""), std::string::npos) << automatic.out;
  EXPECT_NE(model.out.find("offload high_noise_dit, stage low_noise_dit, upload low_noise_dit"), std::string::npos)
      << model.out;
  EXPECT_EQ(none.out.find("offload "), std::string::npos) << none.out;
  for (int k = 0; k < 2; ++k) {
    int worst = 0;
    const std::string suffix = "_" + std::to_string(k) + ".png";
    const double mean = mean_level_diff(dir + "/off_none_%04d" + suffix, dir + "/off_model_%04d" + suffix, 9, 64,
                                        48, &worst);
    // Moving a model between host and GPU copies its bytes: the frames must
    // not change beyond run-to-run kernel nondeterminism (1 level).
    EXPECT_LE(worst, 1) << "sample " << k << " (mean " << mean << ")";
  }
  // none holds both experts from the first switch on; model holds one.
  const size_t peak_none = json_number_in(none.out, "peak_gpu_bytes_by_stage", "diffusion");
  const size_t peak_model = json_number_in(model.out, "peak_gpu_bytes_by_stage", "diffusion");
  EXPECT_GT(peak_model, 0u) << model.out;
  EXPECT_GT(peak_none, peak_model) << "none " << peak_none << " B, model " << peak_model << " B";
  std::printf("[ generate ] I2V tiny, 2 samples: diffusion peak none %zu B, model %zu B\n", peak_none, peak_model);
}

// Two samples as one DiT batch on CUDA (B = 2 through every GPU op) against
// the same samples one after another.
TEST(GenerateGpu, SampleBatchMatchesLoop) {
  TD_REQUIRE_GPU();
  const std::string base = i2v_models() + " --device cuda --num-samples 2 --seed " +
                           std::to_string(test::rng()() % 100000);
  const std::string dir = test::temp_dir();
  const auto loop = test::run_cli(base + " -o " + dir + "/loop_%04d.png");
  ASSERT_EQ(loop.exit_code, 0) << loop.err;
  const auto batched = test::run_cli(base + " --sample-batch 0 -o " + dir + "/batch_%04d.png");
  ASSERT_EQ(batched.exit_code, 0) << batched.err;
  EXPECT_NE(batched.out.find("\"sample_batch\": 2"), std::string::npos) << batched.out;
  for (int k = 0; k < 2; ++k) {
    int worst = 0;
    const std::string suffix = "_" + std::to_string(k) + ".png";
    const double mean =
        mean_level_diff(dir + "/loop_%04d" + suffix, dir + "/batch_%04d" + suffix, 9, 64, 48, &worst);
    // BF16 GEMMs of another M may round differently: a mean of 1 level is the bar.
    EXPECT_LE(mean, 1.0) << "sample " << k << " (worst " << worst << ")";
  }
}

}  // namespace
}  // namespace td
