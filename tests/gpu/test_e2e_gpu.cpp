// The CUDA side of issue 7's switches and issue 9's benchmark: patchify /
// unpatchify and the standalone RoPE kernels against their CPU references
// (poisoned outputs, awkward sizes), the Philox fills bit for bit against the
// CPU, `--default-norm` on the BF16 DiT against diffusers and against the fused
// path, the device-side patchify in the forward, and `bench e2e --model tiny`
// on the GPU.
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/cuda_runtime.h"
#include "harness/harness.h"
#include "io/safetensors.h"
#include "kernels/layout/patchify.h"
#include "kernels/rope/rope_apply.h"
#include "models/wan/wan_dit.h"
#include "models/wan/wan_loader.h"
#include "models/wan/wan_random.h"
#include "ops/common.h"
#include "ops/layout.h"
#include "ops/random.h"
#include "ops/rope.h"

#if TURBODIFF_HAVE_CUDA

namespace td {
namespace {

using namespace models::wan;

std::string fixture(const std::string& rel) { return test::source_dir() + "/fixtures/dit/" + rel; }

std::map<std::string, Tensor> read_map(const std::string& path) {
  std::map<std::string, Tensor> m;
  for (auto& [n, t] : io::read_safetensors(path).tensors) m[n] = t;
  return m;
}

TEST(PatchifyGpu, EqualsTheCpuReferenceExactly) {
  TD_REQUIRE_GPU();
  // Wan-1.3B 480p's latent and awkward ones.
  for (auto [B, C, T, H, W, pt, ph, pw] : {std::tuple{1, 16, 21, 60, 104, 1, 2, 2}, {2, 3, 3, 6, 10, 1, 2, 2},
                                          {3, 2, 4, 6, 9, 2, 3, 3}, {1, 36, 1, 2, 2, 1, 2, 2}}) {
    SCOPED_TRACE(cat(B, "x", C, "x", T, "x", H, "x", W, " patch ", pt, "x", ph, "x", pw));
    const kernels::PatchGeometry g{B, C, T, H, W, pt, ph, pw};
    const Tensor lat = test::randn_tensor({B, C, T, H, W}, DType::F32);
    const Tensor dlat = lat.to(Device::cuda());
    const int64_t L = (T / pt) * (H / ph) * (W / pw), F = C * pt * ph * pw;
    for (DType ot : {DType::F32, DType::BF16}) {
      const auto et = ot == DType::F32 ? kernels::ElemType::F32 : kernels::ElemType::BF16;
      Tensor ref = Tensor::empty({B, L, F}, ot);
      ASSERT_EQ(kernels::patchify_cpu(g, lat.data<float>(), et, ref.raw_data()), kernels::Status::Ok);
      Tensor out = Tensor::empty({B, L, F}, ot, Device::cuda());
      test::poison(out);
      ASSERT_EQ(kernels::patchify_cuda(g, dlat.data<float>(), et, out.raw_data(), cuda::current_stream()),
                kernels::Status::Ok);
      const auto acc = test::compare(out, ref);
      EXPECT_EQ(acc.max_abs, 0.0) << acc.str();
      EXPECT_EQ(acc.nonfinite, size_t(0));
    }
    const Tensor tok = test::randn_tensor({B, L, F}, DType::F32);
    Tensor ref = Tensor::empty({B, C, T, H, W}, DType::F32);
    ASSERT_EQ(kernels::unpatchify_cpu(g, tok.data<float>(), ref.data<float>()), kernels::Status::Ok);
    Tensor out = Tensor::empty({B, C, T, H, W}, DType::F32, Device::cuda());
    test::poison(out);
    const Tensor dtok = tok.to(Device::cuda());
    ASSERT_EQ(kernels::unpatchify_cuda(g, dtok.data<float>(), out.data<float>(), cuda::current_stream()),
              kernels::Status::Ok);
    const auto acc = test::compare(out, ref);
    EXPECT_EQ(acc.max_abs, 0.0) << acc.str();
    EXPECT_EQ(acc.nonfinite, size_t(0));
  }
}

TEST(RopeApplyGpu, MatchesTheCpuReference) {
  TD_REQUIRE_GPU();
  // fp32 out: the same products and one add per value (no FMA on the GPU side:
  // __fmul_rn / __fadd_rn), so equal to a few ulp at most (bar 1e-6 relative
  // L2); bf16 out: both round once (an element may straddle a rounding
  // boundary: bar 2e-3).
  for (auto [B, F, Hh, Ww, heads, hd, pad] : {std::tuple{1, 21, 30, 52, 12, 128, 0}, {2, 3, 2, 5, 3, 48, 8},
                                             {1, 1, 1, 1, 1, 6, 2}, {1, 2, 3, 3, 5, 64, 0}}) {
    SCOPED_TRACE(cat("B ", B, " grid ", F, "x", Hh, "x", Ww, " heads ", heads, " hd ", hd, " pad ", pad));
    const ops::PatchGrid grid{F, Hh, Ww};
    const int64_t L = grid.tokens(), dim = heads * hd, ld = dim + pad;
    for (DType it : {DType::BF16, DType::F32})
      for (DType ot : {DType::BF16, DType::F32}) {
        SCOPED_TRACE(cat(dtype_name(it), " -> ", dtype_name(ot)));
        const Tensor x = test::randn_tensor({B, L, ld}, it);
        const Tensor dx = x.to(Device::cuda());
        const Tensor tables = ops::rope_tables(hd, grid, Device::cpu());
        const Tensor dtables = tables.to(Device::cuda());
        kernels::RopeApplyArgs a;
        a.in_type = ops::elem_type(it, "test", "x");
        a.out_type = ops::elem_type(ot, "test", "out");
        a.ld_in = ld;
        a.batch = B, a.frames = F, a.height = Hh, a.width = Ww, a.heads = int(heads), a.head_dim = int(hd);
        Tensor ref = Tensor::empty({B, L, heads, hd}, ot);
        a.in = x.raw_data();
        a.out = ref.raw_data();
        a.tables = tables.data<float>();
        ASSERT_EQ(kernels::rope_apply_cpu(a), kernels::Status::Ok);
        Tensor out = Tensor::empty({B, L, heads, hd}, ot, Device::cuda());
        test::poison(out);
        a.in = dx.raw_data();
        a.out = out.raw_data();
        a.tables = dtables.data<float>();
        ASSERT_EQ(kernels::rope_apply_cuda(a, cuda::current_stream()), kernels::Status::Ok);
        const auto acc = test::compare(out, ref);
        if (ot == DType::F32) {
          TD_EXPECT_CLOSE(acc, 1e-6, 0.9999999);
        } else {
          TD_EXPECT_CLOSE(acc, 2e-3, 0.99999);
        }
        EXPECT_EQ(acc.nonfinite, size_t(0));
      }
  }
}

TEST(RandomFillGpu, BitForBitTheCpuValues) {
  TD_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I8})
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(4099), int64_t(1) << 20}) {
      SCOPED_TRACE(cat(dtype_name(dt), " n ", n));
      Tensor h = Tensor::empty({n}, dt);
      Tensor d = Tensor::empty({n}, dt, Device::cuda());
      test::poison(d);
      ops::random_fill_(h, 77, 3, -0.3f, 0.9f);
      ops::random_fill_(d, 77, 3, -0.3f, 0.9f);
      const Tensor back = d.to(Device::cpu());
      ASSERT_EQ(std::memcmp(back.raw_data(), h.raw_data(), h.nbytes()), 0);
    }
}

