#include "models/umt5/umt5_loader.h"

#include <map>
#include <regex>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"

namespace td::models::umt5 {
namespace {

constexpr size_t kMaxListedProblems = 20;

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F64; }

// Per-layer Wan suffix <-> HF suffix (after "blocks.i." / "encoder.block.i.layer.").
struct LayerName {
  const char* wan;
  const char* hf;
};
constexpr LayerName kLayerNames[] = {
    {"norm1.weight", "0.layer_norm.weight"},
    {"attn.q.weight", "0.SelfAttention.q.weight"},
    {"attn.k.weight", "0.SelfAttention.k.weight"},
    {"attn.v.weight", "0.SelfAttention.v.weight"},
    {"attn.o.weight", "0.SelfAttention.o.weight"},
    {"pos_embedding.embedding.weight", "0.SelfAttention.relative_attention_bias.weight"},
    {"norm2.weight", "1.layer_norm.weight"},
    {"ffn.gate.0.weight", "1.DenseReluDense.wi_0.weight"},  // the GELU branch
    {"ffn.fc1.weight", "1.DenseReluDense.wi_1.weight"},
    {"ffn.fc2.weight", "1.DenseReluDense.wo.weight"},
};

struct Spec {
  std::string name;  // Wan name
  Shape shape;
};

std::vector<Spec> specs_of(const UMT5Config& c) {
  std::vector<Spec> s;
  s.push_back({"token_embedding.weight", {c.vocab, c.d_model}});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = cat("blocks.", i, ".");
    s.push_back({p + "norm1.weight", {c.d_model}});
    for (const char* x : {"q", "k", "v"}) s.push_back({p + "attn." + x + ".weight", {c.inner_dim(), c.d_model}});
    s.push_back({p + "attn.o.weight", {c.d_model, c.inner_dim()}});
    s.push_back({p + "pos_embedding.embedding.weight", {c.num_buckets, c.num_heads}});
    s.push_back({p + "norm2.weight", {c.d_model}});
    s.push_back({p + "ffn.gate.0.weight", {c.d_ff, c.d_model}});
    s.push_back({p + "ffn.fc1.weight", {c.d_ff, c.d_model}});
    s.push_back({p + "ffn.fc2.weight", {c.d_model, c.d_ff}});
  }
  s.push_back({"norm.weight", {c.d_model}});
  return s;
}

std::string shown_name(const std::string& wan, UMT5Layout l) {
  return l == UMT5Layout::Wan ? wan : umt5_wan_to_hf_name(wan);
}

// Converts a host tensor to `dt` (split over the thread pool: umT5-XXL is
// 5.7 B parameters) and places it on `device`.
Tensor place(const Tensor& host, DType dt, Device device) {
  Tensor t = host.contiguous();
  if (t.dtype() != dt) {
    Tensor out = Tensor::empty(t.shape(), dt);
    const auto* src = static_cast<const uint8_t*>(t.raw_data());
    auto* dst = static_cast<uint8_t*>(out.raw_data());
    const size_t si = dtype_size(t.dtype()), di = dtype_size(dt);
    const DType st = t.dtype();
    td::parallel_for(t.numel(), 1 << 16, [&](int64_t b, int64_t e) {
      convert_elements(src + size_t(b) * si, st, dst + size_t(b) * di, dt, size_t(e - b));
    });
    t = out;
  }
  return device.is_cuda() ? t.to(device) : t;
}

}  // namespace

const char* umt5_layout_name(UMT5Layout l) { return l == UMT5Layout::Wan ? "Wan (.pth names)" : "HF UMT5EncoderModel"; }

std::string umt5_wan_to_hf_name(const std::string& n) {
  if (n == "token_embedding.weight") return "shared.weight";
  if (n == "norm.weight") return "encoder.final_layer_norm.weight";
  static const std::regex re(R"(blocks\.(\d+)\.(.+))");
  std::smatch m;
  if (!std::regex_match(n, m, re)) return "";
  for (const LayerName& ln : kLayerNames)
    if (m[2] == ln.wan) return cat("encoder.block.", m[1].str(), ".layer.", ln.hf);
  return "";
}

std::string umt5_hf_to_wan_name(const std::string& n) {
  if (n == "shared.weight" || n == "encoder.embed_tokens.weight") return "token_embedding.weight";
  if (n == "encoder.final_layer_norm.weight") return "norm.weight";
  static const std::regex re(R"(encoder\.block\.(\d+)\.layer\.(.+))");
  std::smatch m;
  if (!std::regex_match(n, m, re)) return "";
  for (const LayerName& ln : kLayerNames)
    if (m[2] == ln.hf) return cat("blocks.", m[1].str(), ".", ln.wan);
  return "";
}

