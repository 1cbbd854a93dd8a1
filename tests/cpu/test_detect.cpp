// Model detection on the full key sets of the real checkpoints (names and
// shapes only, built here from the layouts in the reference), so the real
// sizes are covered without multi-GB files.
#include "harness/harness.h"
#include "models/detect.h"

namespace td::models {
namespace {

struct WanSpec {
  int64_t dim, ffn, layers, in_dim;
  bool i2v_clip = false;
  bool linear_patch = false;
  bool quant = false;
  bool proj_l = false;
  std::string prefix;
  DType dtype = DType::BF16;
};

void linear(std::vector<TensorMeta>& v, const WanSpec& s, const std::string& base, int64_t out, int64_t in,
            bool quantizable) {
  if (s.quant && quantizable) {
    v.push_back({s.prefix + base + ".int8_weight", DType::I8, {out, in}});
    v.push_back({s.prefix + base + ".scale", DType::F32, {(out + 127) / 128, (in + 127) / 128}});
  } else {
    v.push_back({s.prefix + base + ".weight", s.dtype, {out, in}});
  }
  v.push_back({s.prefix + base + ".bias", s.dtype, {out}});
}

// Original Wan names (wan21-and-rcm.md §1.6), optionally as rCM/TurboDiffusion stores them.
std::vector<TensorMeta> wan_original(const WanSpec& s) {
  std::vector<TensorMeta> v;
  const int64_t D = s.dim;
  if (s.linear_patch) v.push_back({s.prefix + "patch_embedding.weight", s.dtype, {D, s.in_dim * 4}});
  else v.push_back({s.prefix + "patch_embedding.weight", s.dtype, {D, s.in_dim, 1, 2, 2}});
  v.push_back({s.prefix + "patch_embedding.bias", s.dtype, {D}});
  linear(v, s, "text_embedding.0", D, 4096, false);
  linear(v, s, "text_embedding.2", D, D, false);
  linear(v, s, "time_embedding.0", D, 256, false);
  linear(v, s, "time_embedding.2", D, D, false);
  linear(v, s, "time_projection.1", 6 * D, D, false);
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    v.push_back({s.prefix + b + "modulation", DType::F32, {1, 6, D}});
    for (const char* a : {"self_attn", "cross_attn"}) {
      for (const char* p : {"q", "k", "v", "o"}) linear(v, s, b + a + "." + p, D, D, true);
      v.push_back({s.prefix + b + a + ".norm_q.weight", s.dtype, {D}});
      v.push_back({s.prefix + b + a + ".norm_k.weight", s.dtype, {D}});
    }
    if (s.i2v_clip) {
      linear(v, s, b + "cross_attn.k_img", D, D, true);
      linear(v, s, b + "cross_attn.v_img", D, D, true);
      v.push_back({s.prefix + b + "cross_attn.norm_k_img.weight", s.dtype, {D}});
    }
    if (s.proj_l) {
      v.push_back({s.prefix + b + "self_attn.attn_op.local_attn.proj_l.weight", DType::F32, {128, 128}});
      v.push_back({s.prefix + b + "self_attn.attn_op.local_attn.proj_l.bias", DType::F32, {128}});
    }
    v.push_back({s.prefix + b + "norm3.weight", s.dtype, {D}});
    v.push_back({s.prefix + b + "norm3.bias", s.dtype, {D}});
    linear(v, s, b + "ffn.0", s.ffn, D, true);
    linear(v, s, b + "ffn.2", D, s.ffn, true);
  }
  linear(v, s, "head.head", 64, D, false);
  v.push_back({s.prefix + "head.modulation", DType::F32, {1, 2, D}});
  return v;
}

TEST(Detect, Wan21T2V13BOriginal) {
  auto d = detect_model(wan_original({1536, 8960, 30, 16}));
  EXPECT_EQ(d.kind, ModelKind::WanDiT);
  EXPECT_EQ(d.variant, "Wan2.1-T2V-1.3B");
  EXPECT_EQ(d.layout, KeyLayout::Original);
  EXPECT_EQ(d.num_layers, 30);
  EXPECT_EQ(d.text_dim, 4096);
  EXPECT_EQ(d.freq_dim, 256);
  EXPECT_EQ(d.out_dim, 16);
  EXPECT_FALSE(d.int8_quantized);
  EXPECT_FALSE(d.has_sla_proj_l);
  EXPECT_EQ(d.weight_dtype, "bf16");
}

TEST(Detect, TurboWan14BQuantWithProjLAndNetPrefix) {
  WanSpec s{5120, 13824, 40, 16};
  s.linear_patch = s.quant = s.proj_l = true;
  s.prefix = "state_dict.net.";
  auto d = detect_model(wan_original(s));
  EXPECT_EQ(d.variant, "Wan2.1-T2V-14B");
  EXPECT_EQ(d.prefix, "state_dict.net.");
  EXPECT_TRUE(d.patch_embedding_linear);
  EXPECT_TRUE(d.int8_quantized);
  EXPECT_TRUE(d.has_sla_proj_l);
  EXPECT_EQ(d.in_dim, 16);
  EXPECT_NE(d.description.find("INT8"), std::string::npos) << d.description;
  EXPECT_NE(d.description.find("with SLA proj_l"), std::string::npos) << d.description;
}

TEST(Detect, Wan22I2VExpertVersusWan21I2V) {
  WanSpec s{5120, 13824, 40, 36};
  EXPECT_EQ(detect_model(wan_original(s)).variant, "Wan2.2-I2V-A14B expert");
  s.i2v_clip = true;
  auto d = detect_model(wan_original(s));
  EXPECT_EQ(d.variant, "Wan2.1-I2V-14B");
  EXPECT_TRUE(d.has_image_cross_attn);
}

TEST(Detect, CustomSizeIsNamedAsSuch) {
  auto d = detect_model(wan_original({96, 200, 2, 16}));
  EXPECT_EQ(d.kind, ModelKind::WanDiT);
  EXPECT_EQ(d.variant, "custom");
  EXPECT_NE(d.description.find("dim 96"), std::string::npos) << d.description;
}

TEST(Detect, DiffusersLayout) {
  std::vector<TensorMeta> v;
  const int64_t D = 1536;
  v.push_back({"patch_embedding.weight", DType::F32, {D, 16, 1, 2, 2}});
  v.push_back({"condition_embedder.time_embedder.linear_1.weight", DType::F32, {D, 256}});
  v.push_back({"condition_embedder.text_embedder.linear_1.weight", DType::F32, {D, 4096}});
  v.push_back({"proj_out.weight", DType::F32, {64, D}});
  for (int i = 0; i < 30; ++i) {
    v.push_back({"blocks." + std::to_string(i) + ".attn1.to_q.weight", DType::F32, {D, D}});
    v.push_back({"blocks." + std::to_string(i) + ".ffn.net.0.proj.weight", DType::F32, {8960, D}});
  }
  auto d = detect_model(v);
  EXPECT_EQ(d.layout, KeyLayout::Diffusers);
  EXPECT_EQ(d.variant, "Wan2.1-T2V-1.3B");
  EXPECT_EQ(d.weight_dtype, "f32");
}

TEST(Detect, VaeAndUmt5AndUnknown) {
  std::vector<TensorMeta> vae{{"encoder.conv1.weight", DType::F32, {96, 3, 3, 3, 3}},
                              {"decoder.conv1.weight", DType::F32, {384, 16, 3, 3, 3}},
                              {"conv1.weight", DType::F32, {32, 32, 1, 1, 1}},
                              {"conv2.weight", DType::F32, {16, 16, 1, 1, 1}}};
  auto d = detect_model(vae);
  EXPECT_EQ(d.kind, ModelKind::WanVAE);
  EXPECT_EQ(d.z_dim, 16);

  std::vector<TensorMeta> t5{{"token_embedding.weight", DType::BF16, {256384, 4096}}};
  for (int i = 0; i < 24; ++i) {
    t5.push_back({"blocks." + std::to_string(i) + ".attn.q.weight", DType::BF16, {4096, 4096}});
    t5.push_back({"blocks." + std::to_string(i) + ".pos_embedding.embedding.weight", DType::BF16, {32, 64}});
  }
  d = detect_model(t5);
  EXPECT_EQ(d.kind, ModelKind::UMT5Encoder);
  EXPECT_EQ(d.variant, "umT5-XXL encoder");
  EXPECT_NE(d.description.find("per-layer"), std::string::npos);

  d = detect_model(std::vector<TensorMeta>{{"fc.weight", DType::F32, {3, 3}}});
  EXPECT_EQ(d.kind, ModelKind::Unknown);
}

}  // namespace
}  // namespace td::models
