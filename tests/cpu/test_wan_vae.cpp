// The Wan2.1 VAE (issue 8): its CPU ops against direct fp64 formulas, the
// decoder and encoder against diffusers' AutoencoderKLWan on a tiny random
// model (fixtures/vae, scripts/make_vae_fixtures.py) in both key layouts, the
// loader's errors, and `turbodiff vae` end to end.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "harness/harness.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "kernels/conv/conv.h"
#include "models/wan_vae/wan_vae.h"
#include "ops/conv.h"

namespace td {
namespace {

namespace fs = std::filesystem;
using models::wan_vae::WanVae;

std::string fixture(const std::string& rel) { return test::source_dir() + "/fixtures/vae/" + rel; }
const std::string kDiffusers = "diffusion_pytorch_model.safetensors";
const std::string kOriginal = "original/Wan2.1_VAE.pth";

// Direct fp64 convolution of x [B, Ci, T, H, W] (spatial zero pad per side, no temporal pad).
std::vector<double> conv_ref(const Tensor& x, const Tensor& w, const Tensor& b, const ops::ConvOptions& o,
                             Shape* out_shape) {
  const int64_t B = x.size(0), ci = x.size(1), t = x.size(2), h = x.size(3), wd = x.size(4);
  const int64_t co = w.size(0), kt = w.size(2), kh = w.size(3), kw = w.size(4);
  const int64_t ot = (t - kt) / o.stride_t + 1, oh = (h + o.pad_top + o.pad_bottom - kh) / o.stride_h + 1,
                ow = (wd + o.pad_left + o.pad_right - kw) / o.stride_w + 1;
  *out_shape = {B, co, ot, oh, ow};
  const std::vector<float> xv = x.to_f32_vector(), wv = w.to_f32_vector();
  std::vector<double> y(size_t(B * co * ot * oh * ow));
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t c = 0; c < co; ++c)
      for (int64_t a = 0; a < ot; ++a)
        for (int64_t i = 0; i < oh; ++i)
          for (int64_t j = 0; j < ow; ++j) {
            double s = b.defined() ? b.item_f64(c) : 0.0;
            for (int64_t cc = 0; cc < ci; ++cc)
              for (int64_t dt = 0; dt < kt; ++dt)
                for (int64_t di = 0; di < kh; ++di)
                  for (int64_t dj = 0; dj < kw; ++dj) {
                    const int64_t yi = i * o.stride_h - o.pad_top + di, xj = j * o.stride_w - o.pad_left + dj;
                    if (yi < 0 || yi >= h || xj < 0 || xj >= wd) continue;
                    s += double(xv[(((bi * ci + cc) * t + a * o.stride_t + dt) * h + yi) * wd + xj]) *
                         wv[(((c * ci + cc) * kt + dt) * kh + di) * kw + dj];
                  }
            y[(((bi * co + c) * ot + a) * oh + i) * ow + j] = s;
          }
  return y;
}

std::vector<double> to_f64(const Tensor& t) {
  const std::vector<float> v = t.to_f32_vector();
  return {v.begin(), v.end()};
}

TEST(WanVaeOps, Conv3dMatchesDirectFormula) {
  struct Case {
    Shape x, w;
    ops::ConvOptions o;
    bool bias;
  };
  ops::ConvOptions down;
  down.stride_h = down.stride_w = 2;
  down.pad_bottom = down.pad_right = 1;
  ops::ConvOptions time2;
  time2.stride_t = 2;
  const std::vector<Case> cases = {
      {{2, 5, 4, 7, 9}, {6, 5, 3, 3, 3}, ops::ConvOptions::same_pad(1), true},  // causal 3x3x3 (padded in time by caller)
      {{1, 3, 3, 5, 11}, {7, 3, 1, 1, 1}, {}, true},                            // 1x1x1
      {{1, 4, 5, 3, 6}, {4, 4, 3, 1, 1}, time2, true},                          // downsample time_conv
      {{2, 6, 2, 9, 7}, {5, 6, 1, 3, 3}, down, false},                          // 2-D stride-2 downsample
      {{1, 3, 1, 1, 2}, {2, 3, 1, 3, 3}, ops::ConvOptions::same_pad(1), true},  // tinier than the kernel + pad
  };
  for (const Case& c : cases) {
    const Tensor x = test::randn_tensor(c.x, DType::F32), w = test::randn_tensor(c.w, DType::F32, 0.3f);
    const Tensor b = c.bias ? test::randn_tensor({c.w[0]}, DType::F32) : Tensor();
    Shape ref_shape;
    const std::vector<double> ref = conv_ref(x, w, b, c.o, &ref_shape);
    const Tensor y = ops::conv3d(x, w, b, c.o);
    ASSERT_EQ(y.shape(), ref_shape) << x.desc() << " * " << w.desc();
    TD_EXPECT_CLOSE(test::compare(to_f64(y), ref), 1e-6, 0.999999);
  }
  // 2-D op: one frame's worth of the same.
  const Tensor x2 = test::randn_tensor({3, 4, 6, 5}, DType::F32), w2 = test::randn_tensor({8, 4, 3, 3}, DType::F32);
  const Tensor b2 = test::randn_tensor({8}, DType::F32);
  Shape s;
  const auto ref2 = conv_ref(x2.view({3, 4, 1, 6, 5}), w2.view({8, 4, 1, 3, 3}), b2, ops::ConvOptions::same_pad(1), &s);
  const Tensor y2 = ops::conv2d(x2, w2, b2, ops::ConvOptions::same_pad(1));
  EXPECT_EQ(y2.shape(), (Shape{3, 8, 6, 5}));
  TD_EXPECT_CLOSE(test::compare(to_f64(y2), ref2), 1e-6, 0.999999);
}

TEST(WanVaeOps, Conv3dKernelWritesEveryOutputAndRejectsBadSizes) {
  // Many output positions and a wide K: several im2col blocks.
  const Tensor x = test::randn_tensor({40, 3, 37, 45}, DType::F32), w = test::randn_tensor({5, 40, 3, 3, 3}, DType::F32);
  Tensor y = Tensor::empty({5, 1, 37, 45}, DType::F32);
  test::poison(y);
  kernels::Conv3dParams p;
  p.x = x.data<float>();
  p.cin = 40, p.t = 3, p.h = 37, p.w = 45;
  p.weight = w.data<float>();
  p.cout = 5, p.kt = 3, p.kh = 3, p.kw = 3;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
  p.y = y.data<float>();
  ASSERT_EQ(kernels::conv3d_f32_cpu(p), kernels::Status::Ok);
  Shape s;
  const auto ref = conv_ref(x.view({1, 40, 3, 37, 45}), w, Tensor(), ops::ConvOptions::same_pad(1), &s);
  TD_EXPECT_CLOSE(test::compare(to_f64(y), ref), 1e-6, 0.999999);
  kernels::Conv3dParams bad = p;
  bad.t = 2;  // shorter than kt
  EXPECT_EQ(kernels::conv3d_f32_cpu(bad), kernels::Status::InvalidArgument);
  bad = p;
  bad.stride_h = 0;
  EXPECT_EQ(kernels::conv3d_f32_cpu(bad), kernels::Status::InvalidArgument);
  bad = p;
  bad.pad_left = -1;
  EXPECT_EQ(kernels::conv3d_f32_cpu(bad), kernels::Status::InvalidArgument);
  EXPECT_THROW(ops::conv3d(x.view({1, 40, 3, 37, 45}), test::randn_tensor({5, 39, 3, 3, 3}, DType::F32), Tensor()),
               Error);
}

TEST(WanVaeOps, UpsampleNearest2x) {
  const Tensor x = test::randn_tensor({2, 3, 2, 5, 7}, DType::F32);
  const Tensor y = ops::upsample_nearest2x(x);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 2, 10, 14}));
  const std::vector<float> xv = x.to_f32_vector(), yv = y.to_f32_vector();
  for (int64_t pl = 0; pl < 12; ++pl)
    for (int64_t i = 0; i < 10; ++i)
      for (int64_t j = 0; j < 14; ++j)
        ASSERT_EQ(yv[(pl * 10 + i) * 14 + j], xv[(pl * 5 + i / 2) * 7 + j / 2]) << pl << " " << i << " " << j;
}

