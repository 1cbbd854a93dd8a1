// The umT5 text encoder on the CPU: the relative-position buckets and the
// attention core against direct formulas, the prompt cleaning, the
// SentencePiece tokenizer (ids, padding, truncation), the loader (both
// layouts, every problem named) and the forward against transformers'
// UMT5EncoderModel on a tiny random model (fixtures/umt5,
// scripts/make_umt5_fixtures.py), the zero-pad rule, and `turbodiff
// encode-text` end to end.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "harness/harness.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "models/umt5/umt5_config.h"
#include "models/umt5/umt5_encoder.h"
#include "models/umt5/umt5_loader.h"
#include "models/umt5/umt5_tokenizer.h"
#include "ops/t5_attention.h"

namespace td {
namespace {

namespace fs = std::filesystem;
using namespace models::umt5;

std::string fixture(const std::string& rel) { return test::source_dir() + "/fixtures/umt5/" + rel; }

std::map<std::string, Tensor> read_map(const std::string& path) {
  std::map<std::string, Tensor> m;
  for (auto& [n, t] : io::read_safetensors(path).tensors) m[n] = t;
  return m;
}

struct FixturePrompt {
  std::string raw, clean;
  std::vector<int64_t> ids;
};
std::vector<FixturePrompt> fixture_prompts() {
  std::ifstream f(fixture("prompts.json"));
  const nlohmann::json j = nlohmann::json::parse(f);
  std::vector<FixturePrompt> out;
  for (const auto& p : j["prompts"])
    out.push_back({p["raw"].get<std::string>(), p["clean"].get<std::string>(), p["ids"].get<std::vector<int64_t>>()});
  return out;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

using test::error_of;

std::vector<int64_t> row_i64(const Tensor& t, int64_t b) {
  const Tensor r = t.select(0, b).contiguous();
  return std::vector<int64_t>(r.data<int64_t>(), r.data<int64_t>() + r.numel());
}

TEST(UMT5, RelativeBucketsMatchTransformers) {
  // HF's _relative_position_bucket over rel = key - query in [-600, 600].
  const Tensor table = read_map(fixture("expected.safetensors")).at("relative_buckets");
  ASSERT_EQ(table.numel(), 1201);
  for (int64_t r = -600; r <= 600; ++r)
    ASSERT_EQ(relative_position_bucket(r, 32, 128), table.data<int64_t>()[r + 600]) << "rel " << r;
  // The reference's rule (§4): 16 for positive rel, exact below 8, capped at 15 per side.
  EXPECT_EQ(relative_position_bucket(0, 32, 128), 0);
  EXPECT_EQ(relative_position_bucket(7, 32, 128), 16 + 7);
  EXPECT_EQ(relative_position_bucket(-7, 32, 128), 7);
  EXPECT_EQ(relative_position_bucket(100000, 32, 128), 31);
  EXPECT_EQ(relative_position_bucket(-100000, 32, 128), 15);
}

TEST(UMT5, AttentionCoreMatchesDirectFormula) {
  // ops::t5_attention on fresh random q, k, v, bias table, buckets and padding
  // masks at awkward sizes, against fp64 softmax(q k^T + bias, over unmasked
  // keys) v, no 1/sqrt(d) scaling.
  auto& g = test::rng();
  const int64_t B = 2, L = 37, H = 3, D = 5, NB = 7;
  const Tensor q = test::randn_tensor({B, L, H, D}, DType::F32), k = test::randn_tensor({B, L, H, D}, DType::F32),
               v = test::randn_tensor({B, L, H, D}, DType::F32), table = test::randn_tensor({NB, H}, DType::F32, 2.f);
  std::vector<int32_t> buckets(size_t(2 * L - 1));
  for (auto& x : buckets) x = int32_t(g() % NB);
  Tensor mask = Tensor::zeros({B, L}, DType::I64);
  std::vector<int64_t> lens = {1 + int64_t(g() % L), L};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < lens[size_t(b)]; ++j) mask.data<int64_t>()[b * L + j] = 1;
  const Tensor out = ops::t5_attention(q, k, v, table, buckets, mask);
  std::vector<double> ref, got;
  const float *qp = q.data<float>(), *kp = k.data<float>(), *vp = v.data<float>(), *tp = table.data<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t h = 0; h < H; ++h) {
        std::vector<double> s(size_t(lens[size_t(b)]));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < lens[size_t(b)]; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(qp[((b * L + i) * H + h) * D + d]) * kp[((b * L + j) * H + h) * D + d];
          s[size_t(j)] = dot + tp[buckets[size_t(j - i + L - 1)] * H + h];
          mx = std::max(mx, s[size_t(j)]);
        }
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < lens[size_t(b)]; ++j) acc += s[size_t(j)] / sum * vp[((b * L + j) * H + h) * D + d];
          ref.push_back(acc);
          got.push_back(out.data<float>()[((b * L + i) * H + h) * D + d]);
        }
      }
  TD_EXPECT_CLOSE(test::compare(got, ref), 1e-6, 0.999999);  // fp32 accumulation over <= 37 terms
  Tensor empty_mask = Tensor::zeros({B, L}, DType::I64);
  EXPECT_TRUE(contains(error_of([&] { ops::t5_attention(q, k, v, table, buckets, empty_mask); }), "no unmasked token"));
  buckets[3] = int32_t(NB);
  EXPECT_TRUE(contains(error_of([&] { ops::t5_attention(q, k, v, table, buckets, mask); }), "rel_bucket[3] = 7"));
}

