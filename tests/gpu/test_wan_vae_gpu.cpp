// The CUDA Wan VAE: each channels-last op on CUDA (cuDNN convolution, the
// kernels of kernels/conv/vae_cl.cu) against its fp32 CPU reference on the
// same inputs (rounded to the device dtype first), fresh random awkward sizes
// (3 and 13 channels, odd frames, 1-frame inputs), outputs poisoned first;
// then the whole decoder / encoder on CUDA (BF16 and F32) against the CPU
// fp32 path and the diffusers fixtures, tiled decode against diffusers'
// tiled_decode, and `turbodiff vae --device cuda` end to end.
//
// Tolerances. A BF16 output is rounded once (relative error <= 2^-9 per
// element, rel L2 ~ 2e-3 over a tensor); convolutions accumulate in fp32.
// So the single ops: rel L2 <= 8e-3, cosine >= 0.9999 in BF16; in F32 the
// elementwise kernels <= 1e-5 and the convolution <= 5e-3 (cuDNN may run F32
// convolutions as TF32 on tensor cores, 10-bit mantissa). The whole VAE in
// BF16 chains ~40 convolutions, each re-rounding its activations, and the
// tiny random fixture model amplifies that: diffusers' own AutoencoderKLWan
// in BF16 (CPU, torch 2.11) decodes fixtures/vae/decode_io at rel L2 0.047,
// cosine 0.99889 against the fp64 reference (encode: 0.0042). The bar is
// "no worse than diffusers' BF16": rel L2 <= 5e-2, cosine >= 0.998 (measured
// on the H200: decode 0.038 / 0.99928, tiled decode 0.033 / 0.99944, encode
// 0.0028). F32 on CUDA: <= 1e-2 (measured 3.4e-3 decode, 2.2e-4 encode).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "harness/harness.h"
#include "io/safetensors.h"
#include "kernels/conv/conv.h"
#include "models/wan_vae/wan_vae.h"
#include "ops/conv.h"

