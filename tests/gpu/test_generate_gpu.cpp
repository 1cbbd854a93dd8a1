// `turbodiff generate --device cuda` on the tiny models of the CPU test
// (tests/cpu/test_generate.cpp): the text encoder and DiT run on the GPU in
// bf16, the VAE on the CPU. Checked against the CPU f32 run of the same seed
// (--ode, so both follow the same deterministic path) on the decoded frames.
#include <gtest/gtest.h>
#include <png.h>

#include <cmath>
#include <cstdio>
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
                           "--json --seed " + std::to_string(seed);
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

}  // namespace
}  // namespace td