TEST(WanDefaultNormGpu, Bf16MatchesDiffusersAndTheFusedPath) {
  TD_REQUIRE_GPU();
  for (const char* model : {"t2v", "i2v"}) {
    SCOPED_TRACE(model);
    const std::string dir = fixture(std::string(model) + "/");
    WanLoadOptions o;
    o.device = Device::cuda();
    o.dtype = DType::BF16;
    auto in = read_map(dir + "inputs.safetensors");
    auto ex = read_map(dir + "expected.safetensors");
    const WanDiT fused(load_wan_checkpoint({dir + "diffusers"}, o));
    const WanDiT plain(load_wan_checkpoint({dir + "diffusers"}, o), nn::AttentionKind::Original, 0.1, true);
    const Tensor a = fused.forward(in["latent"], in["timestep"], in["context"]);
    const Tensor b = plain.forward(in["latent"], in["timestep"], in["context"]);
    ASSERT_TRUE(b.device().is_cuda());
    const auto acc = test::compare(b, ex["velocity"]);
    std::printf("%s default-norm BF16 vs diffusers: %s; vs fused: %s\n", model, acc.str().c_str(),
                test::compare(b, a).str().c_str());
    TD_EXPECT_CLOSE(acc, 2e-2, 0.999);
    TD_EXPECT_CLOSE(test::compare(b, a), 2e-2, 0.999);
    // Inputs already on the device (f32 latent: the device patchify path, no host copy) give the same result.
    const Tensor b2 = plain.forward(in["latent"].to(Device::cuda()), in["timestep"], in["context"].to(Device::cuda()));
    EXPECT_EQ(test::compare(b2, b).max_abs, 0.0);
  }
}

