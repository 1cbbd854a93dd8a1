// The Wan DiT on the CPU: the fp32 GEMM and the Linear / attention / RoPE ops
// it is built from, key maps and configs, the loader (every checkpoint layout,
// every problem named), the forward against diffusers' WanTransformer3DModel
// on tiny random models (fixtures/dit, scripts/make_dit_fixtures.py), and
// `turbodiff dit` end to end.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "harness/harness.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "kernels/gemm_f32/gemm_f32.h"
#include "models/wan/wan_config.h"
#include "models/wan/wan_dit.h"
#include "models/wan/wan_keys.h"
#include "models/wan/wan_loader.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/rope.h"

namespace td {
namespace {

namespace fs = std::filesystem;
using models::KeyLayout;
using namespace models::wan;

std::string fixture(const std::string& rel) { return test::source_dir() + "/fixtures/dit/" + rel; }

std::map<std::string, Tensor> read_map(const std::string& path) {
  std::map<std::string, Tensor> m;
  for (auto& [n, t] : io::read_safetensors(path).tensors) m[n] = t;
  return m;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs f and returns the td::Error message it throws ("" when it does not throw).
template <typename F>
std::string error_of(F&& f, ErrorKind* kind = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (kind) *kind = e.kind();
    return e.what();
  }
  return "";
}

// ---- fp32 GEMM and the Linear op ---------------------------------------------

// y[m, n] = sum_k x[m, k] w[n, k] + b[n], in double.
std::vector<double> linear_ref(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t K = w.size(1), N = w.size(0), M = x.numel() / x.size(-1);
  const Tensor xc = x.contiguous(), wc = w.contiguous();
  std::vector<double> y(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = b.defined() ? b.item_f64(n) : 0.0;
      for (int64_t k = 0; k < K; ++k) s += xc.item_f64(m * K + k) * wc.item_f64(n * K + k);
      y[size_t(m * N + n)] = s;
    }
  return y;
}

std::vector<double> as_doubles(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<double> v(size_t(c.numel()));
  for (int64_t i = 0; i < c.numel(); ++i) v[size_t(i)] = c.item_f64(i);
  return v;
}

TEST(GemmF32, MatchesFp64OnAwkwardBlockedSizes) {
  // M, N, K straddle the 8x8 register tile and the 128/256 cache blocks; strided rows;
  // the portable kernel and (where the CPU has it) the AVX2 one.
  for (const bool portable : {true, false})
  for (auto [M, N, K] : {std::tuple{37, 45, 300}, {1, 7, 3}, {130, 129, 513}, {5, 200, 16}}) {
    SCOPED_TRACE(cat(portable ? "portable" : (kernels::gemm_f32_has_avx2() ? "avx2" : "portable"), " M ", M, " N ",
                     N, " K ", K));
    Tensor abase = test::randn_tensor({M, K + 3}, DType::F32);
    Tensor a = abase.slice(1, 0, K);
    Tensor w = test::randn_tensor({N, K}, DType::BF16);
    Tensor bias = test::randn_tensor({N}, DType::F32);
    Tensor c = Tensor::empty({M, N}, DType::F32);
    test::poison(c);
    kernels::GemmF32Params p;
    p.m = M, p.n = N, p.k = K;
    p.a = a.raw_data(), p.a_type = kernels::ElemType::F32, p.lda = K + 3;
    p.w = w.raw_data(), p.w_type = kernels::ElemType::BF16, p.ldw = K;
    p.bias = bias.raw_data();
    p.c = c.raw_data(), p.ldc = N;
    p.force_portable = portable;
    ASSERT_EQ(kernels::gemm_f32_cpu(p), kernels::Status::Ok);
    TD_EXPECT_CLOSE(test::compare(as_doubles(c), linear_ref(a, w, bias)), 1e-6, 0.9999999);
  }
}

TEST(GemmF32, RejectsBadArguments) {
  kernels::GemmF32Params p;
  p.m = 4, p.n = 4, p.k = 8;
  float buf[64] = {};
  p.a = p.w = buf;
  p.c = buf + 32;
  p.lda = 8, p.ldw = 8, p.ldc = 4;
  EXPECT_EQ(kernels::gemm_f32_check(p), kernels::Status::Ok);
  p.lda = 7;
  EXPECT_EQ(kernels::gemm_f32_check(p), kernels::Status::InvalidArgument);
  p.lda = 8, p.c_type = kernels::ElemType::I8;
  EXPECT_EQ(kernels::gemm_f32_check(p), kernels::Status::InvalidArgument);
}

TEST(LinearOp, StridedBatchedInputBf16OutputAndErrors) {
  Tensor xbase = test::randn_tensor({2, 7, 70}, DType::F32);
  Tensor x = xbase.slice(2, 0, 66);  // rows of stride 70
  Tensor w = test::randn_tensor({33, 66}, DType::F32, 0.2f);
  Tensor b = test::randn_tensor({33}, DType::F32);
  Tensor y = ops::linear(x, w, b);
  ASSERT_EQ(y.shape(), (Shape{2, 7, 33}));
  TD_EXPECT_CLOSE(test::compare(as_doubles(y), linear_ref(x, w, b)), 1e-6, 0.9999999);
  Tensor yb = ops::linear(x, w, Tensor(), DType::BF16);
  EXPECT_EQ(yb.dtype(), DType::BF16);
  TD_EXPECT_CLOSE(test::compare(as_doubles(yb), linear_ref(x, w, Tensor())), 4e-3, 0.99999);

  const std::string e = error_of([&] { ops::linear(x, test::randn_tensor({33, 65}, DType::F32), b); });
  EXPECT_TRUE(contains(e, "linear") && contains(e, "66") && contains(e, "65")) << e;
  const std::string eb = error_of([&] { ops::linear(x, w, test::randn_tensor({32}, DType::F32)); });
  EXPECT_TRUE(contains(eb, "bias")) << eb;
}

// ---- attention and RoPE ops ------------------------------------------------

TEST(AttentionOp, PermutedViewsMatchDenseAndFormula) {
  const int64_t B = 2, L = 13, Lk = 9, H = 3, D = 10;
  Tensor q = test::randn_tensor({B, L, H, D}, DType::F32);
  Tensor kbhld = test::randn_tensor({B, H, Lk, D}, DType::F32);
  Tensor k = kbhld.permute({0, 2, 1, 3});  // a [B, Lk, H, D] view of BHLD memory
  Tensor v = test::randn_tensor({B, Lk, H, D}, DType::F32);
  Tensor o = ops::attention(q, k, v);
  ASSERT_EQ(o.shape(), (Shape{B, L, H, D}));
  std::vector<double> ref;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t h = 0; h < H; ++h) {
        std::vector<double> s(static_cast<size_t>(Lk));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < Lk; ++j) {
          double d = 0;
          for (int64_t c = 0; c < D; ++c)
            d += q.item_f64(((b * L + i) * H + h) * D + c) * kbhld.item_f64(((b * H + h) * Lk + j) * D + c);
          s[size_t(j)] = d / std::sqrt(double(D));
          mx = std::max(mx, s[size_t(j)]);
        }
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int64_t c = 0; c < D; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < Lk; ++j) acc += s[size_t(j)] * v.item_f64(((b * Lk + j) * H + h) * D + c);
          ref.push_back(acc / sum);
        }
      }
  TD_EXPECT_CLOSE(test::compare(as_doubles(o), ref), 1e-6, 0.9999999);
  const std::string e = error_of([&] { ops::attention(q, k, test::randn_tensor({B, Lk, H, D + 1}, DType::F32)); });
  EXPECT_TRUE(contains(e, "attention") && contains(e, "differ")) << e;
}

