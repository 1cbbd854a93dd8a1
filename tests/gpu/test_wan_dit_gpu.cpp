// The Wan DiT on CUDA: the cuBLASLt Linear and the attention op against their
// CPU references, then the BF16 forward of every fixture layout against
// diffusers (fixtures/dit, written by scripts/make_dit_fixtures.py) and the
// CLI with --device cuda.
//
// Tolerances: a BF16 GEMM with fp32 accumulation differs from the fp32 CPU
// GEMM of the same (bf16-exact) inputs by the one rounding of its bf16
// output (rel L2 ~2e-3; fp32 output: ~1e-6). The whole BF16 forward differs
// from diffusers' fp32 forward by bf16 activations everywhere: the CPU's BF16
// emulation of the same graph lands at ~2.5e-3 on the t2v fixture; the bar
// is the 2e-2.
#include <filesystem>

#include "harness/harness.h"
#include "io/safetensors.h"
#include "models/wan/wan_dit.h"
#include "models/wan/wan_loader.h"
#include "ops/attention.h"
#include "ops/linear.h"

namespace td {
namespace {

using namespace models::wan;

std::string fixture(const std::string& rel) { return test::source_dir() + "/fixtures/dit/" + rel; }

std::map<std::string, Tensor> read_map(const std::string& path) {
  std::map<std::string, Tensor> m;
  for (auto& [n, t] : io::read_safetensors(path).tensors) m[n] = t;
  return m;
}

TEST(LinearGpu, CublasLtMatchesCpuGemm) {
  TD_REQUIRE_GPU();
  struct Shape3 {
    int64_t m, n, k;
  };
  for (const Shape3 s : {Shape3{1, 96, 40}, Shape3{45, 160, 96}, Shape3{333, 1536, 1536}, Shape3{7, 13824, 5120}}) {
    SCOPED_TRACE(cat("M ", s.m, " N ", s.n, " K ", s.k));
    const Tensor x = test::randn_tensor({s.m, s.k}, DType::BF16);
    const Tensor w = test::randn_tensor({s.n, s.k}, DType::BF16, 0.05f);
    const Tensor b16 = test::randn_tensor({s.n}, DType::BF16);
    const Tensor b32 = b16.to(DType::F32);
    const Tensor ref = ops::linear(x.to(DType::F32), w.to(DType::F32), b32, DType::F32);  // CPU fp32
    const Tensor xd = x.to(Device::cuda()), wd = w.to(Device::cuda());
    // bf16 out with the bf16 bias fused in the epilogue; f32 bias added by a second kernel; f32 out.
    TD_EXPECT_CLOSE(test::compare(ops::linear(xd, wd, b16.to(Device::cuda())), ref), 6e-3, 0.9999);
    TD_EXPECT_CLOSE(test::compare(ops::linear(xd, wd, b32.to(Device::cuda())), ref), 6e-3, 0.9999);
    TD_EXPECT_CLOSE(test::compare(ops::linear(xd, wd, b32.to(Device::cuda()), DType::F32), ref), 1e-5, 0.999999);
  }
  // F32 x F32 (the time embedding and head run this way): no TF32.
  const Tensor x = test::randn_tensor({3, 256}, DType::F32), w = test::randn_tensor({1536, 256}, DType::F32, 0.05f);
  const Tensor b = test::randn_tensor({1536}, DType::F32);
  TD_EXPECT_CLOSE(test::compare(ops::linear(x.to(Device::cuda()), w.to(Device::cuda()), b.to(Device::cuda())),
                                ops::linear(x, w, b)),
                  1e-6, 0.9999999);
  // Strided rows (a column slice of a wider activation).
  const Tensor wide = test::randn_tensor({37, 3 * 96}, DType::BF16);
  const Tensor ws = test::randn_tensor({64, 96}, DType::BF16, 0.1f);
  const Tensor got = ops::linear(wide.to(Device::cuda()).slice(1, 96, 192), ws.to(Device::cuda()), Tensor(), DType::F32);
  TD_EXPECT_CLOSE(test::compare(got, ops::linear(wide.slice(1, 96, 192).to(DType::F32), ws.to(DType::F32), Tensor())),
                  1e-5, 0.999999);
}

TEST(AttentionGpu, MatchesCpuReferenceOnWanShapes) {
  TD_REQUIRE_GPU();
  // head_dim 48 and 24 (the fixtures), 128 (Wan); self (L = Lk) and cross (Lk = 12).
  for (auto [B, L, Lk, H, D] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{2, 45, 45, 2, 48},
                                {2, 45, 12, 2, 48}, {1, 12, 7, 2, 24}, {1, 1000, 1000, 12, 128}, {2, 333, 512, 4, 128}}) {
    SCOPED_TRACE(cat("B ", B, " L ", L, " Lk ", Lk, " H ", H, " D ", D));
    const Tensor q = test::randn_tensor({B, L, H, D}, DType::BF16);
    const Tensor k = test::randn_tensor({B, Lk, H, D}, DType::BF16);
    const Tensor v = test::randn_tensor({B, Lk, H, D}, DType::BF16);
    const Tensor ref = ops::attention(q, k, v, {}, DType::F32);
    Tensor got;
    try {
      got = ops::attention(q.to(Device::cuda()), k.to(Device::cuda()), v.to(Device::cuda()));
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    std::printf("attention B%lld L%lld Lk%lld H%lld D%lld: backend %s\n", (long long)B, (long long)L, (long long)Lk,
                (long long)H, (long long)D, ops::attention_last_backend().c_str());
    TD_EXPECT_CLOSE(test::compare(got, ref), 1e-2, 0.9999);
  }
}

struct Case {
  const char* model;
  const char* weights;
  const char* expected;
};

// gtest prints the case by its paths, not its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << "/" << c.weights << " vs " << c.expected; }

class WanDiTGpu : public ::testing::TestWithParam<Case> {};

TEST_P(WanDiTGpu, Bf16ForwardMatchesDiffusers) {
  TD_REQUIRE_GPU();
  const Case c = GetParam();
  const std::string dir = fixture(std::string(c.model) + "/");
  WanLoadOptions o;
  o.device = Device::cuda();
  o.dtype = DType::BF16;
  WanCheckpoint ck = load_wan_checkpoint({dir + c.weights}, o);
  // Matmul weights in bf16 on the GPU; modulation, norms, time embedding and head in f32.
  EXPECT_EQ(ck.tensors.at("blocks.0.self_attn.q.weight").dtype(), DType::BF16);
  EXPECT_TRUE(ck.tensors.at("blocks.0.self_attn.q.weight").device().is_cuda());
  EXPECT_EQ(ck.tensors.at("blocks.0.modulation").dtype(), DType::F32);
  EXPECT_EQ(ck.tensors.at("head.head.weight").dtype(), DType::F32);
  EXPECT_EQ(ck.tensors.at("time_projection.1.weight").dtype(), DType::F32);
  const WanDiT model(std::move(ck));
  auto in = read_map(dir + "inputs.safetensors");
  auto ex = read_map(dir + "expected.safetensors");
  const Tensor v = model.forward(in["latent"], in["timestep"], in["context"]);
  ASSERT_TRUE(v.device().is_cuda());
  ASSERT_EQ(v.shape(), ex[c.expected].shape());
  const auto acc = test::compare(v, ex[c.expected]);
  std::printf("%s/%s: %s\n", c.model, c.weights, acc.str().c_str());
  TD_EXPECT_CLOSE(acc, 2e-2, 0.999);

  // Inputs already on the GPU give the same result.
  const Tensor v2 = model.forward(in["latent"].to(Device::cuda()), in["timestep"].to(Device::cuda()),
                                  in["context"].to(Device::cuda()));
  EXPECT_EQ(test::compare(v2, v).max_abs, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, WanDiTGpu,
                         ::testing::Values(Case{"t2v", "diffusers", "velocity"},
                                           Case{"t2v", "wan_original.safetensors", "velocity"},
                                           Case{"t2v", "turbo.pth", "velocity"},
                                           Case{"t2v", "turbo_quant.pth", "velocity_int8"},
                                           Case{"i2v", "diffusers", "velocity"},
                                           Case{"i2v", "wan_original.pth", "velocity"}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string n = std::string(i.param.model) + "_" + i.param.weights;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(WanDiTGpu, CliDeviceCuda) {
  TD_REQUIRE_GPU();
  const std::string out = test::temp_dir() + "/velocity_gpu.safetensors";
  auto r = test::run_cli("dit --weights " + fixture("t2v/turbo.pth") + " --inputs " + fixture("t2v/inputs.safetensors") +
                         " --out " + out + " --device cuda");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("cuda"), std::string::npos) << r.out;
  TD_EXPECT_CLOSE(test::compare(read_map(out)["velocity"], read_map(fixture("t2v/expected.safetensors"))["velocity"]),
                  2e-2, 0.999);
  r = test::run_cli("dit --weights " + fixture("t2v/turbo.pth") + " --inputs " + fixture("t2v/inputs.safetensors") +
                    " --out " + out + " --device cuda --dtype f32");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("bf16"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace td
