// Issue 7's remaining switches and issue 9's benchmark on the CPU: the
// patchify / unpatchify and standalone RoPE kernels against direct formulas,
// the Philox random fills, `--default-norm` against the fused path and against
// diffusers, the RoPE table cache, `--attention auto`, random-weight Wan
// checkpoints, the in-process profiler, and `turbodiff bench e2e --model tiny`.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/profile.h"
#include "harness/harness.h"
#include "io/safetensors.h"
#include "kernels/layout/patchify.h"
#include "kernels/random/philox_fill.h"
#include "kernels/rope/qk_norm_rope.h"
#include "kernels/rope/rope_apply.h"
#include "models/wan/wan_attention.h"
#include "models/wan/wan_dit.h"
#include "models/wan/wan_loader.h"
#include "models/wan/wan_random.h"
#include "ops/layout.h"
#include "ops/norm.h"
#include "ops/random.h"
#include "ops/rope.h"
#include "sampling/noise.h"

namespace td {
namespace {

using namespace models::wan;

std::string fixture(const std::string& rel) { return test::source_dir() + "/fixtures/dit/" + rel; }

std::map<std::string, Tensor> read_map(const std::string& path) {
  std::map<std::string, Tensor> m;
  for (auto& [n, t] : io::read_safetensors(path).tensors) m[n] = t;
  return m;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---- patchify / unpatchify ------------------------------------------------------

TEST(Patchify, MatchesTheFormulaOnAwkwardSizesAndRoundTrips) {
  for (auto [B, C, T, H, W, pt, ph, pw] : {std::tuple{2, 3, 3, 6, 10, 1, 2, 2}, {1, 16, 2, 4, 6, 2, 2, 2},
                                          {1, 5, 1, 2, 2, 1, 1, 1}, {3, 2, 4, 6, 9, 2, 3, 3}}) {
    SCOPED_TRACE(cat(B, "x", C, "x", T, "x", H, "x", W, " patch ", pt, "x", ph, "x", pw));
    const Tensor lat = test::randn_tensor({B, C, T, H, W}, DType::F32);
    const int64_t Hp = H / ph, Wp = W / pw, L = (T / pt) * Hp * Wp, F = C * pt * ph * pw;
    for (DType ot : {DType::F32, DType::BF16}) {
      Tensor tok = Tensor::empty({B, L, F}, ot);
      test::poison(tok);
      const kernels::PatchGeometry g{B, C, T, H, W, pt, ph, pw};
      ASSERT_EQ(kernels::patchify_cpu(g, lat.data<float>(), ot == DType::F32 ? kernels::ElemType::F32
                                                                             : kernels::ElemType::BF16,
                                      tok.raw_data()),
                kernels::Status::Ok);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t l = 0; l < L; ++l) {
          const int64_t f = l / (Hp * Wp), h = (l / Wp) % Hp, w = l % Wp;
          int64_t i = 0;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t kt = 0; kt < pt; ++kt)
              for (int64_t kh = 0; kh < ph; ++kh)
                for (int64_t kw = 0; kw < pw; ++kw, ++i) {
                  const double want =
                      lat.item_f64((((b * C + c) * T + f * pt + kt) * H + h * ph + kh) * W + w * pw + kw);
                  const double got = tok.item_f64((b * L + l) * F + i);
                  if (ot == DType::F32)
                    ASSERT_EQ(got, want);
                  else
                    ASSERT_EQ(got, double(bf16_to_f32(f32_to_bf16(float(want)))));
                }
        }
    }
    // unpatchify reads (kt, kh, kw, c) order: feed it the patchify of a latent
    // laid out so that both orders coincide when C == 1, and check the general
    // case against the formula.
    const Tensor tok = test::randn_tensor({B, L, F}, DType::F32);
    Tensor back = ops::unpatchify(tok, T, H, W, pt, ph, pw);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t f = l / (Hp * Wp), h = (l / Wp) % Hp, w = l % Wp;
        int64_t i = 0;
        for (int64_t kt = 0; kt < pt; ++kt)
          for (int64_t kh = 0; kh < ph; ++kh)
            for (int64_t kw = 0; kw < pw; ++kw)
              for (int64_t c = 0; c < C; ++c, ++i)
                ASSERT_EQ(back.item_f64((((b * C + c) * T + f * pt + kt) * H + h * ph + kh) * W + w * pw + kw),
                          tok.item_f64((b * L + l) * F + i));
      }
  }
}