TEST(RopeOp, BhldViewEqualsBlhdAndHeadDim48SplitsLikeDiffusers) {
  // diffusers' WanRotaryPosEmbed: t = d - 4*(d//6), h = w = 2*(d//6); 48 -> 16/16/16, 24 -> 8/8/8.
  EXPECT_EQ(kernels::rope_axes(48).t, 16);
  EXPECT_EQ(kernels::rope_axes(48).h, 16);
  EXPECT_EQ(kernels::rope_axes(24).t, 8);
  EXPECT_EQ(kernels::rope_axes(128).t, 44);
  const ops::PatchGrid g{3, 3, 5};
  const int64_t B = 2, H = 2, Dh = 48, dim = H * Dh;
  Tensor q = test::randn_tensor({B, g.tokens(), dim}, DType::F32);
  Tensor k = test::randn_tensor({B, g.tokens(), dim}, DType::F32);
  Tensor wq = test::randn_tensor({dim}, DType::F32, 0.2f, 1.f), wk = test::randn_tensor({dim}, DType::F32, 0.2f, 1.f);
  Tensor tab = ops::rope_tables(Dh, g, Device::cpu());
  auto a = ops::qk_norm_rope(q, k, wq, wk, tab, g, H, 1e-6f);
  auto b = ops::qk_norm_rope(q, k, wq, wk, tab, g, H, 1e-6f, kernels::RopeOutLayout::BHLD);
  ASSERT_EQ(b.q.shape(), (Shape{B, g.tokens(), H, Dh}));
  EXPECT_EQ(test::compare(as_doubles(a.q), as_doubles(b.q)).max_abs, 0.0);
  EXPECT_EQ(test::compare(as_doubles(a.k), as_doubles(b.k)).max_abs, 0.0);
  // Token (f, h, w) = (2, 1, 3), head 1, first t pair: rotated by angle f * theta^0 = 2.
  const int64_t l = (2 * 3 + 1) * 5 + 3;
  double ss = 0;
  for (int64_t c = 0; c < dim; ++c) ss += std::pow(q.item_f64(l * dim + c), 2);
  const double r = 1.0 / std::sqrt(ss / dim + 1e-6);
  const double x0 = q.item_f64(l * dim + Dh) * r * wq.item_f64(Dh), x1 = q.item_f64(l * dim + Dh + 1) * r * wq.item_f64(Dh + 1);
  EXPECT_NEAR(a.q.item_f64(l * dim + Dh), x0 * std::cos(2.0) - x1 * std::sin(2.0), 1e-5);
  EXPECT_NEAR(a.q.item_f64(l * dim + Dh + 1), x0 * std::sin(2.0) + x1 * std::cos(2.0), 1e-5);
}