UMT5Layout detect_umt5_layout(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& what) {
  std::string wan_example, hf_example;
  for (const auto& [n, t] : tensors) {
    // Only names of umT5 encoder tensors count (a Wan DiT also has blocks.*).
    if (wan_example.empty() && !umt5_wan_to_hf_name(n).empty()) wan_example = n;
    if (hf_example.empty() && !umt5_hf_to_wan_name(n).empty()) hf_example = n;
  }
  if (!wan_example.empty() && !hf_example.empty())
    fail(ErrorKind::Format, what, ": mixes Wan umT5 names (", wan_example, ") and HF UMT5 names (", hf_example,
         "); expected one layout");
  if (!wan_example.empty()) return UMT5Layout::Wan;
  if (!hf_example.empty()) return UMT5Layout::HF;
  fail(ErrorKind::Format, what, ": not a umT5 encoder checkpoint: none of its tensors has a Wan umT5 name "
       "(token_embedding.weight, blocks.i.attn.q.weight, ...) or an HF UMT5EncoderModel name (shared.weight, "
       "encoder.block.i.layer.0.SelfAttention.q.weight, ...)", tensors.empty() ? " (the file holds no tensors)" : "",
       tensors.empty() ? "" : cat(" (first tensor: ", tensors.front().first, ")"));
}

UMT5Config umt5_config_from_shapes(const std::vector<std::pair<std::string, Tensor>>& tensors, UMT5Layout layout,
                                   const std::string& what) {
  std::map<std::string, Tensor> by_wan;
  for (const auto& [n, t] : tensors) {
    const std::string w = layout == UMT5Layout::Wan ? n : umt5_hf_to_wan_name(n);
    if (!w.empty()) by_wan.emplace(w, t);
  }
  const auto need = [&](const std::string& wan, int64_t rank) -> const Tensor& {
    const auto it = by_wan.find(wan);
    if (it == by_wan.end())
      fail(ErrorKind::Format, what, ": missing ", shown_name(wan, layout),
           ", needed to read the encoder's sizes (or give its config.json)");
    if (it->second.dim() != rank)
      fail(ErrorKind::Format, what, ": ", shown_name(wan, layout), " is ", shape_str(it->second.shape()),
           ", expected a ", rank, "-d tensor");
    return it->second;
  };
  UMT5Config c;
  c.source = cat("the shapes in ", what);
  const Tensor& emb = need("token_embedding.weight", 2);
  c.vocab = emb.size(0);
  c.d_model = emb.size(1);
  int64_t layers = 0;
  while (by_wan.count(cat("blocks.", layers, ".attn.q.weight"))) ++layers;
  c.num_layers = layers;
  TD_CHECK(layers > 0, Format, what, ": no encoder layers (", shown_name("blocks.0.attn.q.weight", layout), " missing)");
  const Tensor& rel = need("blocks.0.pos_embedding.embedding.weight", 2);
  c.num_buckets = rel.size(0);
  c.num_heads = rel.size(1);
  const Tensor& q = need("blocks.0.attn.q.weight", 2);
  TD_CHECK(q.size(0) % c.num_heads == 0, Format, what, ": ", shown_name("blocks.0.attn.q.weight", layout), " has ",
           q.size(0), " rows, not a multiple of the ", c.num_heads, " heads of its relative-position embedding");
  c.d_kv = q.size(0) / c.num_heads;
  c.d_ff = need("blocks.0.ffn.fc1.weight", 2).size(0);
  c.validate();
  return c;
}