TEST(UMT5, CleanPromptAsWan) {
  for (const auto& p : fixture_prompts()) EXPECT_EQ(clean_prompt(p.raw), p.clean) << p.raw;
  EXPECT_EQ(clean_prompt("  a\t\n b  "), "a b");
  EXPECT_EQ(clean_prompt("&amp;lt;tag&amp;gt;"), "<tag>");  // unescaped twice, as Wan does
  EXPECT_EQ(clean_prompt("x&nbsp;&nbsp;y"), "x y");         // U+00A0 is whitespace for Python's \s
  EXPECT_EQ(clean_prompt("caf&#233; &#x1F600;"), "caf\xC3\xA9 \xF0\x9F\x98\x80");
  EXPECT_EQ(clean_prompt("a\xE3\x80\x80" "b"), "a b");  // U+3000 ideographic space
  EXPECT_EQ(clean_prompt("AT&T &unknown; &"), "AT&T &unknown; &");
  EXPECT_EQ(clean_prompt("bad \xFF byte"), "bad \xFF byte");  // invalid UTF-8 kept as is
  EXPECT_EQ(clean_prompt(" \t "), "");
  // Numeric references as Python's html.unescape reads them.
  EXPECT_EQ(clean_prompt("&#128;&#150;"), "\xE2\x82\xAC\xE2\x80\x93");  // Windows-1252: euro sign, en dash
  EXPECT_EQ(clean_prompt("&#1;x&#x7f;&#xfdd0;&#xFFFE;"), "x");               // forbidden code points dropped
  EXPECT_EQ(clean_prompt("&#0;&#xD800;&#x110000;"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(clean_prompt("&#65;&#x42"), "AB");
}

TEST(UMT5, TokenizerIdsMatchFixture) {
  const UMT5Tokenizer tok = UMT5Tokenizer::load(fixture("tokenizer"));
  EXPECT_EQ(UMT5Tokenizer::load(fixture("tokenizer/spiece.model")).vocab_size(), tok.vocab_size());
  const auto prompts = fixture_prompts();
  const auto expected = read_map(fixture("expected.safetensors"));
  std::vector<std::string> raws;
  for (const auto& p : prompts) {
    EXPECT_EQ(tok.encode(p.clean), p.ids) << p.clean;
    raws.push_back(p.raw);
  }
  const TokenizedBatch batch = tok.tokenize(raws, 512);
  ASSERT_EQ(batch.ids.shape(), Shape({int64_t(prompts.size()), 512}));
  for (size_t b = 0; b < prompts.size(); ++b) {
    EXPECT_EQ(row_i64(batch.ids, int64_t(b)), row_i64(expected.at("input_ids"), int64_t(b)));
    EXPECT_EQ(row_i64(batch.mask, int64_t(b)), row_i64(expected.at("attention_mask"), int64_t(b)));
    EXPECT_EQ(batch.lengths[b], int64_t(prompts[b].ids.size()));
    EXPECT_EQ(batch.untruncated[b], batch.lengths[b]);
  }
}

TEST(UMT5, TokenizerTruncatesLongPrompts) {
  const UMT5Tokenizer tok = UMT5Tokenizer::load(fixture("tokenizer"));
  // A prompt of a random number of sentences, always well over 512 tokens.
  std::string prompt;
  const int sentences = 60 + int(test::rng()() % 40);
  for (int i = 0; i < sentences; ++i) prompt += "The dog runs across the green field. ";
  const std::vector<int64_t> full = tok.encode(clean_prompt(prompt));
  ASSERT_GT(full.size(), 512u);
  for (const int64_t max_len : {int64_t(512), int64_t(77)}) {
    const TokenizedBatch b = tok.tokenize({prompt}, max_len);
    EXPECT_EQ(b.lengths[0], max_len);
    EXPECT_EQ(b.untruncated[0], int64_t(full.size()));
    const auto ids = row_i64(b.ids, 0);
    EXPECT_EQ(std::vector<int64_t>(ids.begin(), ids.end() - 1), std::vector<int64_t>(full.begin(), full.begin() + max_len - 1));
    EXPECT_EQ(ids.back(), tok.eos_id());
    const auto mask = row_i64(b.mask, 0);
    EXPECT_TRUE(std::all_of(mask.begin(), mask.end(), [](int64_t m) { return m == 1; }));
  }
  EXPECT_TRUE(contains(error_of([&] { UMT5Tokenizer::load(test::temp_dir()); }), "has no spiece.model"));
  EXPECT_TRUE(contains(error_of([&] { UMT5Tokenizer::load(fixture("prompts.json")); }), "not a SentencePiece model"));
}

TEST(UMT5, KeyMapBothWays) {
  EXPECT_EQ(umt5_wan_to_hf_name("token_embedding.weight"), "shared.weight");
  EXPECT_EQ(umt5_wan_to_hf_name("blocks.13.ffn.gate.0.weight"), "encoder.block.13.layer.1.DenseReluDense.wi_0.weight");
  EXPECT_EQ(umt5_wan_to_hf_name("blocks.2.pos_embedding.embedding.weight"),
            "encoder.block.2.layer.0.SelfAttention.relative_attention_bias.weight");
  EXPECT_EQ(umt5_wan_to_hf_name("norm.weight"), "encoder.final_layer_norm.weight");
  EXPECT_EQ(umt5_hf_to_wan_name("encoder.block.0.layer.1.DenseReluDense.wi_1.weight"), "blocks.0.ffn.fc1.weight");
  EXPECT_EQ(umt5_hf_to_wan_name("encoder.embed_tokens.weight"), "token_embedding.weight");
  EXPECT_EQ(umt5_hf_to_wan_name("decoder.block.0.layer.0.SelfAttention.q.weight"), "");
  EXPECT_EQ(umt5_wan_to_hf_name("blocks.0.attn.qq.weight"), "");
}

TEST(UMT5, ConfigFromJsonAndShapesAgree) {
  const UMT5Config j = umt5_config_from_json(fixture("hf/config.json"));
  EXPECT_EQ(j.vocab, 150);
  EXPECT_EQ(j.d_model, 64);
  EXPECT_EQ(j.d_kv, 16);
  EXPECT_EQ(j.num_heads, 4);
  EXPECT_EQ(j.d_ff, 96);
  EXPECT_EQ(j.num_layers, 2);
  EXPECT_EQ(find_umt5_config_json(fixture("hf")), fixture("hf/config.json"));
  EXPECT_EQ(find_umt5_config_json(fixture("wan_umt5.pth")), "");  // no config.json beside it
  for (const std::string path : {fixture("wan_umt5.pth"), fixture("hf/model.safetensors")}) {
    const io::TensorFile f = io::read_tensor_file(path);
    const UMT5Config s = umt5_config_from_shapes(f.tensors, detect_umt5_layout(f.tensors, path), path);
    EXPECT_EQ(s.describe(), j.describe()) << path;
  }
  const UMT5Config xxl = umt5_xxl_config();
  EXPECT_EQ(xxl.inner_dim(), 4096);
  EXPECT_EQ(xxl.num_layers, 24);
  EXPECT_EQ(xxl.d_ff, 10240);
  // A DiT config.json is not a umT5 config.
  const std::string dir = test::temp_dir();
  std::ofstream(dir + "/config.json") << R"({"_class_name": "WanTransformer3DModel", "num_layers": 2})";
  EXPECT_EQ(find_umt5_config_json(dir + "/x.pth"), "");
  EXPECT_TRUE(contains(error_of([&] { umt5_config_from_json(dir + "/config.json"); }), "model_type"));
}

TEST(UMT5, LoaderNamesEveryProblem) {
  const std::string path = fixture("hf/model.safetensors");
  const io::TensorFile f = io::read_tensor_file(path);
  const UMT5Config c = umt5_config_from_json(fixture("hf/config.json"));
  std::vector<std::pair<std::string, Tensor>> bad;
  for (const auto& [n, t] : f.tensors) {
    if (n == "encoder.block.1.layer.0.SelfAttention.v.weight") continue;  // missing
    if (n == "encoder.block.0.layer.1.DenseReluDense.wo.weight") {
      bad.emplace_back(n, t.slice(1, 0, 95));  // mis-shaped
      continue;
    }
    bad.emplace_back(n, t);
  }
  bad.emplace_back("encoder.block.0.layer.0.SelfAttention.qq.weight", f.tensors.front().second);  // unexpected
  bad.emplace_back("encoder.block.0.layer.0.layer_norm.bias", Tensor::zeros({64}, DType::F32));
  const std::string msg = error_of([&] { match_umt5_tensors(bad, c, UMT5Layout::HF, path); });
  EXPECT_TRUE(contains(msg, "4 problems")) << msg;
  EXPECT_TRUE(contains(msg, "missing: encoder.block.1.layer.0.SelfAttention.v.weight")) << msg;
  EXPECT_TRUE(contains(msg, "wrong shape: encoder.block.0.layer.1.DenseReluDense.wo.weight is [64, 95], expected [64, 96]"))
      << msg;
  EXPECT_TRUE(contains(msg, "unexpected: encoder.block.0.layer.0.SelfAttention.qq.weight")) << msg;
  EXPECT_TRUE(contains(msg, "unexpected: encoder.block.0.layer.0.layer_norm.bias")) << msg;
  // Wan names are reported as Wan names; a non-float tensor is named with its dtype.
  const io::TensorFile w = io::read_tensor_file(fixture("wan_umt5.pth"));
  std::vector<std::pair<std::string, Tensor>> wbad;
  for (const auto& [n, t] : w.tensors)
    if (n != "norm.weight") wbad.emplace_back(n, n == "blocks.0.norm1.weight" ? Tensor::zeros({64}, DType::I32) : t);
  const std::string wmsg = error_of([&] { match_umt5_tensors(wbad, c, UMT5Layout::Wan, "wan.pth"); });
  EXPECT_TRUE(contains(wmsg, "missing: norm.weight")) << wmsg;
  EXPECT_TRUE(contains(wmsg, "wrong dtype: blocks.0.norm1.weight is i32")) << wmsg;
  // A full HF UMT5 model's decoder and LM head are skipped, not errors.
  std::vector<std::pair<std::string, Tensor>> full = f.tensors;
  full.emplace_back("decoder.block.0.layer.0.SelfAttention.q.weight", Tensor::zeros({64, 64}, DType::F32));
  full.emplace_back("lm_head.weight", Tensor::zeros({150, 64}, DType::F32));
  full.emplace_back("encoder.embed_tokens.weight", *f.find("shared.weight"));  // HF's tied copy of shared.weight
  EXPECT_EQ(match_umt5_tensors(full, c, UMT5Layout::HF, path).size(), size_t(2 + 10 * c.num_layers));
  // Mixed layouts and non-umT5 files.
  std::vector<std::pair<std::string, Tensor>> mixed = {{"shared.weight", Tensor::zeros({2, 2}, DType::F32)},
                                                       {"blocks.0.norm1.weight", Tensor::zeros({2}, DType::F32)}};
  EXPECT_TRUE(contains(error_of([&] { detect_umt5_layout(mixed, "m"); }), "mixes Wan umT5 names")) << "mixed";
  EXPECT_TRUE(contains(error_of([&] { load_umt5(test::source_dir() + "/fixtures/dit/t2v/wan_original.safetensors", {}); }),
                       "not a umT5 encoder checkpoint"));
}

class UMT5Forward : public ::testing::TestWithParam<std::string> {};

TEST_P(UMT5Forward, MatchesTransformers) {
  const auto expected = read_map(fixture("expected.safetensors"));
  const UMT5Encoder enc(load_umt5(fixture(GetParam()), {}));
  EXPECT_EQ(enc.weights().layout, GetParam() == "wan_umt5.pth" ? UMT5Layout::Wan : UMT5Layout::HF);
  const Tensor out = enc.forward(expected.at("input_ids"), expected.at("attention_mask"));
  ASSERT_EQ(out.shape(), expected.at("last_hidden_state").shape());
  // Every row, padding rows included, as transformers computes them (fp32 both sides).
  const test::Accuracy acc = test::compare(out, expected.at("last_hidden_state"));
  std::printf("umT5 %s vs transformers: %s\n", GetParam().c_str(), acc.str().c_str());
  TD_EXPECT_CLOSE(acc, 1e-5, 0.99999);
  // The zero-pad rule: real rows kept, the rest zero.
  const Tensor lens_t = expected.at("context_lens");
  const std::vector<int64_t> lens(lens_t.data<int64_t>(), lens_t.data<int64_t>() + lens_t.numel());
  const Tensor ctx = zero_pad_context(out, lens);
  TD_EXPECT_CLOSE(test::compare(ctx, expected.at("context")), 1e-5, 0.99999);
  for (int64_t b = 0; b < ctx.size(0); ++b)
    for (int64_t i = lens[size_t(b)]; i < ctx.size(1); ++i)
      for (int64_t d = 0; d < ctx.size(2); ++d) ASSERT_EQ(ctx.data<float>()[(b * ctx.size(1) + i) * ctx.size(2) + d], 0.f);
}

INSTANTIATE_TEST_SUITE_P(Layouts, UMT5Forward, ::testing::Values("wan_umt5.pth", "hf", "hf/model.safetensors"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

TEST(UMT5, Bf16RunDtypeOnHost) {
  // The graph CUDA runs (bf16 linears and activations, fp32 residual stream,
  // norms and softmax), emulated by the host ops: within the issue's 2e-2 of
  // transformers' fp32 forward.
  const auto expected = read_map(fixture("expected.safetensors"));
  UMT5LoadOptions o;
  o.dtype = DType::BF16;
  const UMT5Encoder enc(load_umt5(fixture("wan_umt5.pth"), o));
  EXPECT_EQ(enc.weights().layers[0].q.dtype(), DType::BF16);
  EXPECT_EQ(enc.weights().layers[0].norm1.dtype(), DType::F32);
  const Tensor out = enc.forward(expected.at("input_ids"), expected.at("attention_mask"));
  EXPECT_EQ(out.dtype(), DType::F32);
  const test::Accuracy acc = test::compare(out, expected.at("last_hidden_state"));
  std::printf("umT5 bf16 (host) vs transformers fp32: %s\n", acc.str().c_str());
  TD_EXPECT_CLOSE(acc, 2e-2, 0.999);
}

TEST(UMT5, PaddingLengthDoesNotChangeRealRows) {
  // Real tokens attend only to real tokens, and the bias depends on relative
  // positions alone: any padded length (awkward ones here) gives the same rows.
  const auto expected = read_map(fixture("expected.safetensors"));
  const UMT5Tokenizer tok = UMT5Tokenizer::load(fixture("tokenizer"));
  const UMT5Encoder enc(load_umt5(fixture("hf"), {}));
  const auto prompts = fixture_prompts();
  const int64_t max_len = 45 + int64_t(test::rng()() % 40);
  const TokenizedBatch b = tok.tokenize({prompts[0].raw, prompts[2].raw}, max_len);
  const Tensor out = enc.forward(b.ids, b.mask);
  const Tensor ref = expected.at("last_hidden_state");
  const int64_t fixture_rows[] = {0, 2};
  for (int64_t i = 0; i < 2; ++i) {
    const int64_t n = b.lengths[size_t(i)];
    TD_EXPECT_CLOSE(test::compare(out.select(0, i).slice(0, 0, n).contiguous(),
                                  ref.select(0, fixture_rows[i]).slice(0, 0, n).contiguous()),
                    1e-5, 0.99999);
  }
  // Out-of-vocabulary ids are named.
  Tensor ids = b.ids.clone();
  ids.data<int64_t>()[3] = 150;
  EXPECT_TRUE(contains(error_of([&] { enc.forward(ids, b.mask); }), "token id 150 at position 3"));
}

TEST(UMT5, EncodeTextCli) {
  const std::string dir = test::temp_dir();
  const auto prompts = fixture_prompts();
  const std::string out = dir + "/emb.safetensors";
  // Shell-quote the raw prompt (it holds quotes, '&' and newlines).
  std::string quoted = "'";
  for (char ch : prompts[1].raw) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  quoted += "'";
  auto r = test::run_cli("encode-text --text-encoder " + fixture("wan_umt5.pth") + " --tokenizer " +
                         fixture("tokenizer") + " --prompt " + quoted + " --out " + out + " --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto got = read_map(out);
  const auto expected = read_map(fixture("expected.safetensors"));
  ASSERT_EQ(got.at("context").shape(), Shape({1, 512, 64}));
  TD_EXPECT_CLOSE(test::compare(got.at("context"), expected.at("context").slice(0, 1, 2).contiguous()), 1e-5, 0.99999);
  EXPECT_EQ(got.at("context_lens").data<int64_t>()[0], int64_t(prompts[1].ids.size()));

  // --dtype bf16 on the host: the bf16 graph, within 2e-2 of transformers.
  r = test::run_cli("encode-text --text-encoder " + fixture("wan_umt5.pth") + " --tokenizer " + fixture("tokenizer") +
                    " --prompt " + quoted + " --out " + dir + "/bf16.safetensors --device cpu --dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  TD_EXPECT_CLOSE(test::compare(read_map(dir + "/bf16.safetensors").at("context"),
                                expected.at("context").slice(0, 1, 2).contiguous()),
                  2e-2, 0.999);

  // Over 512 tokens: truncated with a warning, still 512 rows.
  std::string long_prompt;
  for (int i = 0; i < 80; ++i) long_prompt += "A cat sits on a red chair. ";
  r = test::run_cli("encode-text --text-encoder " + fixture("hf") + " --tokenizer " + fixture("tokenizer/spiece.model") +
                    " --prompt '" + long_prompt + "' --out " + dir + "/long.safetensors --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "truncated")) << r.err;
  EXPECT_EQ(read_map(dir + "/long.safetensors").at("context_lens").data<int64_t>()[0], 512);

  // Bad inputs: non-zero exit, the culprit named, no file written.
  r = test::run_cli("encode-text --text-encoder " + fixture("wan_umt5.pth") + " --tokenizer " + dir +
                    " --prompt x --out " + dir + "/bad.safetensors --device cpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "spiece.model")) << r.err;
  r = test::run_cli("encode-text --text-encoder " + test::source_dir() + "/fixtures/dit/t2v/wan_original.safetensors" +
                    " --tokenizer " + fixture("tokenizer") + " --prompt x --out " + dir + "/bad.safetensors --device cpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "not a umT5 encoder checkpoint")) << r.err;
  EXPECT_FALSE(fs::exists(dir + "/bad.safetensors"));
}

}  // namespace
}  // namespace td