// ---- names and configs ---------------------------------------------------------

TEST(WanKeys, DiffusersNamesMapToOriginalAndBack) {
  const std::pair<const char*, const char*> cases[] = {
      {"blocks.3.attn1.to_q.weight", "blocks.3.self_attn.q.weight"},
      {"blocks.3.attn1.to_out.0.bias", "blocks.3.self_attn.o.bias"},
      {"blocks.0.attn2.norm_k.weight", "blocks.0.cross_attn.norm_k.weight"},
      {"blocks.12.norm2.bias", "blocks.12.norm3.bias"},
      {"blocks.1.ffn.net.0.proj.weight", "blocks.1.ffn.0.weight"},
      {"blocks.1.ffn.net.2.bias", "blocks.1.ffn.2.bias"},
      {"blocks.7.scale_shift_table", "blocks.7.modulation"},
      {"scale_shift_table", "head.modulation"},
      {"proj_out.weight", "head.head.weight"},
      {"condition_embedder.time_proj.bias", "time_projection.1.bias"},
      {"condition_embedder.text_embedder.linear_2.weight", "text_embedding.2.weight"},
      {"condition_embedder.time_embedder.linear_1.weight", "time_embedding.0.weight"},
      {"patch_embedding.weight", "patch_embedding.weight"},
      {"blocks.0.attn1.to_q.int8_weight", "blocks.0.self_attn.q.int8_weight"},
  };
  for (const auto& [diff, orig] : cases) {
    EXPECT_EQ(to_original_name(diff, KeyLayout::Diffusers).value_or("<none>"), orig) << diff;
    EXPECT_EQ(from_original_name(orig, KeyLayout::Diffusers), diff) << orig;
    EXPECT_EQ(to_original_name(orig, KeyLayout::Original).value_or("<none>"), orig) << orig;
  }
  EXPECT_EQ(to_original_name("blocks.0.self_attn.attn_op.local_attn.proj_l.weight", KeyLayout::Original).value_or(""),
            "blocks.0.self_attn.attn_op.local_attn.proj_l.weight");
  for (const char* bad : {"blocks.0.attn1.to_qq.weight", "blocks.x.norm3.weight", "foo.weight", "blocks.0.modulation.x"})
    EXPECT_FALSE(to_original_name(bad, KeyLayout::Original).has_value()) << bad;
  EXPECT_FALSE(to_original_name("blocks.0.self_attn.q.weight", KeyLayout::Diffusers).has_value());
}

