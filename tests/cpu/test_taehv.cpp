// The TAEHV tiny decoder (issue 8, previews): its CPU ops against direct
// formulas, the decoder against a PyTorch implementation of TAEHV on tiny
// random weights in taew2_1.pth's layout (fixtures/taehv,
// scripts/make_taehv_fixtures.py), the loader's errors, chunking, and
// `turbodiff vae decode --decoder taehv` / `turbodiff info`.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "harness/harness.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "kernels/conv/taehv_cl.h"
#include "models/detect.h"
#include "models/taehv/taehv.h"
#include "ops/taehv.h"

namespace td {
namespace {

namespace fs = std::filesystem;
using models::taehv::TaehvDecoder;
using models::taehv::TaehvRunOptions;

std::string fixture(const std::string& rel) { return test::source_dir() + "/fixtures/taehv/" + rel; }
const std::string kPth = "taew2_1_tiny.pth";
const std::string kSafetensors = "taew2_1_tiny.safetensors";

std::map<std::string, Tensor> read_io() {
  std::map<std::string, Tensor> m;
  for (const auto& [n, t] : io::read_safetensors(fixture("decode_io.safetensors")).tensors) m[n] = t.clone();
  return m;
}

TEST(TaehvOps, PointwiseMatchesFormulas) {
  for (const int64_t n : {int64_t(1), int64_t(37), int64_t(4099)}) {
    const Tensor x = test::randn_tensor({n}, DType::F32, 4.0f);
    const Tensor r = test::randn_tensor({n}, DType::F32, 2.0f);
    const std::vector<float> xv = x.to_f32_vector(), rv = r.to_f32_vector();
    for (int op = 0; op < 3; ++op) {
      Tensor y = x.clone();
      if (op == 0) ops::relu_(y);
      else if (op == 1) ops::tanh_clamp3_(y);
      else ops::add_relu_(y, r);
      std::vector<double> ref(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        ref[size_t(i)] = op == 0 ? std::max(double(xv[i]), 0.0)
                         : op == 1 ? 3.0 * std::tanh(double(xv[i]) / 3.0)
                                   : std::max(double(xv[i]) + rv[i], 0.0);
      const std::vector<float> yv = y.to_f32_vector();
      TD_EXPECT_CLOSE(test::compare(std::vector<double>(yv.begin(), yv.end()), ref), 1e-6, 0.999999);
    }
  }
  // TanhClamp3 bounds: |y| < 3.
  Tensor big = test::randn_tensor({64}, DType::F32, 1000.0f);
  ops::tanh_clamp3_(big);
  for (float f : big.to_f32_vector()) EXPECT_LE(std::fabs(f), 3.0f);
}

TEST(TaehvOps, MemblockInputShiftsFrames) {
  const int64_t t = 3, h = 5, w = 3, c = 7;
  const Tensor x = test::randn_tensor({1, t, h, w, c}, DType::F32);
  const Tensor prev = test::randn_tensor({1, 1, h, w, c}, DType::F32);
  const std::vector<float> xv = x.to_f32_vector(), pv = prev.to_f32_vector();
  for (const bool with_prev : {false, true}) {
    const Tensor y = ops::memblock_input_cl(x, with_prev ? prev : Tensor());
    ASSERT_EQ(y.shape(), Shape({1, t, h, w, 2 * c}));
    const std::vector<float> yv = y.to_f32_vector();
    for (int64_t f = 0; f < t; ++f)
      for (int64_t p = 0; p < h * w; ++p)
        for (int64_t k = 0; k < 2 * c; ++k) {
          const float got = yv[size_t(((f * h * w) + p) * 2 * c + k)];
          float want;
          if (k < c) want = xv[size_t((f * h * w + p) * c + k)];
          else if (f > 0) want = xv[size_t(((f - 1) * h * w + p) * c + k - c)];
          else want = with_prev ? pv[size_t(p * c + k - c)] : 0.f;
          ASSERT_EQ(got, want) << f << " " << p << " " << k;
        }
  }
  // The kernel refuses an empty channel dim.
  std::vector<float> buf(8);
  EXPECT_EQ(kernels::taehv_memblock_input_cpu(buf.data(), nullptr, 1, 1, 0, buf.data()),
            kernels::Status::InvalidArgument);
}

TEST(Taehv, LoadsBothFormatsAndCutsTGrow) {
  const auto p = models::taehv::load_taehv(fixture(kPth));
  const auto s = models::taehv::load_taehv(fixture(kSafetensors));
  EXPECT_TRUE(p.has_encoder);
  EXPECT_EQ(p.config.latent_channels, 16);
  EXPECT_EQ(p.config.n_f, (std::array<int64_t, 4>{12, 8, 8, 4}));
  ASSERT_EQ(p.tensors.size(), s.tensors.size());
  for (const auto& [n, t] : p.tensors) {
    ASSERT_TRUE(s.tensors.count(n)) << n;
    EXPECT_EQ(test::compare(t, s.tensors.at(n)).max_abs, 0.0) << n;
  }
  // decoder.7.conv.weight is stored with 24 rows (stride-2 trained); the stride-1 TGrow keeps the last 12.
  const Tensor& w7 = p.tensors.at("decoder.7.conv.weight");
  EXPECT_EQ(w7.shape(), Shape({12, 12, 1, 1}));
  const io::TensorFile raw = io::read_tensor_file(fixture(kPth));
  const Tensor last = raw.find("decoder.7.conv.weight")->slice(0, 12, 24).contiguous();
  EXPECT_EQ(test::compare(w7, last).max_abs, 0.0);
  EXPECT_EQ(p.config.frames_out(21), 81);
}

TEST(Taehv, DecodeMatchesPyTorch) {
  auto io = read_io();
  for (const std::string& file : {kPth, kSafetensors}) {
    const TaehvDecoder dec(models::taehv::load_taehv(fixture(file)));
    const Tensor video = dec.decode(io["latent"]);
    ASSERT_EQ(video.shape(), io["video"].shape()) << file;
    TD_EXPECT_CLOSE(test::compare(video, io["video"]), 1e-5, 0.99999);
    const Tensor video1 = dec.decode(io["latent1"]);
    ASSERT_EQ(video1.shape(), io["video1"].shape()) << file;
    TD_EXPECT_CLOSE(test::compare(video1, io["video1"]), 1e-5, 0.99999);
  }
}

TEST(Taehv, ChunkingDoesNotChangeTheResult) {
  const TaehvDecoder dec(models::taehv::load_taehv(fixture(kPth)));
  const Tensor latent = test::randn_tensor({1, 16, 5, 3, 2}, DType::F32);
  TaehvRunOptions all;
  all.latent_frames_per_chunk = 0;
  const Tensor ref = dec.decode(latent, all);
  ASSERT_EQ(ref.size(2), 17);
  for (const int64_t chunk : {1, 2, 3}) {
    TaehvRunOptions o;
    o.latent_frames_per_chunk = chunk;
    EXPECT_LE(test::compare(dec.decode(latent, o), ref).rel_l2, 1e-6) << "chunk " << chunk;
  }
  // Causal: the first two latents alone give the first 5 frames.
  const Tensor head = dec.decode(latent.slice(2, 0, 2).contiguous(), all);
  ASSERT_EQ(head.size(2), 5);
  EXPECT_LE(test::compare(head, ref.slice(2, 0, 5).contiguous()).rel_l2, 1e-6);
  // Within [-1, 1].
  for (float f : ref.to_f32_vector()) ASSERT_TRUE(f >= -1.f && f <= 1.f) << f;
}

std::vector<std::pair<std::string, Tensor>> fixture_tensors() {
  return io::read_tensor_file(fixture(kSafetensors)).tensors;
}

std::string load_error(const std::vector<std::pair<std::string, Tensor>>& ts) {
  try {
    models::taehv::match_taehv_tensors(ts, "test.pth");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Taehv, LoaderErrors) {
  auto ts = fixture_tensors();
  // A missing MemBlock tensor is named.
  auto missing = ts;
  std::erase_if(missing, [](const auto& p) { return p.first == "decoder.10.conv.2.bias"; });
  EXPECT_NE(load_error(missing).find("missing tensor(s): decoder.10.conv.2.bias"), std::string::npos)
      << load_error(missing);
  // An unexpected decoder tensor.
  auto extra = ts;
  extra.emplace_back("decoder.30.weight", Tensor::zeros({1}, DType::F32));
  EXPECT_NE(load_error(extra).find("unexpected: decoder.30.weight"), std::string::npos) << load_error(extra);
  // The super variant and the patch-size-2 decoders are refused by name.
  auto super = ts;
  super.emplace_back("decoder.0.weight", Tensor::zeros({12, 16, 1, 1}, DType::F32));
  EXPECT_NE(load_error(super).find("'super' decoder"), std::string::npos) << load_error(super);
  auto patch2 = ts;
  for (auto& [n, t] : patch2)
    if (n == "decoder.22.weight") t = Tensor::zeros({12, 4, 3, 3}, DType::F32);
  EXPECT_NE(load_error(patch2).find("pixel shuffle"), std::string::npos) << load_error(patch2);
  // Not a TAEHV checkpoint at all.
  EXPECT_NE(load_error({{"blocks.0.weight", Tensor::zeros({1}, DType::F32)}}).find("not a TAEHV checkpoint"),
            std::string::npos);
  // A latent with the wrong channel count.
  const TaehvDecoder dec(models::taehv::load_taehv(fixture(kPth)));
  EXPECT_THROW(dec.decode(test::randn_tensor({1, 8, 2, 2, 2}, DType::F32)), Error);
}

TEST(Taehv, DetectedByInfo) {
  const models::ModelDetection d = models::detect_model(io::read_tensor_file(fixture(kPth)));
  EXPECT_EQ(d.kind, models::ModelKind::TAEHV);
  EXPECT_NE(d.description.find("TAEHV"), std::string::npos) << d.description;
  const auto r = test::run_cli("info " + fixture(kSafetensors));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("TAEHV"), std::string::npos) << r.out;
}

TEST(TaehvCli, VaeDecode) {
  // Its own folder: test::temp_dir() is shared by every test of the process.
  const std::string dir = test::temp_dir() + "/taehv_vae_decode";
  fs::create_directories(dir);
  auto io = read_io();
  io::write_safetensors(dir + "/latent.safetensors", {{"latent", io["latent"]}});
  auto r = test::run_cli("vae decode --decoder taehv --vae " + fixture(kPth) + " --inputs " + dir +
                         "/latent.safetensors --out " + dir + "/video.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("TAEHV"), std::string::npos) << r.out;
  const io::TensorFile v = io::read_safetensors(dir + "/video.safetensors");
  ASSERT_NE(v.find("video"), nullptr);
  TD_EXPECT_CLOSE(test::compare(*v.find("video"), io["video"]), 1e-5, 0.99999);
  // TAEHV has no encoder here and no tiling: usage errors, no output.
  r = test::run_cli("vae encode --decoder taehv --vae " + fixture(kPth) + " --inputs " + dir +
                    "/latent.safetensors --out " + dir + "/x.safetensors");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  r = test::run_cli("vae decode --decoder taehv --vae-tiling --vae " + fixture(kPth) + " --inputs " + dir +
                    "/latent.safetensors --out " + dir + "/y.safetensors");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--vae-tiling"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir + "/x.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/y.safetensors"));
}

std::string generate_args(const std::string& out) {
  const std::string f = test::source_dir() + "/fixtures/";
  return "generate --dit " + f + "generate/dit --vae " + f + "vae/diffusion_pytorch_model.safetensors --text-encoder " +
         f + "umt5/hf --tokenizer " + f + "umt5/tokenizer --device cpu --prompt 'a cat' --seed 3 --num-frames 5 "
         "--width 64 --height 48 --num-steps 1 -o " + out;
}

TEST(TaehvCli, GenerateWithPreviewDecoder) {
  const std::string dir = test::temp_dir() + "/taehv_generate";
  fs::create_directories(dir + "/wan");
  fs::create_directories(dir + "/taehv");
  auto r = test::run_cli(generate_args(dir + "/taehv/f_%04d.png") + " --preview-decoder taehv --taehv " +
                         fixture(kPth) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"decoder\": \"taehv\""), std::string::npos) << r.out;
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir + "/taehv")) ++n;
  EXPECT_EQ(n, 5u);
  r = test::run_cli(generate_args(dir + "/wan/f_%04d.png") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"decoder\": \"wan-vae\""), std::string::npos) << r.out;
  // Another decoder, other frames (same seed, same latent).
  const auto bytes = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_NE(bytes(dir + "/taehv/f_0002.png"), bytes(dir + "/wan/f_0002.png"));
  // Flag pairing: usage errors, nothing written.
  r = test::run_cli(generate_args(dir + "/x.mp4") + " --preview-decoder taehv");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--taehv"), std::string::npos) << r.err;
  r = test::run_cli(generate_args(dir + "/x.mp4") + " --taehv " + fixture(kPth));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  // A file that is not TAEHV: a clear error naming it, no output.
  r = test::run_cli(generate_args(dir + "/x.mp4") + " --preview-decoder taehv --taehv " + test::source_dir() +
                    "/fixtures/vae/diffusion_pytorch_model.safetensors");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("not a TAEHV checkpoint"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir + "/x.mp4"));
}

}  // namespace
}  // namespace td
