// ops::int8_linear / nn::Int8Linear on CUDA: the INT8 kernels (sm_90a on an
// H200, mma.sync elsewhere) against the CPU reference path on the same codes,
// the cuBLAS BF16 fallbacks (small M, shapes no INT8 kernel takes), and the
// W8A8 Wan DiT forward on the GPU against the CPU one.
#include <cstring>
#include <string>

#include "core/cuda_runtime.h"
#include "harness/harness.h"
#include "io/safetensors.h"
#include "nn/int8_linear.h"
#include "ops/int8_linear.h"
#include "ops/linear.h"

namespace td {
namespace {

using nn::Int8LinearVariant;

constexpr Int8LinearVariant kVariants[] = {Int8LinearVariant::Token128, Int8LinearVariant::Block128,
                                           Int8LinearVariant::PostScale};

TEST(Int8LinearGpu, KernelsMatchCpuReference) {
  TD_REQUIRE_GPU();
  // M above kInt8LinearMinRowsCuda and not a multiple of 128; K, N meet the kernels'
  // K % 16 and N % 8 rules but are not multiples of 128 (ragged blocks).
  const int64_t M = ops::kInt8LinearMinRowsCuda + 37, K = 400, N = 264;
  static_assert(ops::kInt8LinearMinRowsCuda >= 1);
  for (const Int8LinearVariant v : kVariants)
    for (const bool gelu : {false, true}) {
      SCOPED_TRACE(testing::Message() << nn::int8_linear_variant_name(v) << " gelu " << gelu);
      const Tensor w = test::randn_tensor({N, K}, DType::BF16, 0.05f);
      const Tensor b = test::randn_tensor({N}, DType::F32, 0.5f);
      const Tensor x = test::randn_tensor({M, K}, DType::BF16);
      const nn::Int8Linear cpu = nn::Int8Linear::from_float(w, b, v, Device::cpu());
      const nn::Int8Linear gpu(cpu.weight(), b, v, Device::cuda(0));
      const Tensor ref = cpu(x, DType::F32, gelu);
      const Tensor y = gpu(x.to(Device::cuda(0)), DType::BF16, gelu);
      ASSERT_EQ(y.dtype(), DType::BF16);
      ASSERT_TRUE(y.device().is_cuda());
      // Same quantizer bits (the CUDA quantizers are bit-identical to the CPU
      // ones), exact int32 partial sums; the difference is fp32 summation order
      // (~1e-6) and the bf16 output rounding (RMS ~1.1e-3 relative): bar 3e-3.
      TD_EXPECT_CLOSE(test::compare(y, ref), 3e-3, 0.99999);
    }
}

// One quantization for several layers on CUDA: the same bits as each layer
// quantizing x itself, through the INT8 kernels (M above the fallback
// threshold) and through the cuBLAS fallback (small M: no codes at all).
TEST(Int8LinearGpu, QuantizedOnceEqualsQuantizedPerCall) {
  TD_REQUIRE_GPU();
  for (const int64_t M : {ops::kInt8LinearMinRowsCuda + 37, int64_t(100)})
    for (const Int8LinearVariant v : kVariants) {
      SCOPED_TRACE(testing::Message() << nn::int8_linear_variant_name(v) << " M=" << M);
      const int64_t K = 400, N = 264;
      const Tensor x = test::randn_tensor({M, K}, DType::BF16).to(Device::cuda(0));
      const ops::QuantizedActivation xq = ops::quantize_activation(x, nn::int8_act_scheme(v));
      EXPECT_EQ(xq.codes.defined(), M >= ops::kInt8LinearMinRowsCuda);
      for (const bool gelu : {false, true}) {
        const Tensor w = test::randn_tensor({N, K}, DType::BF16, 0.05f);
        const Tensor b = test::randn_tensor({N}, DType::F32, 0.5f);
        const nn::Int8Linear layer = nn::Int8Linear::from_float(w, b, v, Device::cuda(0));
        const Tensor per_call = layer(x, DType::BF16, gelu).to(Device::cpu());
        const Tensor once = layer(xq, DType::BF16, gelu).to(Device::cpu());
        ASSERT_EQ(per_call.shape(), once.shape());
        ASSERT_EQ(std::memcmp(per_call.raw_data(), once.raw_data(), size_t(per_call.numel()) * 2), 0)
            << "gelu " << gelu;
      }
    }
}

TEST(Int8LinearGpu, FallbacksMatchFloatLinearOfDequantizedWeight) {
  TD_REQUIRE_GPU();
  // (a) small M: cuBLAS BF16 on the weight dequantized on the device;
  // (b) K = 200 (not a multiple of 16): no INT8 kernel takes it at any M.
  struct Case {
    int64_t M, K, N;
  };
  for (const Case c : {Case{100, 512, 136}, Case{ops::kInt8LinearMinRowsCuda + 5, 200, 72}})
    for (const Int8LinearVariant v : kVariants) {
      SCOPED_TRACE(testing::Message() << nn::int8_linear_variant_name(v) << " M=" << c.M << " K=" << c.K);
      const Tensor w = test::randn_tensor({c.N, c.K}, DType::BF16, 0.05f);
      const Tensor x = test::randn_tensor({c.M, c.K}, DType::BF16);
      const nn::Int8Linear gpu = nn::Int8Linear::from_float(w, Tensor(), v, Device::cuda(0));
      const Tensor y = gpu(x.to(Device::cuda(0)));
      // The fallback does not quantize the activation: it must equal the float
      // linear of x with the dequantized weight up to bf16 rounding of the
      // dequantized weight and of the output (bar 5e-3).
      const Tensor wd = ops::dequantize_int8_weight(gpu.weight(), DType::F32).to(Device::cpu());
      const Tensor ref = ops::linear(x.to(DType::F32), wd, Tensor(), DType::F32);
      TD_EXPECT_CLOSE(test::compare(y, ref), 5e-3, 0.9999);
    }
}

TEST(Int8LinearGpu, DequantizeOnDeviceMatchesHost) {
  TD_REQUIRE_GPU();
  for (const Int8LinearVariant v : kVariants) {
    const Tensor w = test::randn_tensor({300, 260}, DType::F32, 0.1f);
    const ops::Int8LinearWeight host = nn::quantize_linear_weight(w, v);
    ops::Int8LinearWeight dev = host;
    dev.q = host.q.to(Device::cuda(0));
    dev.scale = host.scale.to(Device::cuda(0));
    const Tensor a = ops::dequantize_int8_weight(dev, DType::F32);
    const Tensor b = ops::dequantize_int8_weight(host, DType::F32);
    TD_EXPECT_CLOSE(test::compare(a, b), 0, 1 - 1e-12);  // q * scale in fp32 on both sides: exact
  }
}

TEST(Int8LinearGpu, WanDitQuantLinearMatchesCpu) {
  TD_REQUIRE_GPU();
  const std::string fx = test::source_dir() + "/fixtures/dit/t2v/";
  const std::string dir = test::temp_dir();
  const std::string common = "dit --weights " + fx + "turbo_quant.pth --inputs " + fx + "inputs.safetensors --quant-linear";
  auto r = test::run_cli(common + " --device cpu --out " + dir + "/cpu.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run_cli(common + " --device cuda --out " + dir + "/gpu.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The GPU runs bf16 activations (the CPU f32): the same bar as the BF16 DiT
  // against the fp32 one (docs/benchmarks.md: bar 2e-2).
  TD_EXPECT_CLOSE(test::compare(io::read_safetensors(dir + "/gpu.safetensors").tensors.at(0).second,
                                io::read_safetensors(dir + "/cpu.safetensors").tensors.at(0).second),
                  2e-2, 0.999);
}

}  // namespace
}  // namespace td
