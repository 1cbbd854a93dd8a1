// The CUDA TAEHV decoder (issue 8, previews): the kernels of
// kernels/conv/taehv_cl.cu against their fp32 CPU references (outputs
// poisoned first; vector and scalar paths: element counts and channel counts
// that are and are not multiples of 16 bytes, a misaligned pointer), then the
// whole decoder on CUDA (BF16 and F32) against the CPU fp32 path on the
// fixture weights and on random weights at the real widths (256/128/64/64),
// chunked and unchunked, and `turbodiff vae decode --decoder taehv --device cuda`.
//
// Tolerances. Pointwise / copy kernels: F32 exact up to tanhf (rel L2 <= 1e-6),
// BF16 one rounding (<= 8e-3, cosine >= 0.9999). The decoder chains 32
// convolutions with BF16 activations re-rounded after each (fp32
// accumulation in cuDNN), plus the final [0, 1] clamp: rel L2 <= 3e-2, cosine
// >= 0.999 in BF16 (the Wan VAE's GPU test allows 5e-2 for its ~40 convs);
// F32 on CUDA (cuDNN may use TF32): <= 1e-2. Not yet run on a GPU when written.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/cuda_runtime.h"
#include "harness/harness.h"
#include "io/safetensors.h"
#include "kernels/conv/taehv_cl.h"
#include "models/taehv/taehv.h"
#include "ops/taehv.h"

