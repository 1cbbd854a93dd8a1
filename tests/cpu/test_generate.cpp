// `turbodiff generate` end to end on tiny random models (fixtures/umt5,
// fixtures/generate/dit made by scripts/make_generate_fixtures.py with
// text_dim = the umT5's d_model, fixtures/vae): the files it writes, its
// determinism, and its refusals of bad input before any output exists.
#include <gtest/gtest.h>
#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>

#include "harness/harness.h"
#include "io/video_writer.h"

namespace td {
namespace {
namespace fs = std::filesystem;

std::string fixture(const std::string& rel) { return test::source_dir() + "/fixtures/" + rel; }

// A random prompt: the test must not depend on one particular text.
std::string random_prompt() {
  static const char* words[] = {"a", "cat", "rides", "bicycle", "through", "neon", "city", "at", "night", "slowly",
                                "red", "ocean", "waves", "under", "storm"};
  std::uniform_int_distribution<int> pick(0, int(std::size(words)) - 1), len(3, 12);
  std::string s;
  const int n = len(test::rng());
  for (int i = 0; i < n; ++i) s += std::string(i ? " " : "") + words[pick(test::rng())];
  return s;
}

std::string models(const std::string& dit = fixture("generate/dit")) {
  return "generate --dit " + dit + " --vae " + fixture("vae/diffusion_pytorch_model.safetensors") +
         " --text-encoder " + fixture("umt5/hf") + " --tokenizer " + fixture("umt5/tokenizer") + " --device cpu";
}

std::string small(const std::string& prompt, uint64_t seed, int64_t frames = 5, int64_t w = 64, int64_t h = 48) {
  return " --prompt '" + prompt + "' --seed " + std::to_string(seed) + " --num-frames " + std::to_string(frames) +
         " --width " + std::to_string(w) + " --height " + std::to_string(h);
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A fresh empty folder (test::temp_dir() is one per process and also holds run_cli's captures).
std::string fresh_dir() {
  static int n = 0;
  const std::string d = test::temp_dir() + "/case" + std::to_string(n++);
  fs::create_directories(d);
  return d;
}

// Files in dir (names), to show no partial / temporary file stays behind.
std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  return names;
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    pclose(p);
  }
  return out;
}

TEST(Generate, Mp4ReadByFfprobe) {
  if (std::system("command -v ffprobe > /dev/null 2>&1") != 0) GTEST_SKIP() << "ffprobe not installed (Debian ffmpeg)";
  const std::string dir = fresh_dir(), out = dir + "/clip.mp4";
  // 9 frames -> 3 latent frames; 80x48 is not square so width/height swaps show.
  const auto r = test::run_cli(models() + small(random_prompt(), test::rng()(), 9, 80, 48) + " --num-steps 2 --json -o " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"frames\": 9"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"diffusion\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"peak_gpu_bytes\": 0"), std::string::npos) << r.out;
  EXPECT_EQ(listing(dir), std::vector<std::string>{"clip.mp4"});
  const std::string probe = run_capture(
      "ffprobe -v error -count_frames -select_streams v:0 -show_entries "
      "stream=codec_name,width,height,pix_fmt,r_frame_rate,nb_read_frames -of default=noprint_wrappers=1 " + out);
  EXPECT_NE(probe.find("codec_name=h264"), std::string::npos) << probe;
  EXPECT_NE(probe.find("width=80"), std::string::npos) << probe;
  EXPECT_NE(probe.find("height=48"), std::string::npos) << probe;
  EXPECT_NE(probe.find("pix_fmt=yuv420p"), std::string::npos) << probe;
  EXPECT_NE(probe.find("r_frame_rate=16/1"), std::string::npos) << probe;
  EXPECT_NE(probe.find("nb_read_frames=9"), std::string::npos) << probe;
}

TEST(Generate, PngPatternDeterministicPerSeed) {
  const std::string prompt = random_prompt();
  const uint64_t seed = test::rng()();
  auto frames_of = [&](uint64_t s, const std::string& extra) {
    const std::string dir = fresh_dir();
    const auto r = test::run_cli(models() + small(prompt, s) + extra + " --quiet -o " + dir + "/f_%04d.png");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(listing(dir).size(), 5u) << "5 frames expected in " << dir;
    std::vector<std::string> frames;
    for (int i = 0; i < 5; ++i) {
      const std::string name = io::png_frame_name(dir + "/f_%04d.png", i);
      EXPECT_TRUE(fs::exists(name)) << name;
      frames.push_back(read_bytes(name));
      EXPECT_EQ(frames.back().substr(1, 3), "PNG") << name;
    }
    return frames;
  };
  const auto a = frames_of(seed, "");
  const auto b = frames_of(seed, "");
  const auto c = frames_of(seed + 1, "");
  EXPECT_EQ(a, b) << "same seed, same prompt: frames must be identical";
  EXPECT_NE(a, c) << "another seed must give another video";
  // The teacher path (Euler, guidance with a negative prompt) runs too.
  const auto d = frames_of(seed, " --sampler euler --steps 2 --guidance 3 --negative-prompt 'blurry'");
  EXPECT_NE(a, d);
  // SLA on the CPU path: keeping every key block of a DiT without proj_l is exact
  // attention, so the frames differ from the original ones at most by rounding.
  const auto e = frames_of(seed, " --attention sla --sla-topk 1");
  ASSERT_EQ(e.size(), a.size());
}

// The writer alone: a random video written as PNG frames reads back as the
// [-1, 1] -> [0, 255] mapping (rounded, clamped), exactly.
TEST(VideoWriter, PngFramesRoundTrip) {
  const int64_t frames = 3, h = 18, w = 34;  // awkward even sizes
  Tensor video = Tensor::empty({3, frames, h, w}, DType::F32);
  std::uniform_real_distribution<float> u(-1.2f, 1.2f);  // some values outside [-1, 1] to check the clamp
  for (int64_t i = 0; i < video.numel(); ++i) video.data<float>()[i] = u(test::rng());
  const std::string dir = fresh_dir(), pattern = dir + "/v%03d.png";
  io::write_video(pattern, video);
  EXPECT_EQ(listing(dir).size(), size_t(frames));
  for (int64_t f = 0; f < frames; ++f) {
    png_image image{};
    image.version = PNG_IMAGE_VERSION;
    ASSERT_TRUE(png_image_begin_read_from_file(&image, io::png_frame_name(pattern, f).c_str()));
    image.format = PNG_FORMAT_RGB;
    std::vector<uint8_t> rgb(PNG_IMAGE_SIZE(image), 0xAB);  // poisoned
    ASSERT_TRUE(png_image_finish_read(&image, nullptr, rgb.data(), 0, nullptr));
    ASSERT_EQ(int64_t(image.width), w);
    ASSERT_EQ(int64_t(image.height), h);
    int mismatches = 0;
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t i = 0; i < h * w; ++i) {
        const float v = video.data<float>()[(c * frames + f) * h * w + i];
        const long want = std::lround(std::clamp((v + 1.0f) * 127.5f, 0.0f, 255.0f));
        mismatches += rgb[size_t(i * 3 + c)] != want;
      }
    EXPECT_EQ(mismatches, 0) << "frame " << f;  // tolerance: exact (8-bit PNG is lossless)
  }
}