TEST(RandomWanGpu, SameWeightsAsTheCpuAndAForwardThatRuns) {
  TD_REQUIRE_GPU();
  WanConfig c;
  c.variant = "tiny";
  c.dim = 128, c.ffn_dim = 256, c.num_heads = 2, c.num_layers = 2, c.text_dim = 32, c.freq_dim = 64;
  RandomWanOptions ro;
  ro.seed = 3;
  WanCheckpoint h = random_wan_checkpoint(c, ro);
  ro.device = Device::cuda();
  ro.dtype = DType::BF16;
  ro.int8_variant = nn::Int8LinearVariant::Token128;
  WanCheckpoint d = random_wan_checkpoint(c, ro);
  // f32 tensors (modulation, norms, head) are bit-identical to the host ones.
  for (const char* n : {"blocks.1.modulation", "head.head.weight", "blocks.0.norm3.bias"})
    EXPECT_EQ(test::compare(d.tensors.at(n), h.tensors.at(n)).max_abs, 0.0) << n;
  const WanDiT m(std::move(d));
  const Tensor lat = test::randn_tensor({1, 16, 3, 8, 12}, DType::F32);
  const Tensor v = m.forward(lat, Tensor::from_f32({1}, {400.f}), test::randn_tensor({1, 7, 32}, DType::F32));
  EXPECT_TRUE(v.device().is_cuda());
  EXPECT_EQ(test::compare(v, v).nonfinite, size_t(0));
}

// The W8A8 forward's norms that only feed INT8 linears write their codes
// directly (ops::residual_gate_norm_quantized) where a block has enough
// tokens for the INT8 kernels (>= kInt8LinearMinRowsCuda): the velocity must
// equal, bit for bit, the forward with the norm and the quantizer apart
// (TURBODIFF_FUSED_NORM_QUANT=0). A random token128 model of width 1536 (a
// Wan-1.3B block's, 12 heads of 128) at 2304 tokens, original and sagesla
// attention.
TEST(RandomWanGpu, FusedNormQuantizeForwardEqualsTheSeparateOps) {
  TD_REQUIRE_GPU();
  WanConfig c;
  c.variant = "tiny";
  c.dim = 1536, c.ffn_dim = 1024, c.num_heads = 12, c.num_layers = 2, c.text_dim = 32, c.freq_dim = 64;
  for (const nn::AttentionKind kind : {nn::AttentionKind::Original, nn::AttentionKind::SageSLA}) {
    RandomWanOptions ro;
    ro.seed = 5;
    ro.device = Device::cuda();
    ro.dtype = DType::BF16;
    ro.int8_variant = nn::Int8LinearVariant::Token128;
    ro.with_proj_l = kind == nn::AttentionKind::SageSLA;
    const WanDiT m(random_wan_checkpoint(c, ro), kind, 0.2);
    const Tensor lat = test::randn_tensor({1, 16, 4, 48, 48}, DType::F32);  // 4 x 24 x 24 = 2304 tokens
    const Tensor t = Tensor::from_f32({1}, {400.f}), ctx = test::randn_tensor({1, 7, 32}, DType::F32);
    const Tensor fused = m.forward(lat, t, ctx);
    setenv("TURBODIFF_FUSED_NORM_QUANT", "0", 1);
    const Tensor apart = m.forward(lat, t, ctx);
    unsetenv("TURBODIFF_FUSED_NORM_QUANT");
    const auto acc = test::compare(fused, apart);
    EXPECT_EQ(acc.nonfinite, size_t(0));
    EXPECT_EQ(acc.max_abs, 0.0) << nn::attention_kind_name(kind) << ": " << acc.str();
  }
}

TEST(BenchE2eGpu, TinyModelOnTheGpu) {
  TD_REQUIRE_GPU();
  const std::string js = test::temp_dir() + "/bench_e2e_tiny_gpu.json";
  auto r = test::run_cli("bench e2e --model tiny --device cuda --forwards 2 --profile --json " + js);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream f(js);
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j["stages"].size(), 4u);
  for (const auto& s : j["stages"]) {
    if (!s["ran"].get<bool>()) {
      // Only stage d may be refused (no sagesla/sla kernel), and then it says why.
      EXPECT_EQ(s["stage"], "d");
      EXPECT_TRUE(s.contains("attention_refused")) << s.dump();
      continue;
    }
    EXPECT_GT(s["forward_ms"].get<double>(), 0.0);
    EXPECT_GT(s["peak_gpu_bytes"].get<size_t>(), size_t(0));
  }
  EXPECT_TRUE(j.contains("gpu"));
  std::printf("%s\n", r.err.c_str());
}

}  // namespace
}  // namespace td

#endif  // TURBODIFF_HAVE_CUDA