TEST(WanVaeOps, ChannelRmsNorm) {
  for (const bool with_bias : {false, true}) {
    const int64_t B = 2, C = 13, P = 300;  // positions not a multiple of the kernel's run of 256
    Tensor x = test::randn_tensor({B, C, 3, 10, 10}, DType::F32, 2.0f);
    const Tensor g = test::randn_tensor({C, 1, 1, 1}, DType::F32), b = with_bias ? test::randn_tensor({C}, DType::F32) : Tensor();
    // One all-zero position: the 1e-12 floor keeps it finite (0 out, + bias).
    for (int64_t c = 0; c < C; ++c) x.data<float>()[c * P + 7] = 0.0f;
    const Tensor y = ops::channel_rms_norm(x, g, b);
    std::vector<double> ref(size_t(B * C * P));
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t p = 0; p < P; ++p) {
        double ss = 0;
        for (int64_t c = 0; c < C; ++c) ss += std::pow(double(x.data<float>()[(bi * C + c) * P + p]), 2);
        const double inv = 1.0 / std::max(std::sqrt(ss), 1e-12);
        for (int64_t c = 0; c < C; ++c)
          ref[(bi * C + c) * P + p] = x.data<float>()[(bi * C + c) * P + p] * inv * std::sqrt(double(C)) *
                                          g.data<float>()[c] + (with_bias ? b.data<float>()[c] : 0.0);
      }
    TD_EXPECT_CLOSE(test::compare(to_f64(y), ref), 1e-6, 0.999999);
  }
  EXPECT_THROW(ops::channel_rms_norm(test::randn_tensor({1, 4, 2}, DType::F32), test::randn_tensor({5}, DType::F32)),
               Error);
}