TEST(VideoWriter, RefusesOddSizesWithoutOutput) {
  const std::string dir = fresh_dir();
  Tensor video = Tensor::zeros({3, 2, 15, 16}, DType::F32);
  EXPECT_THROW(io::write_video(dir + "/odd.mp4", video), Error);
  EXPECT_THROW(io::write_video(dir + "/odd_%d.png", video), Error);
  EXPECT_TRUE(listing(dir).empty());
}

TEST(Generate, PngFrameNames) {
  EXPECT_EQ(io::png_frame_name("out/%04d.png", 7), "out/0007.png");
  EXPECT_EQ(io::png_frame_name("f%d_100%%.png", 12), "f12_100%.png");
  EXPECT_THROW(io::png_frame_name("f%s.png", 1), Error);
  EXPECT_THROW(io::video_output_kind("f_%d_%d.png"), Error);
  EXPECT_THROW(io::video_output_kind("video.avi"), Error);
}

// Each bad request: non-zero exit, a message naming the fault, no file written.
void expect_refused(const std::string& args, const std::string& dir, const std::string& needle) {
  const auto r = test::run_cli(args);
  EXPECT_NE(r.exit_code, 0) << args;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
  EXPECT_TRUE(listing(dir).empty()) << "output left behind for: " << args;
}

TEST(Generate, BadInputsRefusedWithoutOutput) {
  const std::string dir = fresh_dir(), out = " -o " + dir + "/bad.mp4";
  const std::string p = random_prompt();
  expect_refused(models() + small(p, 1, 6) + out, dir, "4k+1");
  expect_refused(models() + small(p, 1, 5, 100, 100) + out, dir, "multiples of 16");
  expect_refused(models() + small(p, 1) + " -o " + dir + "/no-such-dir/x.mp4", dir, "does not exist");
  expect_refused(models() + small(p, 1) + " -o " + dir + "/x.avi", dir, ".mp4");
  // fixtures/dit/t2v has text_dim 40; the umT5 fixture has d_model 64.
  expect_refused(models(fixture("dit/t2v")) + small(p, 1) + out, dir, "text_dim 40");
  expect_refused(models(fixture("dit/t2v")) + small(p, 1) + out, dir, fixture("umt5/hf"));
  // fixtures/dit/i2v takes 36 input channels; the VAE has z_dim 16.
  expect_refused(models(fixture("dit/i2v")) + small(p, 1) + out, dir, "z_dim 16");
  expect_refused(models() + small(p, 1) + " --num-steps 5" + out, dir, "--num-steps");
  std::string on_cuda = models();
  on_cuda.replace(on_cuda.find("--device cpu"), 12, "--device cuda");
  // Refused either for SLA on CUDA (with a GPU) or for the missing GPU (without one).
  expect_refused(on_cuda + small(p, 1) + " --attention sagesla" + out, dir, "CUDA");
  expect_refused(models() + small(p, 1) + " --sla-topk 0.5" + out, dir, "--sla-topk");
  expect_refused(models() + small(p, 1) + " --attention sla --sla-topk 0" + out, dir, "--sla-topk");
  expect_refused(models() + small(p, 1) + " --image x.png" + out, dir, "--image x.png does not exist");
  expect_refused(models() + small(p, 1) + " --model Wan2.1-14B" + out, dir, "dim 5120");
}

TEST(Generate, LongPromptTruncatedWithWarning) {
  std::string prompt;
  for (int i = 0; i < 300; ++i) prompt += random_prompt() + " ";
  const std::string dir = fresh_dir();
  const auto r = test::run_cli(models() + small(prompt, 3) + " --num-steps 1 --json -o " + dir + "/long.mp4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("\"prompt_tokens\": 512"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(dir + "/long.mp4"));
}

}  // namespace
}  // namespace td
