// The umT5 encoder on CUDA: the T5 attention kernel against its CPU
// reference, then the forward (bf16 linears through cuBLASLt, CUDA norms,
// activations and attention) against
// transformers' fp32 UMT5EncoderModel (fixtures/umt5) and against the same
// bf16 graph emulated on the host, then `encode-text --device cuda`.
//
// Tolerances: the host bf16 emulation is at ~8.5e-3 rel L2 from fp32
// transformers on this fixture; the bar is the 2e-2. CUDA vs the
// host emulation differ only in the rounding order inside the GEMMs and
// kernels (bf16 outputs rounding differently near ties): 1e-2. The attention
// kernel on bf16 inputs against the fp32 reference on the same (bf16-exact)
// inputs: fp32 math in both, so ~1e-6 with fp32 output and one bf16
// rounding (~2e-3) with bf16 output.
#include <filesystem>

#include "harness/harness.h"
#include "io/safetensors.h"
#include "models/umt5/umt5_encoder.h"
#include "models/umt5/umt5_loader.h"
#include "ops/t5_attention.h"

namespace td {
namespace {

using namespace models::umt5;

std::string fixture(const std::string& rel) { return test::source_dir() + "/fixtures/umt5/" + rel; }

std::map<std::string, Tensor> read_map(const std::string& path) {
  std::map<std::string, Tensor> m;
  for (auto& [n, t] : io::read_safetensors(path).tensors) m[n] = t;
  return m;
}

TEST(UMT5Gpu, AttentionKernelMatchesCpu) {
  TD_REQUIRE_GPU();
  auto& g = test::rng();
  // Awkward sizes: L not a multiple of the 128-thread block, D above 64, a
  // short padded sample; and umT5-XXL's head shape at L = 512.
  struct Case { int64_t B, L, H, D; };
  for (const Case c : {Case{3, 301, 5, 80}, Case{1, 512, 64, 64}}) {
    const int64_t NB = 32;
    const Tensor q = test::randn_tensor({c.B, c.L, c.H, c.D}, DType::BF16, 0.3f),
                 k = test::randn_tensor({c.B, c.L, c.H, c.D}, DType::BF16, 0.3f),
                 v = test::randn_tensor({c.B, c.L, c.H, c.D}, DType::BF16),
                 table = test::randn_tensor({NB, c.H}, DType::F32, 2.f);
    std::vector<int32_t> buckets(size_t(2 * c.L - 1));
    for (auto& x : buckets) x = int32_t(g() % NB);
    Tensor mask = Tensor::zeros({c.B, c.L}, DType::I64);
    for (int64_t b = 0; b < c.B; ++b) {
      const int64_t n = b == 0 ? c.L : 1 + int64_t(g() % c.L);
      for (int64_t j = 0; j < n; ++j) mask.data<int64_t>()[b * c.L + j] = 1;
    }
    const Tensor ref = ops::t5_attention(q, k, v, table, buckets, mask, DType::F32);
    const Device dev = Device::cuda(0);
    const Tensor qd = q.to(dev), kd = k.to(dev), vd = v.to(dev), table_d = table.to(dev);
    Tensor out32 = ops::t5_attention(qd, kd, vd, table_d, buckets, mask, DType::F32);
    Tensor out16 = ops::t5_attention(qd, kd, vd, table_d, buckets, mask);
    ASSERT_TRUE(out32.device().is_cuda());
    TD_EXPECT_CLOSE(test::compare(out32.to(Device::cpu()), ref), 1e-5, 0.99999);
    TD_EXPECT_CLOSE(test::compare(out16.to(Device::cpu()), ref), 5e-3, 0.9999);
  }
}

TEST(UMT5Gpu, Bf16ForwardMatchesTransformers) {
  TD_REQUIRE_GPU();
  const auto expected = read_map(fixture("expected.safetensors"));
  for (const std::string layout : {"wan_umt5.pth", "hf"}) {
    UMT5LoadOptions o;
    o.dtype = DType::BF16;
    const Tensor host_bf16 =
        UMT5Encoder(load_umt5(fixture(layout), o)).forward(expected.at("input_ids"), expected.at("attention_mask"));
    o.device = Device::cuda(0);
    const UMT5Encoder enc(load_umt5(fixture(layout), o));
    ASSERT_TRUE(enc.weights().layers[0].q.device().is_cuda());
    Tensor out = enc.forward(expected.at("input_ids"), expected.at("attention_mask"));
    ASSERT_TRUE(out.device().is_cuda());
    out = out.to(Device::cpu());
    TD_EXPECT_CLOSE(test::compare(out, expected.at("last_hidden_state")), 2e-2, 0.999);
    TD_EXPECT_CLOSE(test::compare(out, host_bf16), 1e-2, 0.9999);
  }
}

TEST(UMT5Gpu, EncodeTextCliOnCuda) {
  TD_REQUIRE_GPU();
  const std::string out = test::temp_dir() + "/emb.safetensors";
  const auto r = test::run_cli("encode-text --text-encoder " + fixture("hf") + " --tokenizer " + fixture("tokenizer") +
                               " --prompt 'A cat sits on a red chair in the sun.' --out " + out + " --device cuda");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto got = read_map(out);
  const auto expected = read_map(fixture("expected.safetensors"));
  ASSERT_EQ(got.at("context").shape(), Shape({1, 512, 64}));
  EXPECT_EQ(got.at("context_lens").data<int64_t>()[0], expected.at("context_lens").data<int64_t>()[0]);
  TD_EXPECT_CLOSE(test::compare(got.at("context"), expected.at("context").slice(0, 0, 1).contiguous()), 2e-2, 0.999);
}

}  // namespace
}  // namespace td