namespace td {
namespace {

namespace fs = std::filesystem;
using models::wan_vae::WanVae;
using models::wan_vae::WanVaeRunOptions;

std::string fixture(const std::string& rel) { return test::source_dir() + "/fixtures/vae/" + rel; }

// Host f32 rounded through `dt` (what the device sees), and its device copy.
Tensor rounded(const Tensor& x, DType dt) { return dt == DType::F32 ? x : x.to(dt).to(DType::F32); }
Tensor on_gpu(const Tensor& x, DType dt) { return (dt == DType::F32 ? x : x.to(dt)).to(Device::cuda(0)); }

double op_tol(DType dt) { return dt == DType::BF16 ? 8e-3 : 1e-5; }
double op_cos(DType dt) { return dt == DType::BF16 ? 0.9999 : 0.999999; }

std::map<std::string, Tensor> read_io(const std::string& name) {
  std::map<std::string, Tensor> m;
  for (const auto& [n, t] : io::read_safetensors(fixture(name)).tensors) m[n] = t;
  return m;
}

TEST(WanVaeGpuOps, Conv3dClCudnnMatchesCpu) {
  TD_REQUIRE_GPU();
  ops::ConvOptions down;
  down.stride_h = down.stride_w = 2;
  down.pad_bottom = down.pad_right = 1;
  ops::ConvOptions time2;
  time2.stride_t = 2;
  struct Case {
    Shape x, w;  // channels-last [B, T, H, W, Ci], [Co, kt, kh, kw, Ci]
    ops::ConvOptions o;
    bool bias;
  };
  const std::vector<Case> cases = {
      {{1, 3, 7, 9, 13}, {6, 3, 3, 3, 13}, ops::ConvOptions::same_pad(1), true},    // causal 3x3x3
      {{1, 3, 17, 11, 3}, {16, 3, 3, 3, 3}, ops::ConvOptions::same_pad(1), true},   // stem: 3 channels in
      {{1, 6, 9, 5, 16}, {3, 3, 3, 3, 16}, ops::ConvOptions::same_pad(1), true},    // head: 3 channels out
      {{2, 3, 5, 11, 8}, {7, 1, 1, 1, 8}, {}, true},                                // 1x1x1, batch 2
      {{1, 5, 3, 6, 12}, {24, 3, 1, 1, 12}, time2, true},                           // time_conv stride 2
      {{1, 3, 4, 5, 32}, {64, 3, 1, 1, 32}, {}, false},                             // upsample time_conv
      {{1, 2, 9, 7, 16}, {16, 1, 3, 3, 16}, down, false},                           // 2-D stride-2 downsample
      {{1, 1, 30, 52, 96}, {96, 1, 3, 3, 96}, ops::ConvOptions::same_pad(1), true}, // a real width
  };
  for (const DType dt : {DType::BF16, DType::F32}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(cat(dtype_name(dt), " x ", shape_str(c.x), " w ", shape_str(c.w)));
      const Tensor x = test::randn_tensor(c.x, DType::F32), w = test::randn_tensor(c.w, DType::F32, 0.2f);
      const Tensor b = c.bias ? test::randn_tensor({c.w[0]}, DType::F32) : Tensor();
      const Tensor ref = ops::conv3d_cl(rounded(x, dt), rounded(w, dt), b, c.o);
      const Tensor got = ops::conv3d_cl(on_gpu(x, dt), on_gpu(w, dt), b.defined() ? b.to(Device::cuda(0)) : b, c.o);
      ASSERT_EQ(got.shape(), ref.shape());
      TD_EXPECT_CLOSE(test::compare(got, ref), dt == DType::BF16 ? 8e-3 : 5e-3, 0.9999);
    }
  }
  // The unfused variant (plain convolution + a separate bias add) gives the same result.
  {
    const Tensor x = test::randn_tensor({1, 3, 7, 9, 16}, DType::F32), w = test::randn_tensor({8, 3, 3, 3, 16}, DType::F32, 0.2f);
    const Tensor b = test::randn_tensor({8}, DType::F32);
    const Tensor ref = ops::conv3d_cl(rounded(x, DType::BF16), rounded(w, DType::BF16), b, ops::ConvOptions::same_pad(1));
    ops::set_conv_cl_fuse_bias(false);
    const Tensor got = ops::conv3d_cl(on_gpu(x, DType::BF16), on_gpu(w, DType::BF16), b.to(Device::cuda(0)),
                                      ops::ConvOptions::same_pad(1));
    ops::set_conv_cl_fuse_bias(true);
    TD_EXPECT_CLOSE(test::compare(got, ref), 8e-3, 0.9999);
  }
  // A shape seen again reuses its plan.
  const size_t plans = kernels::conv_cudnn_cached_plans();
  const Tensor x = on_gpu(test::randn_tensor({1, 3, 7, 9, 13}, DType::F32), DType::BF16);
  const Tensor w = on_gpu(test::randn_tensor({6, 3, 3, 3, 13}, DType::F32), DType::BF16);
  const Tensor b = test::randn_tensor({6}, DType::F32).to(Device::cuda(0));
  ops::conv3d_cl(x, w, b, ops::ConvOptions::same_pad(1));
  EXPECT_EQ(kernels::conv_cudnn_cached_plans(), plans);
}

TEST(WanVaeGpuOps, NormUpsampleSoftmaxLayoutsMatchCpu) {
  TD_REQUIRE_GPU();
  for (const DType dt : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(dt));
    for (const int64_t c : {3, 13, 96, 384}) {
      const Tensor x = test::randn_tensor({1, 3, 7, 5, c}, DType::F32, 3.0f), g = test::randn_tensor({c}, DType::F32);
      for (const bool silu : {false, true}) {
        const Tensor ref = ops::channel_rms_norm_cl(rounded(x, dt), g, silu);
        const Tensor got = ops::channel_rms_norm_cl(on_gpu(x, dt), g.to(Device::cuda(0)), silu);
        TD_EXPECT_CLOSE(test::compare(got, ref), op_tol(dt), op_cos(dt));
      }
      const Tensor up = ops::upsample_nearest2x_cl(on_gpu(x, dt));  // vector path for 16-byte rows, else scalar
      EXPECT_EQ(test::compare(up, ops::upsample_nearest2x_cl(rounded(x, dt))).max_abs, 0.0) << c;
    }
    const Tensor s = test::randn_tensor({37, 1001}, DType::F32, 4.0f);
    TD_EXPECT_CLOSE(test::compare(ops::softmax_rows(s.to(Device::cuda(0)), 0.05f, dt),
                                  ops::softmax_rows(s, 0.05f, DType::F32)),
                    op_tol(dt), op_cos(dt));
    // Layouts: frames [2, 5) of 6, scaled and shifted; back into a poisoned buffer at frame 1, clamped.
    const Tensor v = test::randn_tensor({1, 5, 6, 9, 10}, DType::F32);
    const Tensor sc = test::randn_tensor({5}, DType::F32), sh = test::randn_tensor({5}, DType::F32);
    const Tensor cl_ref = ops::to_channels_last(v, 2, 3, DType::F32, sc, sh);
    const Tensor cl = ops::to_channels_last(v.to(Device::cuda(0)), 2, 3, dt, sc.to(Device::cuda(0)),
                                            sh.to(Device::cuda(0)));
    TD_EXPECT_CLOSE(test::compare(cl, cl_ref), op_tol(dt), op_cos(dt));
    Tensor back = Tensor::empty({1, 4, 5, 9, 10}, DType::F32, Device::cuda(0));
    test::poison(back);
    ops::to_channels_first(cl, back, 1, {}, {}, true);
    Tensor back_ref = Tensor::empty({1, 4, 5, 9, 10}, DType::F32);
    test::poison(back_ref);
    ops::to_channels_first(rounded(cl_ref, dt), back_ref, 1, {}, {}, true);
    const Tensor bh = back.to(Device::cpu());
    for (int64_t i = 0; i < bh.numel(); ++i) {
      const float a = bh.data<float>()[i], r = back_ref.data<float>()[i];
      ASSERT_TRUE((std::isnan(a) && std::isnan(r)) || std::fabs(a - r) <= 1e-6f * (1 + std::fabs(r)))
          << "element " << i << ": gpu " << a << " cpu " << r;
    }
    // Frame concatenation and the channel-halves-to-frames interleave are copies: exact.
    const Tensor a = test::randn_tensor({1, 2, 3, 5, 6}, DType::F32), b = test::randn_tensor({1, 1, 3, 5, 6}, DType::F32);
    EXPECT_EQ(test::compare(ops::cat_frames_cl({on_gpu(a, dt), on_gpu(b, dt)}),
                            ops::cat_frames_cl({rounded(a, dt), rounded(b, dt)}))
                  .max_abs,
              0.0);
    const Tensor y = test::randn_tensor({1, 2, 3, 5, 8}, DType::F32);
    EXPECT_EQ(test::compare(ops::channel_halves_to_frames_cl(on_gpu(y, dt)),
                            ops::channel_halves_to_frames_cl(rounded(y, dt)))
                  .max_abs,
              0.0);
  }
}