TEST(Patchify, BadArgumentsAreRefused) {
  float x = 0;
  EXPECT_EQ(kernels::patchify_cpu({1, 1, 1, 3, 4, 1, 2, 2}, &x, kernels::ElemType::F32, &x),
            kernels::Status::InvalidArgument);  // H = 3 not a multiple of 2
  EXPECT_EQ(kernels::patchify_cpu({1, 1, 1, 2, 2, 1, 2, 2}, &x, kernels::ElemType::I8, &x),
            kernels::Status::InvalidArgument);
  EXPECT_EQ(kernels::unpatchify_cpu({0, 1, 1, 2, 2, 1, 2, 2}, &x, &x), kernels::Status::InvalidArgument);
  EXPECT_THROW(ops::patchify(Tensor::zeros({1, 1, 1, 3, 4}, DType::F32), 1, 2, 2), Error);
  EXPECT_THROW(ops::unpatchify(Tensor::zeros({1, 5, 4}, DType::F32), 1, 4, 4, 1, 2, 2), Error);
}

// ---- standalone RoPE --------------------------------------------------------------

TEST(RopeApply, RmsNormThenRopeEqualsTheFusedKernelAndTheFormula) {
  for (auto [B, F, Hh, Ww, heads, hd] : {std::tuple{2, 3, 2, 5, 2, 48}, {1, 1, 1, 1, 1, 6}, {1, 2, 3, 3, 3, 64}}) {
    SCOPED_TRACE(cat("B ", B, " grid ", F, "x", Hh, "x", Ww, " heads ", heads, " hd ", hd));
    const ops::PatchGrid grid{F, Hh, Ww};
    const int64_t L = grid.tokens(), dim = heads * hd;
    const Tensor q = test::randn_tensor({B, L, dim}, DType::F32, 2.f);
    const Tensor k = test::randn_tensor({B, L, dim}, DType::F32);
    Tensor w = Tensor::from_f32({dim}, test::randu(size_t(dim), 0.5f, 1.5f));
    const Tensor tables = ops::rope_tables(hd, grid, Device::cpu());
    const ops::QK fused = ops::qk_norm_rope(q, k, w, w, tables, grid, heads, 1e-6f);
    const Tensor qr = ops::rope_apply(ops::rms_norm(q, w, 1e-6f), tables, grid, heads);
    const Tensor kr = ops::rope_apply(ops::rms_norm(k, w, 1e-6f), tables, grid, heads);
    TD_EXPECT_CLOSE(test::compare(qr, fused.q), 1e-6, 0.9999999);
    TD_EXPECT_CLOSE(test::compare(kr, fused.k), 1e-6, 0.9999999);

    // The rotation itself against fp64 angles (Wan's rope_params), on raw q.
    const Tensor r = ops::rope_apply(q, tables, grid, heads);
    const auto ax = kernels::rope_axes(int(hd));
    const int seg[3] = {ax.t, ax.h, ax.w};
    std::vector<double> ref(size_t(B * L * dim)), got(ref.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t pos[3] = {l / (Hh * Ww), (l / Ww) % Hh, l % Ww};
        for (int64_t h = 0; h < heads; ++h) {
          int64_t p = 0;
          for (int a = 0; a < 3; ++a)
            for (int j = 0; j < seg[a] / 2; ++j, ++p) {
              const double ang = double(pos[a]) * std::pow(10000.0, -2.0 * j / seg[a]);
              const int64_t base = ((b * L + l) * heads + h) * hd + 2 * p;
              const int64_t src = (b * L + l) * dim + h * hd + 2 * p;
              const double re = q.item_f64(src), im = q.item_f64(src + 1);
              ref[size_t(base)] = re * std::cos(ang) - im * std::sin(ang);
              ref[size_t(base + 1)] = re * std::sin(ang) + im * std::cos(ang);
            }
        }
      }
    for (size_t i = 0; i < got.size(); ++i) got[i] = r.item_f64(int64_t(i));
    TD_EXPECT_CLOSE(test::compare(got, ref), 1e-6, 0.9999999);
  }
  kernels::RopeApplyArgs bad;
  bad.head_dim = 7;
  EXPECT_EQ(kernels::rope_apply_cpu(bad), kernels::Status::InvalidArgument);
}

// ---- Philox fills -----------------------------------------------------------------