TEST(WanConfig, PresetsJsonAndDetection) {
  const WanConfig c13 = wan_preset("Wan2.1-T2V-1.3B");
  EXPECT_EQ(c13.num_heads, 12);
  EXPECT_EQ(c13.head_dim(), 128);
  EXPECT_EQ(wan_preset("Wan2.2-I2V-A14B").in_dim, 36);
  EXPECT_TRUE(contains(error_of([] { wan_preset("Wan9"); }), "Wan2.1-T2V-14B"));

  const WanConfig t = wan_config_from_json(fixture("t2v/config.json"));
  EXPECT_EQ(t.num_heads, 2);
  EXPECT_EQ(t.head_dim(), 48);
  EXPECT_EQ(t.dim, 96);
  EXPECT_EQ(t.text_dim, 40);
  EXPECT_EQ(t.freq_dim, 32);
  EXPECT_EQ(t.variant, "custom");
  const WanConfig i = wan_config_from_json(fixture("i2v/config.json"));
  EXPECT_EQ(i.in_dim, 36);
  EXPECT_EQ(i.out_dim, 16);
  EXPECT_EQ(find_wan_config_json(fixture("t2v/wan_original.safetensors")), fixture("t2v/config.json"));
  EXPECT_EQ(find_wan_config_json(fixture("t2v/diffusers")), fixture("t2v/diffusers/config.json"));

  // Real sizes are detected (heads = dim / 128); custom sizes need config.json.
  models::ModelDetection d;
  d.kind = models::ModelKind::WanDiT;
  d.dim = 5120, d.ffn_dim = 13824, d.num_layers = 40, d.in_dim = 36, d.out_dim = 16, d.text_dim = 4096, d.freq_dim = 256;
  const WanConfig a14 = wan_config_from_detection(d, "x.pth");
  EXPECT_EQ(a14.variant, "Wan2.2-I2V-A14B");
  EXPECT_EQ(a14.num_heads, 40);
  d.has_image_cross_attn = true;
  ErrorKind kind{};
  EXPECT_TRUE(contains(error_of([&] { wan_config_from_detection(d, "x.pth"); }, &kind), "image"));
  EXPECT_EQ(kind, ErrorKind::Unsupported);
  d.has_image_cross_attn = false;
  d.dim = 96, d.ffn_dim = 160, d.num_layers = 2;
  EXPECT_TRUE(contains(error_of([&] { wan_config_from_detection(d, "tiny.pth"); }), "config.json"));

  const std::string dir = test::temp_dir() + "/badcfg";
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"_class_name": "WanTransformer3DModel", "num_attention_heads": 5,
      "attention_head_dim": 48, "num_layers": 2, "ffn_dim": 160, "image_dim": 1280, "added_kv_proj_dim": 96})";
  EXPECT_TRUE(contains(error_of([&] { wan_config_from_json(dir + "/config.json"); }), "image"));
  std::ofstream(dir + "/config2.json") << R"({"num_attention_heads": 5, "attention_head_dim": 47, "num_layers": 2,
      "ffn_dim": 160})";
  EXPECT_TRUE(contains(error_of([&] { wan_config_from_json(dir + "/config2.json"); }), "head_dim 47"));
}

// ---- host pieces of the forward ---------------------------------------------------