std::vector<std::pair<std::string, Tensor>> match_umt5_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                               const UMT5Config& config, UMT5Layout layout,
                                                               const std::string& what) {
  std::vector<std::string> problems;
  std::map<std::string, std::pair<std::string, Tensor>> by_wan;  // Wan name -> (source name, tensor)
  std::vector<std::string> unexpected;
  const std::pair<std::string, Tensor>* tied_copy = nullptr;  // HF encoder.embed_tokens.weight
  size_t skipped_decoder = 0;
  for (const auto& nt : tensors) {
    const std::string& n = nt.first;
    if (layout == UMT5Layout::HF && n == "encoder.embed_tokens.weight") {
      tied_copy = &nt;
      continue;
    }
    // A full HF UMT5 model (google/umt5-xxl is encoder-decoder): the decoder
    // and LM head are not the encoder's; skip them as UMT5EncoderModel does.
    if (layout == UMT5Layout::HF && (n.rfind("decoder.", 0) == 0 || n == "lm_head.weight")) {
      ++skipped_decoder;
      continue;
    }
    std::string w = layout == UMT5Layout::Wan ? (umt5_wan_to_hf_name(n).empty() ? "" : n) : umt5_hf_to_wan_name(n);
    if (w.empty()) {
      unexpected.push_back(n);
      continue;
    }
    auto [it, inserted] = by_wan.emplace(w, nt);
    if (!inserted) problems.push_back(cat("duplicate: ", it->second.first, " and ", n, " are both ", w));
  }
  // HF writes the tied embedding as shared.weight and, in some files, also as
  // encoder.embed_tokens.weight: either is the token embedding.
  if (tied_copy) {
    auto it = by_wan.find("token_embedding.weight");
    if (it == by_wan.end()) {
      by_wan.emplace("token_embedding.weight", *tied_copy);
    } else if (it->second.second.shape() != tied_copy->second.shape()) {
      problems.push_back(cat("wrong shape: ", tied_copy->first, " is ", shape_str(tied_copy->second.shape()),
                             ", expected ", shape_str(it->second.second.shape()), " (the shape of shared.weight)"));
    }
  }
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<std::string> consumed;
  for (const Spec& spec : specs_of(config)) {
    const auto it = by_wan.find(spec.name);
    if (it == by_wan.end()) {
      problems.push_back(cat("missing: ", shown_name(spec.name, layout)));
      continue;
    }
    consumed.insert(spec.name);
    const auto& [source, t] = it->second;
    if (t.shape() != spec.shape) {
      problems.push_back(cat("wrong shape: ", source, " is ", shape_str(t.shape()), ", expected ", shape_str(spec.shape)));
      continue;
    }
    if (!is_float(t.dtype())) {
      problems.push_back(cat("wrong dtype: ", source, " is ", dtype_name(t.dtype()), ", expected a floating-point tensor"));
      continue;
    }
    out.emplace_back(spec.name, t);
  }
  for (const auto& [w, v] : by_wan)
    if (!consumed.count(w)) unexpected.push_back(v.first);
  if (skipped_decoder)
    log_info(what, ": ", skipped_decoder, " decoder / lm_head tensors of a full UMT5 model skipped (the encoder is used)");
  for (const auto& n : unexpected) problems.push_back(cat("unexpected: ", n));
  if (!problems.empty()) {
    std::string msg = cat(what, " (", umt5_layout_name(layout), " names): the checkpoint does not match ",
                          config.describe(), " (config from ", config.source, "): ", problems.size(),
                          problems.size() == 1 ? " problem" : " problems");
    for (size_t i = 0; i < problems.size() && i < kMaxListedProblems; ++i) msg += "\n  " + problems[i];
    if (problems.size() > kMaxListedProblems) msg += cat("\n  ... and ", problems.size() - kMaxListedProblems, " more");
    fail(ErrorKind::Format, msg);
  }
  return out;
}

UMT5Weights load_umt5(const std::string& path, const UMT5LoadOptions& o) {
  TD_CHECK(o.dtype == DType::F32 || o.dtype == DType::BF16, Usage, "umT5 run dtype must be f32 or bf16, got ",
           dtype_name(o.dtype));
  io::TensorFile file = io::read_tensor_file(path);
  const UMT5Layout layout = detect_umt5_layout(file.tensors, path);

  UMT5Weights w;
  w.path = path;
  w.layout = layout;
  w.dtype = o.dtype;
  w.device = o.device;
  const std::string cfg = o.config_path.empty() ? find_umt5_config_json(path) : o.config_path;
  if (!cfg.empty()) {
    w.config = umt5_config_from_json(cfg);
    log_info("umT5 config from ", cfg, ": ", w.config.describe());
  } else {
    w.config = umt5_config_from_shapes(file.tensors, layout, path);
    log_info("umT5 config read from the shapes in ", path, ": ", w.config.describe());
  }
  const auto matched = match_umt5_tensors(file.tensors, w.config, layout, path);

  std::map<std::string, Tensor> t(matched.begin(), matched.end());
  const auto norm = [&](const std::string& n) { return place(t.at(n), DType::F32, o.device); };
  const auto linear = [&](const std::string& n) { return place(t.at(n), o.dtype, o.device); };
  w.token_embedding = t.at("token_embedding.weight");
  w.layers.resize(size_t(w.config.num_layers));
  for (int64_t i = 0; i < w.config.num_layers; ++i) {
    const std::string p = cat("blocks.", i, ".");
    UMT5Layer& l = w.layers[size_t(i)];
    l.norm1 = norm(p + "norm1.weight");
    l.q = linear(p + "attn.q.weight");
    l.k = linear(p + "attn.k.weight");
    l.v = linear(p + "attn.v.weight");
    l.o = linear(p + "attn.o.weight");
    l.relative_bias = norm(p + "pos_embedding.embedding.weight");  // f32 on the device, like the norms
    l.norm2 = norm(p + "norm2.weight");
    l.gate = linear(p + "ffn.gate.0.weight");
    l.fc1 = linear(p + "ffn.fc1.weight");
    l.fc2 = linear(p + "ffn.fc2.weight");
  }
  w.final_norm = norm("norm.weight");
  return w;
}

}  // namespace td::models::umt5