TEST(RandomFill, SameGeneratorAsTheSamplerRangeAndDeterminism) {
  for (uint64_t blk : {0ull, 1ull, 12345678901ull})
    for (uint64_t stream : {0ull, 7ull, (1ull << 40) + 3})
      for (uint64_t seed : {0ull, 42ull, 0xDEADBEEFCAFEull}) {
        const auto a = kernels::philox4x32_10_hd(blk, stream, seed);
        const auto b = sampling::philox4x32_10({uint32_t(blk), uint32_t(blk >> 32), uint32_t(stream),
                                                uint32_t(stream >> 32)},
                                               {uint32_t(seed), uint32_t(seed >> 32)});
        for (int j = 0; j < 4; ++j) ASSERT_EQ(a.v[j], b[size_t(j)]);
      }
  Tensor t = Tensor::empty({1001}, DType::F32), u = Tensor::empty({1001}, DType::F32);
  ops::random_fill_(t, 3, 9, -0.25f, 0.75f);
  ops::random_fill_(u, 3, 9, -0.25f, 0.75f);
  double mean = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    ASSERT_EQ(t.data<float>()[i], u.data<float>()[i]);
    ASSERT_GE(t.data<float>()[i], -0.25f);
    ASSERT_LT(t.data<float>()[i], 0.75f);
    mean += t.data<float>()[i];
  }
  EXPECT_NEAR(mean / double(t.numel()), 0.25, 0.03);
  ops::random_fill_(u, 3, 10, -0.25f, 0.75f);  // another stream: other values
  EXPECT_NE(t.data<float>()[0], u.data<float>()[0]);
  Tensor q = Tensor::empty({4099}, DType::I8);
  ops::random_fill_(q, 1, 2);
  int lo = 0, hi = 0;
  for (int64_t i = 0; i < q.numel(); ++i) lo = std::min<int>(lo, q.data<int8_t>()[i]), hi = std::max<int>(hi, q.data<int8_t>()[i]);
  EXPECT_EQ(lo, -127);
  EXPECT_EQ(hi, 127);
  Tensor h = Tensor::empty({37}, DType::BF16);
  ops::random_fill_(h, 3, 9, -0.25f, 0.75f);
  for (int64_t i = 0; i < 37; ++i) EXPECT_EQ(h.item_f64(i), double(bf16_to_f32(f32_to_bf16(t.data<float>()[i]))));
}

// ---- default norms, RoPE cache ------------------------------------------------------

TEST(WanDefaultNorm, EqualsTheFusedPathAndDiffusers) {
  for (const char* model : {"t2v", "i2v"}) {
    SCOPED_TRACE(model);
    const std::string dir = fixture(std::string(model) + "/");
    auto in = read_map(dir + "inputs.safetensors");
    auto ex = read_map(dir + "expected.safetensors");
    const WanDiT fused(load_wan_checkpoint({dir + "diffusers"}, {}));
    const WanDiT plain(load_wan_checkpoint({dir + "diffusers"}, {}), nn::AttentionKind::Original, 0.1, true);
    EXPECT_TRUE(plain.default_norm());
    EXPECT_FALSE(fused.default_norm());
    const Tensor a = fused.forward(in["latent"], in["timestep"], in["context"]);
    const Tensor b = plain.forward(in["latent"], in["timestep"], in["context"]);
    // fp32 on both paths: the same math in another order of rounding.
    TD_EXPECT_CLOSE(test::compare(b, a), 1e-5, 0.99999999);
    TD_EXPECT_CLOSE(test::compare(b, ex["velocity"]), 1e-5, 0.99999999);
  }
}

TEST(WanDefaultNorm, Bf16StorageStaysWithinTheGpuBar) {
  // The BF16 run dtype on the CPU ops: the default path rounds the modulated
  // norm once more than the fused one; both stay within the GPU bar.
  const std::string dir = fixture("t2v/");
  WanLoadOptions o;
  o.dtype = DType::BF16;
  auto in = read_map(dir + "inputs.safetensors");
  auto ex = read_map(dir + "expected.safetensors");
  const WanDiT plain(load_wan_checkpoint({dir + "turbo.pth"}, o), nn::AttentionKind::Original, 0.1, true);
  TD_EXPECT_CLOSE(test::compare(plain.forward(in["latent"], in["timestep"], in["context"]), ex["velocity"]), 2e-2,
                  0.999);
}

