#include "models/wan/wan_loader.h"

#include <cstring>
#include <set>

#include "core/log.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "models/wan/wan_keys.h"
#include "nn/int8_linear.h"

namespace td::models::wan {
namespace {

constexpr size_t kMaxListedProblems = 20;

std::string join_paths(const std::vector<std::string>& paths) {
  std::string s;
  for (const auto& p : paths) s += (s.empty() ? "" : ", ") + p;
  return s;
}

struct Problems {
  std::vector<std::string> lines;
  void add(std::string s) { lines.push_back(std::move(s)); }
  [[noreturn]] void raise(const std::string& what, const WanConfig& c) const {
    std::string msg = cat(what, ": the checkpoint does not match ", c.describe(), " (config from ", c.source, "): ",
                          lines.size(), lines.size() == 1 ? " problem" : " problems");
    for (size_t i = 0; i < lines.size() && i < kMaxListedProblems; ++i) msg += "\n  " + lines[i];
    if (lines.size() > kMaxListedProblems) msg += cat("\n  ... and ", lines.size() - kMaxListedProblems, " more");
    fail(ErrorKind::Format, msg);
  }
};

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F64; }

// Converts a contiguous host tensor to `dt` (multi-threaded for the common pairs).
Tensor convert_host(const Tensor& src, DType dt) {
  if (src.dtype() == dt) return src;
  Tensor out = Tensor::empty(src.shape(), dt);
  const int64_t n = src.numel();
  const DType st = src.dtype();
  auto run = [&](auto fn) {
    td::parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) fn(i);
    });
  };
  if (st == DType::F32 && dt == DType::BF16) {
    const float* s = src.data<float>();
    uint16_t* d = out.data<uint16_t>();
    run([&](int64_t i) { d[i] = f32_to_bf16(s[i]); });
  } else if (st == DType::BF16 && dt == DType::F32) {
    const uint16_t* s = src.data<uint16_t>();
    float* d = out.data<float>();
    run([&](int64_t i) { d[i] = bf16_to_f32(s[i]); });
  } else if (st == DType::F16 && dt == DType::F32) {
    const uint16_t* s = src.data<uint16_t>();
    float* d = out.data<float>();
    run([&](int64_t i) { d[i] = f16_to_f32(s[i]); });
  } else if (st == DType::BF16 && dt == DType::F16) {
    const uint16_t* s = src.data<uint16_t>();
    uint16_t* d = out.data<uint16_t>();
    run([&](int64_t i) { d[i] = f32_to_f16(bf16_to_f32(s[i])); });
  } else {
    return src.to(dt);  // rare pairs: the generic (slower) conversion
  }
  return out;
}

// TurboDiffusion's block-scaled INT8 weight back to fp32: w = q * scale[n/128][k/128].
Tensor dequantize_block128(const Tensor& q_in, const Tensor& scale_in) {
  const Tensor q = q_in.contiguous(), scale = scale_in.contiguous().to(DType::F32);
  const int64_t n = q.size(0), k = q.size(1), kb = scale.size(1);
  Tensor w = Tensor::empty({n, k}, DType::F32);
  const int8_t* qp = q.data<int8_t>();
  const float* sp = scale.data<float>();
  float* wp = w.data<float>();
  td::parallel_for(n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < k; ++c) wp[r * k + c] = float(qp[r * k + c]) * sp[(r / 128) * kb + c / 128];
  });
  return w;
}

}  // namespace