// ---------------------------------------------------------------- the model

WanVaeRunOptions cuda_opts(DType dt) {
  WanVaeRunOptions o;
  o.device = Device::cuda(0);
  o.dtype = dt;
  return o;
}

TEST(WanVaeGpu, DecodeAndEncodeMatchCpu) {
  TD_REQUIRE_GPU();
  const WanVae vae(models::wan_vae::load_wan_vae(fixture("diffusion_pytorch_model.safetensors")));
  auto dec = read_io("decode_io.safetensors");
  auto enc = read_io("encode_io.safetensors");
  const Tensor vref = vae.decode(dec["latent"]);
  const Tensor lref = vae.encode(enc["video"]);
  for (const DType dt : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(dt));
    const double tol = dt == DType::BF16 ? 5e-2 : 1e-2, cos = dt == DType::BF16 ? 0.998 : 0.9999;
    const Tensor video = vae.decode(dec["latent"], cuda_opts(dt));
    ASSERT_EQ(video.shape(), vref.shape());
    ASSERT_TRUE(video.device().is_cpu());
    const test::Accuracy av = test::compare(video, vref);
    std::printf("[ vae decode %s vs cpu f32 ] %s\n", dtype_name(dt), av.str().c_str());
    TD_EXPECT_CLOSE(av, tol, cos);
    TD_EXPECT_CLOSE(test::compare(video, dec["video"]), tol, cos);
    const Tensor latent = vae.encode(enc["video"], cuda_opts(dt));
    const test::Accuracy al = test::compare(latent, lref);
    std::printf("[ vae encode %s vs cpu f32 ] %s\n", dtype_name(dt), al.str().c_str());
    TD_EXPECT_CLOSE(al, tol, cos);
    // The latent may already be on the device (the pipeline's case).
    const Tensor v2 = vae.decode(dec["latent"].to(Device::cuda(0)), {});
    EXPECT_LE(test::compare(v2, vae.decode(dec["latent"], cuda_opts(DType::BF16))).rel_l2, 1e-6);
  }
  // Tiled decode on CUDA against diffusers' tiled_decode.
  auto io = read_io("tiled_io.safetensors");
  WanVaeRunOptions o = cuda_opts(DType::BF16);
  o.tiling.enabled = true;
  o.tiling.tile_height = o.tiling.tile_width = 24;
  o.tiling.stride_height = o.tiling.stride_width = 16;
  const test::Accuracy at = test::compare(vae.decode(io["latent"], o), io["video_tiled"]);
  std::printf("[ vae tiled decode bf16 vs diffusers ] %s\n", at.str().c_str());
  TD_EXPECT_CLOSE(at, 5e-2, 0.998);
  TD_EXPECT_CLOSE(test::compare(vae.encode(io["video"], o), io["latent_tiled"]), 5e-2, 0.998);
}

TEST(WanVaeGpu, CliDecodeOnCuda) {
  TD_REQUIRE_GPU();
  const std::string dir = test::temp_dir();
  auto dec = read_io("decode_io.safetensors");
  io::write_safetensors(dir + "/l.safetensors", {{"latent", dec["latent"]}});
  const auto r = test::run_cli("vae decode --device cuda --vae " + fixture("original/Wan2.1_VAE.pth") + " --inputs " +
                               dir + "/l.safetensors --out " + dir + "/v.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("cuda bf16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("peak GPU memory"), std::string::npos) << r.out;
  const auto v = io::read_safetensors(dir + "/v.safetensors");
  ASSERT_NE(v.find("video"), nullptr);
  TD_EXPECT_CLOSE(test::compare(*v.find("video"), dec["video"]), 5e-2, 0.998);
}

}  // namespace
}  // namespace td