TEST(WanRopeCache, GridsChangeBetweenCallsAndResultsRepeat) {
  WanConfig c;
  c.variant = "tiny";
  c.dim = 64, c.ffn_dim = 96, c.num_heads = 2, c.num_layers = 1, c.text_dim = 16, c.freq_dim = 32;
  RandomWanOptions ro;
  ro.seed = 5;
  const WanDiT m(random_wan_checkpoint(c, ro));
  const Tensor ts = Tensor::from_f32({1}, {300.f});
  const Tensor ctx = test::randn_tensor({1, 3, 16}, DType::F32);
  const Tensor small = test::randn_tensor({1, 16, 1, 4, 6}, DType::F32);
  const Tensor big = test::randn_tensor({1, 16, 2, 6, 4}, DType::F32);
  const Tensor a1 = m.forward(small, ts, ctx), b1 = m.forward(big, ts, ctx), a2 = m.forward(small, ts, ctx),
               b2 = m.forward(big, ts, ctx);
  EXPECT_EQ(test::compare(a2, a1).max_abs, 0.0);
  EXPECT_EQ(test::compare(b2, b1).max_abs, 0.0);
  // A fresh model (cold cache) gives the same numbers.
  const WanDiT m2(random_wan_checkpoint(c, ro));
  EXPECT_EQ(test::compare(m2.forward(big, ts, ctx), b1).max_abs, 0.0);
}

// ---- --attention auto ----------------------------------------------------------------

TEST(AttentionChoice, AutoKeepsTheModelAndSaysWhy) {
  using K = nn::AttentionKind;
  auto c = choose_attention("auto", Device::cpu(), true, false);
  EXPECT_EQ(c.kind, K::Original);
  EXPECT_TRUE(contains(c.reason, "CPU")) << c.reason;
  // No proj_l: original unless the user accepts proj_l = 0, whatever the GPU has.
  c = choose_attention("auto", Device::cuda(0), false, false);
  EXPECT_EQ(c.kind, K::Original);
  EXPECT_TRUE(contains(c.reason, "--allow-zero-proj-l")) << c.reason;
  // With proj_l on CUDA: sagesla when its kernel is built, else sla, else original; always a reason.
  c = choose_attention("auto", Device::cuda(0), true, false);
  std::string why_sage, why_sla;
  const bool sage = attention_available(K::SageSLA, Device::cuda(0), &why_sage);
  const bool sla = attention_available(K::SLA, Device::cuda(0), &why_sla);
  EXPECT_EQ(c.kind, sage ? K::SageSLA : sla ? K::SLA : K::Original) << c.reason;
  if (!sage) EXPECT_TRUE(contains(c.reason, why_sage)) << c.reason;
  EXPECT_TRUE(contains(choose_attention("auto", Device::cuda(0), false, true).reason, "proj_l = 0") ||
              !sage && !sla);
  // Explicit requests pass through (the model refuses what cannot run), proj_l = 0 said.
  c = choose_attention("sla", Device::cpu(), false, false);
  EXPECT_EQ(c.kind, K::SLA);
  EXPECT_TRUE(contains(c.reason, "proj_l = 0")) << c.reason;
  EXPECT_EQ(choose_attention("original", Device::cpu(), true, false).kind, K::Original);
  ErrorKind kind{};
  try {
    choose_attention("fast", Device::cpu(), true, false);
  } catch (const Error& e) {
    kind = e.kind();
  }
  EXPECT_EQ(kind, ErrorKind::Usage);
  EXPECT_TRUE(attention_available(K::SageSLA, Device::cpu()));
}

// ---- random checkpoints --------------------------------------------------------------