std::map<std::string, WanSourceTensor> match_wan_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                         const ModelDetection& d, const WanConfig& config,
                                                         const std::string& what) {
  Problems problems;
  const KeyLayout layout = d.layout == KeyLayout::Unknown ? KeyLayout::Original : d.layout;
  // Original name -> (source name, tensor), from every tensor the files hold.
  std::map<std::string, std::pair<std::string, Tensor>> by_original;
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : tensors) {
    const std::string stripped = name.substr(std::min(d.prefix.size(), name.size()));
    auto orig = to_original_name(stripped, layout);
    if (!orig) {
      unexpected.push_back(name);
      continue;
    }
    auto [it, inserted] = by_original.emplace(*orig, std::pair{name, t});
    if (!inserted) problems.add(cat("duplicate: ", it->second.first, " and ", name, " are both ", *orig));
  }
  const bool with_proj_l = [&] {
    for (const auto& [n, v] : by_original)
      if (n.find("local_attn.proj_l.") != std::string::npos) return true;
    return false;
  }();
  const auto shown = [&](const std::string& original) { return d.prefix + from_original_name(original, layout); };

  std::map<std::string, WanSourceTensor> out;
  std::set<std::string> consumed;
  for (const WanTensorSpec& spec : wan_tensor_specs(config, with_proj_l)) {
    const auto it = by_original.find(spec.name);
    if (spec.block_linear_weight) {
      const std::string base = spec.name.substr(0, spec.name.size() - std::strlen(".weight"));
      const auto qi = by_original.find(base + ".int8_weight");
      const auto si = by_original.find(base + ".scale");
      if (qi != by_original.end() || si != by_original.end()) {
        if (qi != by_original.end()) consumed.insert(qi->first);
        if (si != by_original.end()) consumed.insert(si->first);
        if (it != by_original.end()) {
          consumed.insert(it->first);
          problems.add(cat("ambiguous: ", it->second.first, " and the INT8 form ", shown(base + ".int8_weight"),
                           " are both present"));
          continue;
        }
        if (qi == by_original.end()) {
          problems.add(cat("missing: ", shown(base + ".int8_weight"), " (its ", si->second.first, " is present)"));
          continue;
        }
        if (si == by_original.end()) {
          problems.add(cat("missing: ", shown(base + ".scale"), " (its ", qi->second.first, " is present)"));
          continue;
        }
        const Tensor& q = qi->second.second;
        const Tensor& s = si->second.second;
        const Shape scale_shape{(spec.shape[0] + 127) / 128, (spec.shape[1] + 127) / 128};
        bool ok = true;
        if (q.dtype() != DType::I8 || q.shape() != spec.shape) {
          problems.add(cat("wrong INT8 weight: ", qi->second.first, " is ", dtype_name(q.dtype()), shape_str(q.shape()),
                           ", expected i8", shape_str(spec.shape)));
          ok = false;
        }
        if (s.dtype() != DType::F32 || s.shape() != scale_shape) {
          problems.add(cat("wrong INT8 scale: ", si->second.first, " is ", dtype_name(s.dtype()), shape_str(s.shape()),
                           ", expected f32", shape_str(scale_shape), " (one scale per 128x128 block)"));
          ok = false;
        }
        if (ok) out[spec.name] = {qi->second.first, q, s};
        continue;
      }
    }
    if (it == by_original.end()) {
      problems.add(cat("missing: ", shown(spec.name)));
      continue;
    }
    consumed.insert(it->first);
    const auto& [source, t] = it->second;
    bool shape_ok = t.shape() == spec.shape;
    if (!shape_ok && spec.name == "patch_embedding.weight")
      shape_ok = t.shape() == Shape{config.dim, config.in_dim, config.patch_t, config.patch_h, config.patch_w};
    if (!shape_ok) {
      std::string expected = shape_str(spec.shape);
      if (spec.name == "patch_embedding.weight")
        expected += cat(" or ", shape_str({config.dim, config.in_dim, config.patch_t, config.patch_h, config.patch_w}));
      problems.add(cat("wrong shape: ", source, " is ", shape_str(t.shape()), ", expected ", expected));
      continue;
    }
    if (!is_float(t.dtype())) {
      problems.add(cat("wrong dtype: ", source, " is ", dtype_name(t.dtype()), ", expected a floating-point tensor"));
      continue;
    }
    out[spec.name] = {source, t, Tensor()};
  }
  for (const auto& [orig, v] : by_original)
    if (!consumed.count(orig)) unexpected.push_back(v.first);
  for (const auto& n : unexpected) problems.add(cat("unexpected: ", n));
  if (!problems.lines.empty()) problems.raise(what, config);
  return out;
}

