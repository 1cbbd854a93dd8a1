// The channels-last Wan VAE path (the structure the CUDA VAE runs, here in
// fp32 on the CPU) and spatial tiling:
//   - each channels-last op against the channel-first fp32 reference op (or a
//     direct formula) on fresh random awkward sizes with poisoned outputs;
//   - the whole channels-last decoder / encoder against the channel-first CPU
//     path on the diffusers fixture (same fp32 math in another layout and
//     order: rel L2 <= 1e-5) and against diffusers' outputs;
//   - tiling: against diffusers' tiled_decode / tiled_encode on the tiny
//     model with tiles small enough to split its frames
//     (fixtures/vae/tiled_io.safetensors, scripts/make_vae_tiling_fixtures.py;
//     fp64 reference, rel L2 <= 1e-5), the same tiling through the
//     channels-last path, a tile as large as the frame = untiled exactly, and
//     bad tile sizes refused.
#include <gtest/gtest.h>

#include <cmath>

#include "harness/harness.h"
#include "io/safetensors.h"
#include "models/wan_vae/wan_vae.h"
#include "ops/conv.h"
#include "ops/elementwise.h"

namespace td {
namespace {

using models::wan_vae::WanVae;
using models::wan_vae::WanVaeRunOptions;

std::string fixture(const std::string& rel) { return test::source_dir() + "/fixtures/vae/" + rel; }

Tensor to_cl(const Tensor& x) { return x.permute({0, 2, 3, 4, 1}).contiguous(); }  // [B,C,T,H,W] -> [B,T,H,W,C]
Tensor to_cf(const Tensor& x) { return x.permute({0, 4, 1, 2, 3}).contiguous(); }

std::map<std::string, Tensor> read_io(const std::string& name) {
  std::map<std::string, Tensor> m;
  for (const auto& [n, t] : io::read_safetensors(fixture(name)).tensors) m[n] = t;
  return m;
}

TEST(WanVaeClOps, Conv3dClMatchesChannelFirst) {
  ops::ConvOptions down;
  down.stride_h = down.stride_w = 2;
  down.pad_bottom = down.pad_right = 1;
  ops::ConvOptions time2;
  time2.stride_t = 2;
  struct Case {
    Shape x, w;  // channel-first shapes
    ops::ConvOptions o;
    bool bias;
  };
  const std::vector<Case> cases = {
      {{1, 5, 4, 7, 9}, {6, 5, 3, 3, 3}, ops::ConvOptions::same_pad(1), true},
      {{2, 3, 3, 5, 11}, {7, 3, 1, 1, 1}, {}, true},
      {{1, 4, 5, 3, 6}, {8, 4, 3, 1, 1}, time2, true},
      {{1, 6, 2, 9, 7}, {5, 6, 1, 3, 3}, down, false},
  };
  for (const Case& c : cases) {
    const Tensor x = test::randn_tensor(c.x, DType::F32), w = test::randn_tensor(c.w, DType::F32);
    const Tensor b = c.bias ? test::randn_tensor({c.w[0]}, DType::F32) : Tensor();
    const Tensor ref = ops::conv3d(x, w, b, c.o);
    const Tensor got = ops::conv3d_cl(to_cl(x), ops::conv_weight_to_cl(w, DType::F32, Device::cpu()), b, c.o);
    TD_EXPECT_CLOSE(test::compare(to_cf(got), ref), 1e-6, 0.999999);
  }
  EXPECT_THROW(ops::conv3d_cl(test::randn_tensor({1, 2, 3, 3, 4}, DType::F32),
                              test::randn_tensor({2, 1, 1, 1, 5}, DType::F32), Tensor()),
               Error);  // channel mismatch
}

TEST(WanVaeClOps, NormUpsampleAndLayouts) {
  const int64_t C = 13;
  const Tensor x = test::randn_tensor({1, C, 3, 5, 7}, DType::F32, 2.0f);
  const Tensor g = test::randn_tensor({C}, DType::F32);
  for (const bool silu : {false, true}) {
    Tensor ref = ops::channel_rms_norm(x, g);
    if (silu) ref = ops::silu(ref);
    TD_EXPECT_CLOSE(test::compare(to_cf(ops::channel_rms_norm_cl(to_cl(x), g, silu)), ref), 1e-6, 0.999999);
  }
  EXPECT_EQ(test::compare(to_cf(ops::upsample_nearest2x_cl(to_cl(x))), ops::upsample_nearest2x(x)).max_abs, 0.0);

  // to_channels_last: frames [1, 3) of 3, scaled and shifted per channel.
  const Tensor sc = test::randn_tensor({C}, DType::F32), sh = test::randn_tensor({C}, DType::F32);
  const Tensor cl = ops::to_channels_last(x, 1, 2, DType::F32, sc, sh);
  ASSERT_EQ(cl.shape(), (Shape{1, 2, 5, 7, C}));
  const std::vector<float> xv = x.to_f32_vector(), clv = cl.to_f32_vector();
  for (int64_t f = 0; f < 2; ++f)
    for (int64_t s = 0; s < 35; ++s)
      for (int64_t c = 0; c < C; ++c)
        ASSERT_EQ(clv[size_t((f * 35 + s) * C + c)],
                  xv[size_t((c * 3 + 1 + f) * 35 + s)] * sc.data<float>()[c] + sh.data<float>()[c]);
  // to_channels_first: the first 4 channels into frames [1, 3) of a poisoned [1, 4, 4, 5, 7], clamped.
  Tensor y = Tensor::empty({1, 4, 4, 5, 7}, DType::F32);
  test::poison(y);
  ops::to_channels_first(cl, y, 1, {}, {}, true);
  const std::vector<float> yv = y.to_f32_vector();
  for (int64_t c = 0; c < 4; ++c)
    for (int64_t f = 0; f < 4; ++f)
      for (int64_t s = 0; s < 35; ++s) {
        const float v = yv[size_t((c * 4 + f) * 35 + s)];
        if (f == 0 || f == 3) {
          ASSERT_TRUE(std::isnan(v)) << "wrote outside its frames";
        } else {
          ASSERT_EQ(v, std::clamp(clv[size_t(((f - 1) * 35 + s) * C + c)], -1.0f, 1.0f));
        }
      }
}

TEST(WanVaeClOps, FramesCatInterleaveAndSoftmax) {
  const Tensor a = test::randn_tensor({1, 2, 3, 4, 6}, DType::F32), b = test::randn_tensor({1, 1, 3, 4, 6}, DType::F32);
  const Tensor ab = ops::cat_frames_cl({a, b});
  ASSERT_EQ(ab.shape(), (Shape{1, 3, 3, 4, 6}));
  EXPECT_EQ(test::compare(ab.slice(1, 0, 2).contiguous(), a).max_abs, 0.0);
  EXPECT_EQ(test::compare(ab.slice(1, 2, 3).contiguous(), b).max_abs, 0.0);
  // [1, t, H, W, 2C]: channel half k of frame s -> frame 2s + k.
  const Tensor y = test::randn_tensor({1, 2, 3, 5, 8}, DType::F32);
  const Tensor f = ops::channel_halves_to_frames_cl(y);
  ASSERT_EQ(f.shape(), (Shape{1, 4, 3, 5, 4}));
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t k = 0; k < 2; ++k)
      EXPECT_EQ(test::compare(f.slice(1, 2 * s + k, 2 * s + k + 1).contiguous(),
                              y.slice(1, s, s + 1).slice(4, 4 * k, 4 * k + 4).contiguous())
                    .max_abs,
                0.0);
  const int64_t rows = 7, cols = 301;
  const Tensor s = test::randn_tensor({rows, cols}, DType::F32, 5.0f);
  const Tensor p = ops::softmax_rows(s, 0.3f, DType::F32);
  std::vector<double> ref(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    double m = -1e300, sum = 0;
    for (int64_t j = 0; j < cols; ++j) m = std::max(m, 0.3 * double(s.data<float>()[r * cols + j]));
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(0.3 * double(s.data<float>()[r * cols + j]) - m);
    for (int64_t j = 0; j < cols; ++j)
      ref[size_t(r * cols + j)] = std::exp(0.3 * double(s.data<float>()[r * cols + j]) - m) / sum;
  }
  const std::vector<float> pv = p.to_f32_vector();
  TD_EXPECT_CLOSE(test::compare(std::vector<double>(pv.begin(), pv.end()), ref), 1e-6, 0.999999);
}

// ---------------------------------------------------------------- the model

WanVaeRunOptions cl_cpu() {
  WanVaeRunOptions o;
  o.channels_last = true;
  return o;
}

TEST(WanVaeCl, DecodeAndEncodeMatchTheChannelFirstPath) {
  const WanVae vae(models::wan_vae::load_wan_vae(fixture("diffusion_pytorch_model.safetensors")));
  auto dec = read_io("decode_io.safetensors");
  const Tensor ref = vae.decode(dec["latent"]);
  const Tensor got = vae.decode(dec["latent"], cl_cpu());
  ASSERT_EQ(got.shape(), ref.shape());
  TD_EXPECT_CLOSE(test::compare(got, ref), 1e-5, 0.99999);
  TD_EXPECT_CLOSE(test::compare(got, dec["video"]), 1e-5, 0.99999);
  auto enc = read_io("encode_io.safetensors");
  const Tensor lref = vae.encode(enc["video"]);
  const Tensor lgot = vae.encode(enc["video"], cl_cpu());
  ASSERT_EQ(lgot.shape(), lref.shape());
  TD_EXPECT_CLOSE(test::compare(lgot, lref), 1e-5, 0.99999);
  TD_EXPECT_CLOSE(test::compare(lgot, enc["latent"]), 1e-5, 0.99999);
  // A single latent frame (one chunk) and a single image.
  const Tensor one = dec["latent"].slice(0, 0, 1).slice(2, 0, 1).contiguous();
  TD_EXPECT_CLOSE(test::compare(vae.decode(one, cl_cpu()), vae.decode(one)), 1e-5, 0.99999);
}

models::wan_vae::WanVaeTiling small_tiles() {
  models::wan_vae::WanVaeTiling t;
  t.enabled = true;
  t.tile_height = t.tile_width = 24;
  t.stride_height = t.stride_width = 16;
  return t;
}

TEST(WanVaeTiling, MatchesDiffusersTiledDecodeAndEncode) {
  auto io = read_io("tiled_io.safetensors");
  for (const std::string file : {"diffusion_pytorch_model.safetensors", "original/Wan2.1_VAE.pth"}) {
    const WanVae vae(models::wan_vae::load_wan_vae(fixture(file)));
    for (const bool cl : {false, true}) {
      SCOPED_TRACE(file + (cl ? " channels-last" : " channel-first"));
      WanVaeRunOptions o;
      o.channels_last = cl;
      o.tiling = small_tiles();
      const Tensor video = vae.decode(io["latent"], o);
      ASSERT_EQ(video.shape(), io["video_tiled"].shape());
      TD_EXPECT_CLOSE(test::compare(video, io["video_tiled"]), 1e-5, 0.99999);
      const Tensor latent = vae.encode(io["video"], o);
      ASSERT_EQ(latent.shape(), io["latent_tiled"].shape());
      TD_EXPECT_CLOSE(test::compare(latent, io["latent_tiled"]), 1e-5, 0.99999);
    }
  }
}

TEST(WanVaeTiling, OneTileIsUntiledAndBadSizesAreRefused) {
  const WanVae vae(models::wan_vae::load_wan_vae(fixture("diffusion_pytorch_model.safetensors")));
  const Tensor latent = test::randn_tensor({1, 16, 2, 4, 6}, DType::F32);
  WanVaeRunOptions o;
  o.tiling.enabled = true;  // 256x256 tiles: the 32x48 frame is one tile, so tiling does not apply
  EXPECT_EQ(test::compare(vae.decode(latent, o), vae.decode(latent)).max_abs, 0.0);
  // Tiles that split the frame change it (seams are blended, not removed): finite, clamped, different.
  o.tiling = small_tiles();
  const Tensor tiled = vae.decode(latent, o);
  const test::Accuracy a = test::compare(tiled, vae.decode(latent));
  EXPECT_EQ(a.nonfinite, 0u);
  EXPECT_GT(a.max_abs, 0.0);
  for (float v : tiled.to_f32_vector()) ASSERT_TRUE(v >= -1.0f && v <= 1.0f);
  for (const auto& [th, sh] : {std::pair{20, 16}, std::pair{24, 0}, std::pair{16, 24}, std::pair{24, 12}}) {
    o.tiling.tile_height = o.tiling.tile_width = th;
    o.tiling.stride_height = o.tiling.stride_width = sh;
    try {
      vae.decode(latent, o);
      ADD_FAILURE() << "tile " << th << " stride " << sh << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage) << e.what();
    }
  }
}

TEST(WanVaeTiling, CliTileFlags) {
  const std::string dir = test::temp_dir();
  auto io = read_io("tiled_io.safetensors");
  io::write_safetensors(dir + "/l.safetensors", {{"latent", io["latent"]}});
  const auto r = test::run_cli("vae decode --vae-tile 24 --vae-tile-stride 16 --vae " +
                               fixture("diffusion_pytorch_model.safetensors") + " --inputs " + dir +
                               "/l.safetensors --out " + dir + "/v.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("tiling 24x24 every 16x16"), std::string::npos) << r.out;
  const auto v = io::read_safetensors(dir + "/v.safetensors");
  ASSERT_NE(v.find("video"), nullptr);
  TD_EXPECT_CLOSE(test::compare(*v.find("video"), io["video_tiled"]), 1e-5, 0.99999);
}

}  // namespace
}  // namespace td