TEST(RandomWan, BuildsEveryVariantDeterministically) {
  WanConfig c;
  c.variant = "tiny";
  c.dim = 128, c.ffn_dim = 256, c.num_heads = 2, c.num_layers = 2, c.text_dim = 32, c.freq_dim = 64;
  const Tensor lat = test::randn_tensor({1, 16, 2, 4, 4}, DType::F32);
  const Tensor ts = Tensor::from_f32({1}, {700.f});
  const Tensor ctx = test::randn_tensor({1, 5, 32}, DType::F32);
  RandomWanOptions ro;
  ro.seed = 11;
  WanCheckpoint ck = random_wan_checkpoint(c, ro);
  EXPECT_EQ(ck.tensors.at("blocks.0.self_attn.q.weight").dtype(), DType::F32);
  EXPECT_EQ(ck.tensors.at("blocks.1.modulation").shape(), (Shape{1, 6, 128}));
  EXPECT_FALSE(ck.has_proj_l);
  EXPECT_GT(ck.device_bytes, size_t(0));
  const Tensor v = WanDiT(std::move(ck)).forward(lat, ts, ctx);
  const Tensor v2 = WanDiT(random_wan_checkpoint(c, ro)).forward(lat, ts, ctx);
  EXPECT_EQ(test::compare(v2, v).max_abs, 0.0);
  EXPECT_EQ(test::compare(v, v).nonfinite, size_t(0));
  // Output scale of a sane model: O(1), not exploding.
  double sq = 0;
  for (int64_t i = 0; i < v.numel(); ++i) sq += v.item_f64(i) * v.item_f64(i);
  EXPECT_LT(std::sqrt(sq / double(v.numel())), 100.0);
  EXPECT_GT(std::sqrt(sq / double(v.numel())), 1e-3);
  ro.seed = 12;
  EXPECT_GT(test::compare(WanDiT(random_wan_checkpoint(c, ro)).forward(lat, ts, ctx), v).rel_l2, 0.1);

  for (auto variant : {nn::Int8LinearVariant::Token128, nn::Int8LinearVariant::Block128,
                       nn::Int8LinearVariant::PostScale}) {
    SCOPED_TRACE(nn::int8_linear_variant_name(variant));
    ro.int8_variant = variant;
    ro.with_proj_l = true;
    WanCheckpoint q = random_wan_checkpoint(c, ro);
    EXPECT_EQ(q.int8_weights.size(), size_t(2 * 10));  // 10 block linears per block
    EXPECT_TRUE(q.has_proj_l);
    EXPECT_EQ(q.int8_weights.at("blocks.0.ffn.0").q.dtype(), DType::I8);
    const WanDiT m(std::move(q), nn::AttentionKind::SLA, 0.5);
    EXPECT_TRUE(m.int8_variant().has_value());
    const Tensor vq = m.forward(lat, ts, ctx);
    EXPECT_EQ(test::compare(vq, vq).nonfinite, size_t(0));
  }
}

// ---- profiler --------------------------------------------------------------------------

TEST(Profiler, OffByDefaultOuterScopesOnlyAndClassTotals) {
  EXPECT_FALSE(prof::enabled());
  { const prof::Scope s(prof::OpClass::Gemm, false); }
  prof::enable(false);
  EXPECT_EQ(prof::collect().calls[0], 0);  // nothing recorded while off
  {
    const prof::Scope outer(prof::OpClass::Attention, false);
    const prof::Scope inner(prof::OpClass::Gemm, false);  // nested: not counted
  }
  { const prof::Scope s(prof::OpClass::Norm, false); }
  { const prof::Scope s(prof::OpClass::Norm, false); }
  const prof::Summary s = prof::collect();
  prof::disable();
  EXPECT_EQ(s.calls[size_t(prof::OpClass::Attention)], 1);
  EXPECT_EQ(s.calls[size_t(prof::OpClass::Gemm)], 0);
  EXPECT_EQ(s.calls[size_t(prof::OpClass::Norm)], 2);
  EXPECT_FALSE(prof::enabled());
  EXPECT_STREQ(prof::op_class_name(prof::OpClass::Gemm), "gemm");
}

// ---- CLI -----------------------------------------------------------------------------------

TEST(DitCliSwitches, DefaultNormAutoAndTheirErrors) {
  const std::string out = test::temp_dir() + "/velocity_default_norm.safetensors";
  const std::string base = "dit --weights " + fixture("t2v/turbo.pth") + " --inputs " +
                           fixture("t2v/inputs.safetensors") + " --out " + out + " --device cpu";
  auto r = test::run_cli(base + " --default-norm --attention auto");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "--attention auto: original")) << r.err;
  const io::TensorFile f = io::read_safetensors(out);
  EXPECT_EQ(f.metadata.at("norms"), "default (unfused)");
  TD_EXPECT_CLOSE(test::compare(read_map(out)["velocity"],
                                read_map(fixture("t2v/expected.safetensors"))["velocity"]),
                  1e-5, 0.99999999);
  r = test::run_cli(base + " --allow-zero-proj-l");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "--attention auto")) << r.err;
}