WanCheckpoint load_wan_checkpoint(const std::vector<std::string>& paths, const WanLoadOptions& o) {
  TD_CHECK(!paths.empty(), Usage, "no Wan DiT weights given");
  TD_CHECK(o.dtype == DType::F32 || o.dtype == DType::BF16 || o.dtype == DType::F16, Usage,
           "Wan DiT run dtype must be f32, bf16 or f16, got ", dtype_name(o.dtype));
  const std::string what = join_paths(paths);

  // 1. Read every file (zero-copy host views) and merge their tensors.
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> file_of;
  for (const auto& p : paths) {
    io::TensorFile f = io::read_tensor_file(p);
    for (auto& [n, t] : f.tensors) {
      auto [it, inserted] = file_of.emplace(n, f.path);
      TD_CHECK(inserted, Format, "tensor ", n, " is in both ", it->second, " and ", f.path);
      tensors.emplace_back(n, t);
    }
  }
  std::vector<TensorMeta> metas;
  metas.reserve(tensors.size());
  for (const auto& [n, t] : tensors) metas.push_back({n, t.dtype(), t.shape()});

  WanCheckpoint ck;
  ck.paths = paths;
  ck.detection = detect_model(metas);
  TD_CHECK(ck.detection.kind == ModelKind::WanDiT, Format, what, " is not a Wan DiT checkpoint (",
           ck.detection.description, ")");

  // 2. The config: explicit, beside the weights, or detected.
  std::string cfg = o.config_path.empty() ? find_wan_config_json(paths.front()) : o.config_path;
  if (!cfg.empty()) {
    ck.config = wan_config_from_json(cfg);
    log_info("Wan DiT config from ", cfg, ": ", ck.config.describe());
  } else {
    ck.config = wan_config_from_detection(ck.detection, what);
    log_info("Wan DiT config detected from ", what, ": ", ck.config.describe());
  }

  // 3. Check every tensor before converting any.
  const auto matched = match_wan_tensors(tensors, ck.detection, ck.config, what);

  // 4. Convert and copy, one tensor at a time.
  size_t total = 0, int8_count = 0;
  for (const auto& [name, src] : matched) total += src.tensor.nbytes();
  ProgressBar bar(o.device.is_cuda() ? "loading DiT to GPU" : "loading DiT", int64_t(total), "B");
  const auto specs = wan_tensor_specs(ck.config, /*with_proj_l=*/true);
  std::map<std::string, const WanTensorSpec*> spec_of;
  for (const auto& s : specs) spec_of[s.name] = &s;
  for (const auto& [name, src] : matched) {
    const WanTensorSpec& spec = *spec_of.at(name);
    const DType dt = spec.dtype == WanParamDType::Run ? o.dtype : DType::F32;
    if (o.int8_variant && spec.block_linear_weight) {
      const std::string base = name.substr(0, name.size() - std::strlen(".weight"));
      ops::Int8LinearWeight w;
      if (src.int8_scale.defined()) {
        w = nn::int8_weight_from_turbodiffusion(src.tensor, src.int8_scale, *o.int8_variant, src.source_name);
        ++ck.int8_from_checkpoint;
      } else {
        w = nn::quantize_linear_weight(src.tensor, *o.int8_variant);
        ++ck.int8_quantized_at_load;
      }
      if (o.device.is_cuda()) {
        w.q = w.q.to(o.device);
        w.scale = w.scale.to(o.device);
      }
      ck.device_bytes += w.q.nbytes() + w.scale.nbytes();
      ck.int8_weights[base] = std::move(w);
      bar.advance(int64_t(src.tensor.nbytes()));
      continue;
    }
    Tensor host;
    if (src.int8_scale.defined()) {
      host = convert_host(dequantize_block128(src.tensor, src.int8_scale), dt);
      ++int8_count;
    } else {
      host = convert_host(src.tensor.contiguous(), dt);
    }
    host = host.view(spec.shape);  // Conv3d patch embedding -> Linear [D, C * pt * ph * pw]
    ck.tensors[name] = o.device.is_cuda() ? host.to(o.device) : host;
    ck.device_bytes += ck.tensors[name].nbytes();
    if (spec.proj_l) ck.has_proj_l = true;
    bar.advance(int64_t(src.tensor.nbytes()));
  }
  bar.finish();
  if (int8_count) {
    ck.int8_dequantized = true;
    log_warn(what, ": TurboDiffusion INT8 checkpoint: ", int8_count,
             " block linears (*.int8_weight + 128x128-block *.scale) were dequantized to ", dtype_name(o.dtype),
             " at load (w = q * scale); pass --quant-linear to run them as W8A8 INT8 GEMMs");
  }
  if (o.int8_variant) {
    ck.int8_variant = o.int8_variant;
    log_info(what, ": W8A8 block linears (", nn::int8_linear_variant_name(*o.int8_variant), "): ",
             ck.int8_from_checkpoint, " INT8 weights from the checkpoint",
             *o.int8_variant == nn::Int8LinearVariant::PostScale && ck.int8_from_checkpoint
                 ? " (re-quantized per output channel)"
                 : "",
             ", ", ck.int8_quantized_at_load, " float weights quantized at load");
  }
  if (ck.has_proj_l)
    log_info(what, ": SLA proj_l tensors loaded (used by --attention sla/sagesla; `original` ignores them)");
  return ck;
}

}  // namespace td::models::wan