TEST(WanVaeOps, CudaTensorsAreUnsupported) {
  TD_REQUIRE_GPU();
  const Tensor x = test::randn_tensor({1, 2, 1, 4, 4}, DType::F32).to(Device::cuda(0));
  try {
    ops::conv3d(x, test::randn_tensor({2, 2, 1, 1, 1}, DType::F32), Tensor());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    EXPECT_NE(std::string(e.what()).find("channel-first VAE ops are the fp32 CPU path"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- model vs diffusers

std::map<std::string, Tensor> read_io(const std::string& name) {
  std::map<std::string, Tensor> m;
  for (const auto& [n, t] : io::read_safetensors(fixture(name)).tensors) m[n] = t;
  return m;
}

TEST(WanVae, BothLayoutsLoadTheSameTensors) {
  const auto d = models::wan_vae::load_wan_vae(fixture(kDiffusers));
  const auto o = models::wan_vae::load_wan_vae(fixture(kOriginal));
  EXPECT_EQ(d.layout, "diffusers");
  EXPECT_EQ(o.layout, "original");
  EXPECT_NE(d.config.source.find("config.json"), std::string::npos);   // read from the json beside it
  EXPECT_NE(o.config.source.find("detected"), std::string::npos);      // no json beside the .pth
  EXPECT_EQ(d.config.base_dim, 4);
  EXPECT_EQ(o.config.base_dim, 4);
  ASSERT_EQ(d.tensors.size(), o.tensors.size());
  for (const auto& [n, t] : d.tensors) {
    ASSERT_TRUE(o.tensors.count(n)) << n;
    EXPECT_EQ(test::compare(t, o.tensors.at(n)).max_abs, 0.0) << n;
  }
}

TEST(WanVae, DecodeMatchesDiffusers) {
  auto io = read_io("decode_io.safetensors");
  for (const std::string& file : {kDiffusers, kOriginal}) {
    const WanVae vae(models::wan_vae::load_wan_vae(fixture(file)));
    const Tensor video = vae.decode(io["latent"]);
    const int64_t t = io["latent"].size(2);
    ASSERT_EQ(video.size(2), 4 * (t - 1) + 1) << file;
    ASSERT_EQ(video.shape(), io["video"].shape()) << file;
    TD_EXPECT_CLOSE(test::compare(video, io["video"]), 1e-5, 0.99999);
  }
}

TEST(WanVae, DecodeIsCausalAndClamped) {
  const WanVae vae(models::wan_vae::load_wan_vae(fixture(kDiffusers)));
  const Tensor latent = test::randn_tensor({1, 16, 3, 2, 3}, DType::F32);
  const Tensor full = vae.decode(latent);
  ASSERT_EQ(full.size(2), 9);
  // The first two latents alone give the first five frames: later latents never leak backwards.
  const Tensor head = vae.decode(latent.slice(2, 0, 2).contiguous());
  ASSERT_EQ(head.size(2), 5);
  EXPECT_LE(test::compare(head, full.slice(2, 0, 5).contiguous()).rel_l2, 1e-6);
  const Tensor one = vae.decode(latent.slice(2, 0, 1).contiguous());
  EXPECT_EQ(one.size(2), 1);
  // A huge latent saturates: every value stays in [-1, 1].
  Tensor big = test::randn_tensor({1, 16, 2, 2, 2}, DType::F32, 500.0f);
  const std::vector<float> v = vae.decode(big).to_f32_vector();
  size_t at_bound = 0;
  for (float f : v) {
    ASSERT_TRUE(f >= -1.0f && f <= 1.0f) << f;
    at_bound += std::fabs(f) == 1.0f;
  }
  EXPECT_GT(at_bound, 0u) << "the clamp was never exercised";
}

TEST(WanVae, EncodeMatchesDiffusers) {
  auto io = read_io("encode_io.safetensors");
  for (const std::string& file : {kDiffusers, kOriginal}) {
    const WanVae vae(models::wan_vae::load_wan_vae(fixture(file)));
    const Tensor latent = vae.encode(io["video"]);
    ASSERT_EQ(latent.shape(), io["latent"].shape()) << file;
    TD_EXPECT_CLOSE(test::compare(latent, io["latent"]), 1e-5, 0.99999);
  }
}

TEST(WanVae, EncodeIsCausalAndPerSample) {
  const WanVae vae(models::wan_vae::load_wan_vae(fixture(kOriginal)));
  const Tensor a = test::randn_tensor({1, 3, 9, 16, 24}, DType::F32, 0.5f);
  const Tensor b = test::randn_tensor({1, 3, 9, 16, 24}, DType::F32, 0.5f);
  const Tensor la = vae.encode(a), lb = vae.encode(b);
  ASSERT_EQ(la.shape(), (Shape{1, 16, 3, 2, 3}));
  // The first 4k+1 frames alone give the first k+1 latents (chunks of 1, 4, 4: no look-ahead).
  const Tensor head = vae.encode(a.slice(2, 0, 5).contiguous());
  EXPECT_LE(test::compare(head, la.slice(2, 0, 2).contiguous()).rel_l2, 1e-6);
  const Tensor img = vae.encode(a.slice(2, 0, 1).contiguous());  // a single image (I2V): one latent frame
  EXPECT_LE(test::compare(img, la.slice(2, 0, 1).contiguous()).rel_l2, 1e-6);
  // A batch of two encodes each sample on its own.
  Tensor ab = Tensor::empty({2, 3, 9, 16, 24}, DType::F32);
  ab.slice(0, 0, 1).copy_(a);
  ab.slice(0, 1, 2).copy_(b);
  const Tensor lab = vae.encode(ab);
  EXPECT_LE(test::compare(lab.slice(0, 0, 1).contiguous(), la).rel_l2, 1e-6);
  EXPECT_LE(test::compare(lab.slice(0, 1, 2).contiguous(), lb).rel_l2, 1e-6);
}

TEST(WanVae, BadVideoAndLatentShapes) {
  const WanVae vae(models::wan_vae::load_wan_vae(fixture(kDiffusers)));
  EXPECT_THROW(vae.encode(test::randn_tensor({1, 3, 4, 16, 16}, DType::F32)), Error);   // 4 frames: not 4k+1
  EXPECT_THROW(vae.encode(test::randn_tensor({1, 3, 5, 12, 16}, DType::F32)), Error);   // 12 not a multiple of 8
  EXPECT_THROW(vae.encode(test::randn_tensor({1, 4, 5, 16, 16}, DType::F32)), Error);   // 4 channels
  EXPECT_THROW(vae.decode(test::randn_tensor({1, 15, 2, 2, 2}, DType::F32)), Error);    // 15 latent channels
  EXPECT_THROW(vae.decode(test::randn_tensor({16, 2, 2, 2}, DType::F32)), Error);       // 4-D
}

// ---------------------------------------------------------------- loader errors

std::string write_variant(const std::string& name, std::vector<std::pair<std::string, Tensor>> tensors) {
  const std::string dir = test::temp_dir() + "/" + name;
  fs::create_directories(dir);
  const std::string path = dir + "/vae.safetensors";
  io::write_safetensors(path, tensors);
  return path;
}

std::string load_error(const std::string& path, const std::string& config = "") {
  try {
    models::wan_vae::WanVaeLoadOptions o;
    o.config_path = config;
    models::wan_vae::load_wan_vae(path, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(WanVaeLoader, NamesEveryMissingUnexpectedAndMisShapedTensor) {
  const io::TensorFile f = io::read_tensor_file(fixture(kOriginal));
  std::vector<std::pair<std::string, Tensor>> ts;
  for (const auto& [n, t] : f.tensors) {
    if (n == "decoder.upsamples.3.time_conv.bias" || n == "encoder.middle.1.proj.weight") continue;  // missing
    if (n == "decoder.head.2.weight") {
      ts.emplace_back(n, test::randn_tensor({3, 4, 3, 3, 1}, DType::F32));  // mis-shaped
      continue;
    }
    ts.emplace_back(n, t);
  }
  ts.emplace_back("decoder.extra.weight", test::randn_tensor({2}, DType::F32));  // unexpected
  const std::string e = load_error(write_variant("broken", ts));
  for (const char* want : {"decoder.upsamples.3.time_conv.bias", "encoder.middle.1.proj.weight", "decoder.head.2.weight",
                           "[3, 4, 3, 3, 1]", "[3, 4, 3, 3, 3]", "decoder.extra.weight", "original"})
    EXPECT_NE(e.find(want), std::string::npos) << "'" << want << "' not in: " << e;
}

TEST(WanVaeLoader, RejectsForeignFilesAndWan22Config) {
  const std::string e = load_error(write_variant("foreign", {{"blocks.0.weight", test::randn_tensor({4}, DType::F32)}}));
  EXPECT_NE(e.find("not a Wan2.1 VAE"), std::string::npos) << e;
  const std::string cfg = test::temp_dir() + "/wan22.json";
  std::ofstream(cfg) << R"({"_class_name": "AutoencoderKLWan", "base_dim": 160, "z_dim": 48, "is_residual": true,
                           "patch_size": 2})";
  const std::string e2 = load_error(fixture(kDiffusers), cfg);
  EXPECT_NE(e2.find("Wan2.2 VAE"), std::string::npos) << e2;
  // A config that does not describe the weights: shapes named.
  const std::string cfg2 = test::temp_dir() + "/base8.json";
  std::ofstream(cfg2) << R"({"_class_name": "AutoencoderKLWan", "base_dim": 8})";
  const std::string e3 = load_error(fixture(kDiffusers), cfg2);
  EXPECT_NE(e3.find("188 mis-shaped: encoder.conv_in.weight is [4, 3, 3, 3, 3], expected [8, 3, 3, 3, 3]"),
            std::string::npos)
      << e3;
}

// ---------------------------------------------------------------- CLI

TEST(WanVaeCli, DecodeAndEncodeEndToEnd) {
  const std::string dir = test::temp_dir();
  auto r = test::run_cli("vae decode --vae " + fixture(kOriginal) + " --inputs " + fixture("decode_io.safetensors") +
                         " --out " + dir + "/video.safetensors");
  // decode_io holds `video` too: exactly one input tensor is required.
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("unexpected tensor(s): video"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir + "/video.safetensors"));

  auto dec = read_io("decode_io.safetensors");
  io::write_safetensors(dir + "/latent_in.safetensors", {{"latent", dec["latent"]}});
  r = test::run_cli("vae decode --vae " + fixture(kOriginal) + " --inputs " + dir + "/latent_in.safetensors --out " +
                    dir + "/video.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const io::TensorFile v = io::read_safetensors(dir + "/video.safetensors");
  ASSERT_NE(v.find("video"), nullptr);
  TD_EXPECT_CLOSE(test::compare(*v.find("video"), dec["video"]), 1e-5, 0.99999);

  auto enc = read_io("encode_io.safetensors");
  io::write_safetensors(dir + "/video_in.safetensors", {{"video", enc["video"]}});
  r = test::run_cli("vae encode --vae " + fixture(kDiffusers) + " --inputs " + dir + "/video_in.safetensors --out " +
                    dir + "/latent.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const io::TensorFile l = io::read_safetensors(dir + "/latent.safetensors");
  ASSERT_NE(l.find("latent"), nullptr);
  TD_EXPECT_CLOSE(test::compare(*l.find("latent"), enc["latent"]), 1e-5, 0.99999);
}

TEST(WanVaeCli, BadInputs) {
  const std::string dir = test::temp_dir();
  // 6 frames: not 4k+1.
  io::write_safetensors(dir + "/v6.safetensors", {{"video", test::randn_tensor({1, 3, 6, 16, 16}, DType::F32)}});
  auto r = test::run_cli("vae encode --vae " + fixture(kDiffusers) + " --inputs " + dir + "/v6.safetensors --out " +
                         dir + "/o1.safetensors");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("6 frames"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir + "/o1.safetensors"));
  // Wrong latent channel count.
  io::write_safetensors(dir + "/l8.safetensors", {{"latent", test::randn_tensor({1, 8, 2, 2, 2}, DType::F32)}});
  r = test::run_cli("vae decode --vae " + fixture(kDiffusers) + " --inputs " + dir + "/l8.safetensors --out " + dir +
                    "/o2.safetensors");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("latent must be [B, 16, T, H, W]"), std::string::npos) << r.err;
  // Missing input tensor.
  r = test::run_cli("vae decode --vae " + fixture(kDiffusers) + " --inputs " + dir + "/v6.safetensors --out " + dir +
                    "/o3.safetensors");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("'latent'"), std::string::npos) << r.err;
  // Unwritable output path.
  io::write_safetensors(dir + "/l.safetensors", {{"latent", test::randn_tensor({1, 16, 1, 2, 2}, DType::F32)}});
  r = test::run_cli("vae decode --vae " + fixture(kDiffusers) + " --inputs " + dir + "/l.safetensors --out " + dir +
                    "/no/such/dir/o.safetensors");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_FALSE(fs::exists(dir + "/no/such/dir/o.safetensors"));
  // Missing VAE file; CUDA requested.
  r = test::run_cli("vae decode --vae " + dir + "/nope.pth --inputs " + dir + "/l.safetensors --out " + dir +
                    "/o4.safetensors");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("nope.pth"), std::string::npos) << r.err;
  if (!test::gpu_available()) {
    r = test::run_cli("vae decode --device cuda --vae " + fixture(kDiffusers) + " --inputs " + dir +
                      "/l.safetensors --out " + dir + "/o5.safetensors");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("no usable CUDA GPU"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir + "/o5.safetensors"));
  }
  // Bad tiles: not a multiple of 8, a stride beyond the tile; bf16 on the CPU.
  for (const std::string bad : {"--vae-tile 20", "--vae-tile 16 --vae-tile-stride 24", "--dtype bf16"}) {
    r = test::run_cli("vae decode " + bad + " --vae " + fixture(kDiffusers) + " --inputs " + dir +
                      "/l.safetensors --out " + dir + "/o6.safetensors");
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
    EXPECT_FALSE(fs::exists(dir + "/o6.safetensors"));
  }
}

}  // namespace
}  // namespace td