namespace td {
namespace {

namespace fs = std::filesystem;
using models::taehv::TaehvDecoder;
using models::taehv::TaehvRunOptions;

std::string fixture(const std::string& rel) { return test::source_dir() + "/fixtures/taehv/" + rel; }
Tensor rounded(const Tensor& x, DType dt) { return dt == DType::F32 ? x : x.to(dt).to(DType::F32); }
Tensor on_gpu(const Tensor& x, DType dt) { return (dt == DType::F32 ? x : x.to(dt)).to(Device::cuda(0)); }
kernels::ElemType et(DType dt) { return dt == DType::F32 ? kernels::ElemType::F32 : kernels::ElemType::BF16; }
double op_tol(DType dt) { return dt == DType::BF16 ? 8e-3 : 1e-6; }
double op_cos(DType dt) { return dt == DType::BF16 ? 0.9999 : 0.999999; }

TEST(TaehvGpuOps, PointwiseMatchesCpu) {
  TD_REQUIRE_GPU();
  for (const DType dt : {DType::BF16, DType::F32})
    for (const int64_t n : {int64_t(1), int64_t(13), int64_t(4096), int64_t(100003)})
      for (const bool misalign : {false, true})
        for (const auto op : {kernels::TaehvPointwise::Relu, kernels::TaehvPointwise::TanhClamp3,
                              kernels::TaehvPointwise::AddRelu}) {
          const Tensor xh = rounded(test::randn_tensor({n + 1}, DType::F32, 4.f), dt);
          const Tensor rh = rounded(test::randn_tensor({n + 1}, DType::F32, 2.f), dt);
          const int64_t o = misalign ? 1 : 0;
          Tensor ref = Tensor::empty({n}, DType::F32);
          ASSERT_EQ(kernels::taehv_pointwise_cpu(op, xh.data<float>() + o, rh.data<float>() + o, n, ref.data<float>()),
                    kernels::Status::Ok);
          const Tensor xd = on_gpu(xh, dt), rd = on_gpu(rh, dt);
          Tensor yd = Tensor::empty({n + 1}, dt, Device::cuda(0));
          test::poison(yd);
          const size_t es = dtype_size(dt);
          ASSERT_EQ(kernels::taehv_pointwise_cuda(op, static_cast<char*>(xd.raw_data()) + o * es,
                                                  static_cast<char*>(rd.raw_data()) + o * es, et(dt), n,
                                                  static_cast<char*>(yd.raw_data()) + o * es, cuda::current_stream()),
                    kernels::Status::Ok);
          cuda::synchronize(0);
          TD_EXPECT_CLOSE(test::compare(yd.to(Device::cpu()).slice(0, o, o + n).contiguous(), ref), op_tol(dt),
                          op_cos(dt));
        }
  // The in-place ops on CUDA tensors.
  Tensor x = test::randn_tensor({1, 3, 5, 7, 16}, DType::F32);
  Tensor ref = x.clone();
  ops::tanh_clamp3_(ref);
  Tensor xd = on_gpu(x, DType::F32);
  ops::tanh_clamp3_(xd);
  TD_EXPECT_CLOSE(test::compare(xd, ref), 1e-6, 0.999999);
}

TEST(TaehvGpuOps, MemblockInputMatchesCpu) {
  TD_REQUIRE_GPU();
  for (const DType dt : {DType::BF16, DType::F32})
    for (const int64_t c : {int64_t(3), int64_t(13), int64_t(64), int64_t(256)})
      for (const bool with_prev : {false, true}) {
        const int64_t t = 3, h = 5, w = 7;
        const Tensor x = rounded(test::randn_tensor({1, t, h, w, c}, DType::F32), dt);
        const Tensor prev = rounded(test::randn_tensor({1, 1, h, w, c}, DType::F32), dt);
        const Tensor ref = ops::memblock_input_cl(x, with_prev ? prev : Tensor());
        Tensor yd = Tensor::empty({1, t, h, w, 2 * c}, dt, Device::cuda(0));
        test::poison(yd);
        const Tensor xd = on_gpu(x, dt), pd = on_gpu(prev, dt);
        ASSERT_EQ(kernels::taehv_memblock_input_cuda(xd.raw_data(), with_prev ? pd.raw_data() : nullptr, et(dt), t,
                                                     h * w, c, yd.raw_data(), cuda::current_stream()),
                  kernels::Status::Ok);
        cuda::synchronize(0);
        const test::Accuracy a = test::compare(yd, ref);
        EXPECT_EQ(a.nonfinite, 0u) << a.str();
        EXPECT_EQ(a.max_abs, 0.0) << "c " << c << " " << a.str();  // a pure copy
        // The op on CUDA tensors gives the same.
        EXPECT_EQ(test::compare(ops::memblock_input_cl(xd, with_prev ? pd : Tensor()), ref).max_abs, 0.0);
      }
}

void expect_decoder_matches(const TaehvDecoder& dec, const Tensor& latent, const char* what) {
  TaehvRunOptions cpu;
  cpu.latent_frames_per_chunk = 0;
  const Tensor ref = dec.decode(latent, cpu);
  for (const DType dt : {DType::BF16, DType::F32})
    for (const int64_t chunk : {int64_t(0), int64_t(2)}) {
      TaehvRunOptions o;
      o.device = Device::cuda(0);
      o.dtype = dt;
      o.latent_frames_per_chunk = chunk;
      const Tensor got = dec.decode(latent, o);
      ASSERT_EQ(got.shape(), ref.shape());
      const test::Accuracy a = test::compare(got, ref);
      std::printf("TAEHV %s on CUDA %s chunk %lld vs CPU f32: %s\n", what, dtype_name(dt), (long long)chunk,
                  a.str().c_str());
      TD_EXPECT_CLOSE(a, dt == DType::BF16 ? 3e-2 : 1e-2, dt == DType::BF16 ? 0.999 : 0.9999);
    }
}

TEST(TaehvGpu, FixtureDecoderMatchesCpu) {
  TD_REQUIRE_GPU();
  const TaehvDecoder dec(models::taehv::load_taehv(fixture("taew2_1_tiny.pth")));
  const Tensor latent = io::read_safetensors(fixture("decode_io.safetensors")).find("latent")->clone();
  expect_decoder_matches(dec, latent, "fixture");
}

TEST(TaehvGpu, RealWidthDecoderMatchesCpu) {
  TD_REQUIRE_GPU();
  const TaehvDecoder dec(models::taehv::random_taehv_checkpoint());
  const Tensor latent = test::randn_tensor({1, 16, 3, 6, 5}, DType::F32, 1.5f);
  expect_decoder_matches(dec, latent, "real widths (random weights)");
}

TEST(TaehvGpu, CliDecodeOnCuda) {
  TD_REQUIRE_GPU();
  const std::string dir = test::temp_dir() + "/taehv_gpu_cli";  // temp_dir() is shared by the process's tests
  fs::create_directories(dir);
  const io::TensorFile io_file = io::read_safetensors(fixture("decode_io.safetensors"));
  io::write_safetensors(dir + "/latent.safetensors", {{"latent", io_file.find("latent")->clone()}});
  const auto r = test::run_cli("vae decode --decoder taehv --device cuda --vae " + fixture("taew2_1_tiny.safetensors") +
                               " --inputs " + dir + "/latent.safetensors --out " + dir + "/video.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("peak GPU memory"), std::string::npos) << r.out;
  const io::TensorFile v = io::read_safetensors(dir + "/video.safetensors");
  ASSERT_NE(v.find("video"), nullptr);
  TD_EXPECT_CLOSE(test::compare(*v.find("video"), *io_file.find("video")), 3e-2, 0.999);
}

}  // namespace
}  // namespace td