TEST(GenerateCliSwitches, DefaultNormAndAttentionAuto) {
  const std::string base = "generate --dit " + test::source_dir() + "/fixtures/generate/dit --vae " +
                           test::source_dir() + "/fixtures/vae/diffusion_pytorch_model.safetensors --text-encoder " +
                           test::source_dir() + "/fixtures/umt5/hf --tokenizer " + test::source_dir() +
                           "/fixtures/umt5/tokenizer --device cpu --prompt 'a cat' --seed 3 --num-frames 5 --width 64 "
                           "--height 48 --num-steps 1 --quiet";
  const std::string dir = test::temp_dir() + "/gen_switches";
  std::filesystem::create_directories(dir + "_a");
  std::filesystem::create_directories(dir + "_b");
  auto r = test::run_cli(base + " --default-norm --attention auto -o " + dir + "_a/f_%04d.png");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "--attention auto: original")) << r.err;
  // --json names the attention auto resolved to, not "auto".
  r = test::run_cli(base + " --attention auto --json -o " + dir + "_a/g_%04d.png");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["attention"], "original") << r.out;
  r = test::run_cli(base + " --allow-zero-proj-l -o " + dir + "_b/f_%04d.png");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "--attention auto")) << r.err;
}

TEST(BenchE2eCli, TinyModelRunsEveryStageAndWritesJson) {
  const std::string js = test::temp_dir() + "/bench_e2e_tiny.json";
  auto r = test::run_cli("bench e2e --model tiny --device cpu --forwards 2 --warmup 1 --profile --json " + js);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "stage")) << r.err;
  std::ifstream f(js);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["model_name"], "tiny");
  EXPECT_EQ(j["frames"], 5);
  EXPECT_EQ(j["latent"], nlohmann::json::array({1, 16, 2, 8, 8}));
  ASSERT_EQ(j["stages"].size(), 4u);
  const auto& a = j["stages"][0];
  const auto& c = j["stages"][2];
  const auto& d = j["stages"][3];
  EXPECT_EQ(a["forwards"], 100);
  EXPECT_EQ(a["norms"], "default (unfused)");
  EXPECT_EQ(c["forwards"], 4);
  EXPECT_EQ(c["forward_ms"], j["stages"][1]["forward_ms"]);  // c reuses b's forward
  EXPECT_TRUE(c.contains("sampler_s"));
  EXPECT_TRUE(d["ran"].get<bool>());
  EXPECT_EQ(d["attention"], "sagesla topk 0.1");  // the fp32 reference on the CPU
  EXPECT_EQ(d["forward_ms_all"].size(), 2u);
  for (const auto& s : j["stages"]) {
    EXPECT_GT(s["forward_ms"].get<double>(), 0.0);
    EXPECT_NEAR(s["diffusion_s"].get<double>(),
                s["forward_ms"].get<double>() * s["forwards"].get<double>() / 1000.0, 1e-9);
  }
  EXPECT_TRUE(j["vae"]["available"].get<bool>()) << j["vae"].dump();
  EXPECT_TRUE(j["text_encoder"]["available"].get<bool>()) << j["text_encoder"].dump();
  ASSERT_TRUE(j.contains("profile"));
  EXPECT_EQ(j["profile"]["stage"], "d");
  EXPECT_GT(j["profile"]["classes"]["gemm"]["calls"].get<int>(), 0);
  EXPECT_GT(j["profile"]["classes"]["attention"]["calls"].get<int>(), 0);
  EXPECT_GT(j["profile"]["classes"]["norm"]["calls"].get<int>(), 0);

  // Issue 7's switch matrix: every combination runs on the CPU (the fp32 SLA reference for sla / sagesla).
  const std::string sw = test::temp_dir() + "/bench_e2e_switches.json";
  r = test::run_cli("bench e2e --model tiny --device cpu --switches --forwards 1 --warmup 0 --no-vae "
                    "--no-text-encoder --json " + sw);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream fs(sw);
  const nlohmann::json m = nlohmann::json::parse(fs);
  EXPECT_EQ(m["mode"], "switches");
  ASSERT_EQ(m["stages"].size(), 12u);
  for (const auto& s : m["stages"]) EXPECT_TRUE(s["ran"].get<bool>()) << s.dump();
  EXPECT_EQ(m["stages"][11]["stage"], "w8a8-fused-sagesla");

  r = test::run_cli("bench e2e --model tiny --stages a,x --device cpu");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "unknown stage")) << r.err;
  r = test::run_cli("bench e2e --model huge --device cpu");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "Wan2.1-1.3B")) << r.err;
  r = test::run_cli("bench e2e --model tiny --frames 6 --device cpu");
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace
}  // namespace td