TEST(WanHost, PatchifyUnpatchifyOrderAndSinusoid) {
  const int64_t B = 2, C = 3, T = 2, H = 4, W = 6;
  Tensor lat = test::randn_tensor({B, C, T, H, W}, DType::F32);
  Tensor p = wan_patchify(lat, 1, 2, 2);
  ASSERT_EQ(p.shape(), (Shape{B, T * 2 * 3, C * 4}));
  // token (b=1, f=1, h=1, w=2), feature (c=2, kh=1, kw=0) = c*4 + kh*2 + kw
  const int64_t l = (1 * 2 + 1) * 3 + 2;
  EXPECT_EQ(p.item_f64((1 * 12 + l) * 12 + 2 * 4 + 2), lat.item_f64((((1 * C + 2) * T + 1) * H + 3) * W + 4));
  // Unpatchify reads (kt, kh, kw, c): feature (kh=1, kw=0, c=2) = (1*2+0)*C + 2.
  Tensor tok = test::randn_tensor({B, 12, 4 * C}, DType::F32);
  Tensor u = wan_unpatchify(tok, T, H, W, 1, 2, 2);
  ASSERT_EQ(u.shape(), (Shape{B, C, T, H, W}));
  EXPECT_EQ(u.item_f64((((1 * C + 2) * T + 1) * H + 3) * W + 4), tok.item_f64((1 * 12 + l) * 12 + 2 * C + 2));

  Tensor ts = Tensor::from_f32({2}, {999.5f, 3.25f});
  Tensor s = wan_time_sinusoid(ts, 32);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 16; ++i) {
      const double a = double(ts.item_f64(b)) * std::pow(10000.0, -double(i) / 16);
      EXPECT_NEAR(s.item_f64(b * 32 + i), std::cos(a), 1e-7);
      EXPECT_NEAR(s.item_f64(b * 32 + 16 + i), std::sin(a), 1e-7);
    }
}

// ---- the forward against diffusers -----------------------------------------------

struct Case {
  const char* model;    // t2v / i2v
  const char* weights;  // path under fixtures/dit/<model>/
  const char* expected; // tensor in expected.safetensors
};

// gtest prints the case by its paths, not its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << "/" << c.weights << " vs " << c.expected; }

class WanDiTFixture : public ::testing::TestWithParam<Case> {};

TEST_P(WanDiTFixture, CpuF32ForwardMatchesDiffusers) {
  const Case c = GetParam();
  const std::string dir = fixture(std::string(c.model) + "/");
  WanLoadOptions o;
  WanCheckpoint ck = load_wan_checkpoint({dir + c.weights}, o);
  EXPECT_EQ(ck.int8_dequantized, std::string(c.weights) == "turbo_quant.pth");
  EXPECT_EQ(ck.has_proj_l, contains(c.weights, "turbo"));
  const WanDiT model(std::move(ck));
  auto in = read_map(dir + "inputs.safetensors");
  auto ex = read_map(dir + "expected.safetensors");
  const Tensor v = model.forward(in["latent"], in["timestep"], in["context"]);
  ASSERT_EQ(v.shape(), ex[c.expected].shape());
  // fp32 end to end against diffusers' fp32 forward: only summation-order noise.
  TD_EXPECT_CLOSE(test::compare(v, ex[c.expected]), 1e-5, 0.99999999);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, WanDiTFixture,
    ::testing::Values(Case{"t2v", "diffusers", "velocity"},
                      Case{"t2v", "diffusers/diffusion_pytorch_model.safetensors.index.json", "velocity"},
                      Case{"t2v", "wan_original.safetensors", "velocity"}, Case{"t2v", "turbo.pth", "velocity"},
                      Case{"t2v", "turbo_quant.pth", "velocity_int8"}, Case{"i2v", "diffusers", "velocity"},
                      Case{"i2v", "wan_original.pth", "velocity"}),
    [](const ::testing::TestParamInfo<Case>& i) {
      std::string n = std::string(i.param.model) + "_" + i.param.weights;
      for (char& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

TEST(WanDiT, Bf16EmulationOnCpuStaysWithinTheGpuBar) {
  // The same BF16 storage the CUDA path uses, run by the CPU ops: a proxy for
  // the GPU test's 2e-2 bar that runs everywhere.
  WanLoadOptions o;
  o.dtype = DType::BF16;
  const WanDiT model(load_wan_checkpoint({fixture("t2v/turbo.pth")}, o));
  EXPECT_EQ(model.dtype(), DType::BF16);
  auto in = read_map(fixture("t2v/inputs.safetensors"));
  auto ex = read_map(fixture("t2v/expected.safetensors"));
  TD_EXPECT_CLOSE(test::compare(model.forward(in["latent"], in["timestep"], in["context"]), ex["velocity"]), 2e-2,
                  0.999);
}

TEST(WanDiT, SamplesOfABatchAreIndependent) {
  // Sample 1 alone (its own timestep and context) equals sample 1 of the batch.
  const WanDiT model(load_wan_checkpoint({fixture("t2v/diffusers")}, {}));
  auto in = read_map(fixture("t2v/inputs.safetensors"));
  const Tensor all = model.forward(in["latent"], in["timestep"], in["context"]);
  const Tensor one = model.forward(in["latent"].slice(0, 1, 2).contiguous(), in["timestep"].slice(0, 1, 2).contiguous(),
                                   in["context"].slice(0, 1, 2).contiguous());
  TD_EXPECT_CLOSE(test::compare(one, all.slice(0, 1, 2).contiguous()), 1e-6, 0.9999999);
}

TEST(WanDiT, InputChecksNameTheInput) {
  const WanDiT model(load_wan_checkpoint({fixture("t2v/diffusers")}, {}));
  auto in = read_map(fixture("t2v/inputs.safetensors"));
  const Tensor& lat = in["latent"];
  EXPECT_TRUE(contains(error_of([&] { model.check_inputs(lat.slice(1, 0, 15).contiguous(), in["timestep"], in["context"]); }),
                       "channels"));
  EXPECT_TRUE(contains(error_of([&] { model.check_inputs(lat.slice(4, 0, 9).contiguous(), in["timestep"], in["context"]); }),
                       "even"));
  EXPECT_TRUE(contains(error_of([&] { model.check_inputs(lat, in["timestep"].slice(0, 0, 1).contiguous(), in["context"]); }),
                       "timestep"));
  EXPECT_TRUE(contains(error_of([&] { model.check_inputs(lat, in["timestep"], in["context"].slice(2, 0, 39).contiguous()); }),
                       "text_dim"));
  const Tensor nan_t = Tensor::from_f32({2}, {NAN, 10.f});
  EXPECT_TRUE(contains(error_of([&] { model.check_inputs(lat, nan_t, in["context"]); }), "finite"));
}

// ---- loader problems ----------------------------------------------------------------

std::vector<std::pair<std::string, Tensor>> fixture_tensors(const std::string& rel) {
  return io::read_tensor_file(fixture(rel)).tensors;
}

std::string match_error(const std::vector<std::pair<std::string, Tensor>>& ts, const std::string& config) {
  std::vector<models::TensorMeta> metas;
  for (const auto& [n, t] : ts) metas.push_back({n, t.dtype(), t.shape()});
  return error_of([&] {
    match_wan_tensors(ts, models::detect_model(metas), wan_config_from_json(fixture(config)), "test.ckpt");
  });
}

TEST(WanLoader, EveryProblemIsNamedInOneMessage) {
  auto ts = fixture_tensors("t2v/diffusers");
  // drop one, reshape one, add one, in the diffusers layout
  std::erase_if(ts, [](const auto& p) { return p.first == "blocks.1.attn2.to_k.weight"; });
  for (auto& [n, t] : ts)
    if (n == "blocks.0.ffn.net.0.proj.bias") t = Tensor::zeros({159}, DType::BF16);
  ts.emplace_back("blocks.0.attn1.to_q.lora_A", Tensor::zeros({4, 96}, DType::BF16));
  const std::string e = match_error(ts, "t2v/config.json");
  EXPECT_TRUE(contains(e, "3 problems")) << e;
  EXPECT_TRUE(contains(e, "missing: blocks.1.attn2.to_k.weight")) << e;
  EXPECT_TRUE(contains(e, "blocks.0.ffn.net.0.proj.bias is [159], expected [160]")) << e;
  EXPECT_TRUE(contains(e, "unexpected: blocks.0.attn1.to_q.lora_A")) << e;
}

TEST(WanLoader, ManyProblemsAreListedUpToALimit) {
  auto ts = fixture_tensors("t2v/wan_original.safetensors");
  std::erase_if(ts, [](const auto& p) { return p.first.rfind("blocks.1.", 0) == 0; });  // a whole block
  const std::string e = match_error(ts, "t2v/config.json");
  EXPECT_TRUE(contains(e, "problems")) << e;
  EXPECT_TRUE(contains(e, "missing: blocks.1.self_attn.q.weight")) << e;
  EXPECT_TRUE(contains(e, "... and ")) << e;
}

TEST(WanLoader, Int8AndProjLProblems) {
  auto ts = fixture_tensors("t2v/turbo_quant.pth");
  for (auto& [n, t] : ts)
    if (n == "blocks.0.ffn.0.scale") t = Tensor::zeros({1, 1}, DType::F32);  // ffn 160 needs 2 row blocks
  std::erase_if(ts, [](const auto& p) {
    return p.first == "blocks.1.self_attn.attn_op.local_attn.proj_l.bias" || p.first == "blocks.1.cross_attn.v.scale";
  });
  const std::string e = match_error(ts, "t2v/config.json");
  EXPECT_TRUE(contains(e, "blocks.0.ffn.0.scale is f32[1, 1], expected f32[2, 1]")) << e;
  EXPECT_TRUE(contains(e, "missing: blocks.1.self_attn.attn_op.local_attn.proj_l.bias")) << e;
  EXPECT_TRUE(contains(e, "missing: blocks.1.cross_attn.v.scale")) << e;
}

TEST(WanLoader, WrongConfigAndMissingConfigJson) {
  // The i2v config against the t2v weights: shapes disagree, named.
  const std::string e = match_error(fixture_tensors("t2v/wan_original.safetensors"), "i2v/config.json");
  EXPECT_TRUE(contains(e, "patch_embedding.weight is [96, 16, 1, 2, 2]")) << e;
  // A custom-size file with no config.json beside it.
  const std::string dir = test::temp_dir() + "/noconfig";
  fs::create_directories(dir);
  fs::copy_file(fixture("t2v/wan_original.safetensors"), dir + "/w.safetensors", fs::copy_options::overwrite_existing);
  ErrorKind kind{};
  const std::string m = error_of([&] { load_wan_checkpoint({dir + "/w.safetensors"}, {}); }, &kind);
  EXPECT_TRUE(contains(m, "config.json")) << m;
  EXPECT_EQ(kind, ErrorKind::Format);
  // ... which --config fixes.
  WanLoadOptions o;
  o.config_path = fixture("t2v/config.json");
  EXPECT_EQ(load_wan_checkpoint({dir + "/w.safetensors"}, o).config.num_heads, 2);
}

TEST(WanLoader, TwoFilesMergeAndADuplicateIsAnError) {
  // The sharded diffusers set given as its shard files.
  std::vector<std::string> shards;
  for (const auto& e : fs::directory_iterator(fixture("t2v/diffusers")))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path().string());
  std::sort(shards.begin(), shards.end());
  ASSERT_GE(shards.size(), 2u);
  WanLoadOptions o;
  o.config_path = fixture("t2v/config.json");
  EXPECT_EQ(load_wan_checkpoint(shards, o).tensors.size(), load_wan_checkpoint({fixture("t2v/diffusers")}, {}).tensors.size());
  const std::string e = error_of([&] { load_wan_checkpoint({shards[0], shards[0]}, o); });
  EXPECT_TRUE(contains(e, "is in both")) << e;
}

// ---- `turbodiff dit` --------------------------------------------------------------------

TEST(DitCli, ForwardEndToEndAndAtomicOutput) {
  const std::string out = test::temp_dir() + "/velocity.safetensors";
  auto r = test::run_cli("dit --weights " + fixture("t2v/turbo.pth") + " --inputs " + fixture("t2v/inputs.safetensors") +
                         " --out " + out + " --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "velocity [2, 16, 3, 6, 10]")) << r.out;
  auto got = read_map(out);
  auto ex = read_map(fixture("t2v/expected.safetensors"));
  ASSERT_EQ(got.size(), 1u);
  TD_EXPECT_CLOSE(test::compare(got["velocity"], ex["velocity"]), 1e-5, 0.99999999);

  // I2V: 36 channels in, 16 out.
  r = test::run_cli("dit --weights " + fixture("i2v/diffusers") + " --inputs " + fixture("i2v/inputs.safetensors") +
                    " --out " + out + " --device cpu --dtype f32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  TD_EXPECT_CLOSE(test::compare(read_map(out)["velocity"], read_map(fixture("i2v/expected.safetensors"))["velocity"]),
                  1e-5, 0.99999999);
}

TEST(DitCli, BadInputsAndSwitchesFailClearly) {
  const std::string dir = test::temp_dir() + "/dit_bad";
  fs::create_directories(dir);
  const std::string w = " --weights " + fixture("t2v/diffusers");
  const std::string out = dir + "/out.safetensors";
  auto in = read_map(fixture("t2v/inputs.safetensors"));

  auto r = test::run_cli("dit --help");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "--weights") && contains(r.out, "--attention")) << r.out;
  // Usage errors: exit 2.
  r = test::run_cli("dit" + w + " --out " + out);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  r = test::run_cli("dit" + w + " --inputs x --out " + out + " --dtype f64");
  EXPECT_EQ(r.exit_code, 2) << r.err;

  // Inputs that do not fit the model: exit 1, the input named.
  io::write_safetensors(dir + "/odd.safetensors", {{"latent", in["latent"].slice(4, 0, 9).contiguous()},
                                                   {"timestep", in["timestep"]}, {"context", in["context"]}});
  r = test::run_cli("dit" + w + " --inputs " + dir + "/odd.safetensors --out " + out + " --device cpu");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "odd.safetensors") && contains(r.err, "even")) << r.err;
  io::write_safetensors(dir + "/names.safetensors", {{"latents", in["latent"]}, {"timestep", in["timestep"]},
                                                     {"context", in["context"]}});
  r = test::run_cli("dit" + w + " --inputs " + dir + "/names.safetensors --out " + out + " --device cpu");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "missing tensor 'latent'") && contains(r.err, "unexpected tensor 'latents'")) << r.err;
  io::write_safetensors(dir + "/ch.safetensors", {{"latent", in["latent"].slice(1, 0, 4).contiguous()},
                                                  {"timestep", in["timestep"]}, {"context", in["context"]}});
  r = test::run_cli("dit" + w + " --inputs " + dir + "/ch.safetensors --out " + out + " --device cpu");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "channels")) << r.err;

  // SLA's top-k fraction outside (0, 1]: a usage error (SLA itself: tests/cpu/test_sla.cpp).
  const std::string ok_in = " --inputs " + fixture("t2v/inputs.safetensors") + " --out " + out + " --device cpu";
  for (const char* sw : {"--attention sla --sla-topk 0", "--attention sagesla --sla-topk 1.5"}) {
    r = test::run_cli("dit" + w + ok_in + " " + sw);
    EXPECT_EQ(r.exit_code, 2) << sw << ": " << r.err;
  }
  if (!test::gpu_available()) {
    r = test::run_cli("dit" + w + " --inputs " + fixture("t2v/inputs.safetensors") + " --out " + out + " --device cuda");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_TRUE(contains(r.err, "CUDA")) << r.err;
  }
  // No failure above left an output file behind.
  EXPECT_FALSE(fs::exists(out));
  // A weights file that is not a Wan DiT.
  r = test::run_cli("dit --weights " + fixture("t2v/inputs.safetensors") + ok_in);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "not a Wan DiT")) << r.err;
}

}  // namespace
}  // namespace td
