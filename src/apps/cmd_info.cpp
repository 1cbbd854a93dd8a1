// `turbodiff info FILE…`: what is in a checkpoint and what model it is.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "models/detect.h"

namespace td::app {
namespace {

struct InfoOptions {
  std::vector<std::string> files;
  bool json = false;
  bool summary = false;  // skip the per-tensor table
};

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

nlohmann::json detection_json(const models::ModelDetection& d) {
  nlohmann::json j = {{"kind", models::model_kind_name(d.kind)}, {"variant", d.variant},
                      {"description", d.description}, {"weight_dtype", d.weight_dtype}, {"prefix", d.prefix}};
  if (d.kind == models::ModelKind::WanDiT) {
    j["layout"] = d.layout == models::KeyLayout::Diffusers ? "diffusers" : "original";
    j["dim"] = d.dim;
    j["ffn_dim"] = d.ffn_dim;
    j["num_layers"] = d.num_layers;
    j["in_dim"] = d.in_dim;
    j["out_dim"] = d.out_dim;
    j["text_dim"] = d.text_dim;
    j["freq_dim"] = d.freq_dim;
    j["patch_embedding_linear"] = d.patch_embedding_linear;
    j["int8_quantized"] = d.int8_quantized;
    j["sla_proj_l"] = d.has_sla_proj_l;
    j["image_cross_attention"] = d.has_image_cross_attn;
  } else if (d.kind == models::ModelKind::UMT5Encoder) {
    j["vocab"] = d.vocab;
    j["d_model"] = d.dim;
    j["num_layers"] = d.num_layers;
  } else if (d.kind == models::ModelKind::WanVAE || d.kind == models::ModelKind::TAEHV) {
    j["z_dim"] = d.z_dim;
  }
  return j;
}

int run_info(const InfoOptions& o) {
  nlohmann::json all = nlohmann::json::array();
  for (const auto& path : o.files) {
    const io::TensorFile f = io::read_tensor_file(path);
    const auto det = models::detect_model(f);
    std::map<std::string, std::pair<int64_t, size_t>> per_dtype;  // dtype -> (count, bytes)
    int64_t params = 0;
    for (const auto& [n, t] : f.tensors) {
      auto& e = per_dtype[dtype_name(t.dtype())];
      e.first += 1;
      e.second += t.nbytes();
      params += t.numel();
    }
    if (o.json) {
      nlohmann::json j = {{"path", path}, {"format", f.format}, {"tensor_count", f.tensors.size()},
                          {"total_bytes", f.total_bytes()}, {"total_elements", params},
                          {"model", detection_json(det)}};
      nlohmann::json dts = nlohmann::json::object();
      for (const auto& [k, v] : per_dtype) dts[k] = {{"tensors", v.first}, {"bytes", v.second}};
      j["dtypes"] = dts;
      if (!o.summary) {
        nlohmann::json ts = nlohmann::json::array();
        for (const auto& [n, t] : f.tensors)
          ts.push_back({{"name", n}, {"dtype", dtype_name(t.dtype())}, {"shape", t.shape()}, {"bytes", t.nbytes()}});
        j["tensors"] = ts;
      }
      if (!f.metadata.empty()) j["metadata"] = f.metadata;
      all.push_back(j);
      continue;
    }
    std::printf("%s\n  format: %s\n  model:  %s\n", path.c_str(), f.format.c_str(), det.description.c_str());
    if (!det.prefix.empty()) std::printf("  prefix: '%s' (stripped when loading)\n", det.prefix.c_str());
    if (!o.summary) {
      size_t w = 4;
      for (const auto& [n, t] : f.tensors) w = std::max(w, n.size());
      std::printf("  %-*s  %-7s %-22s %s\n", int(w), "name", "dtype", "shape", "bytes");
      for (const auto& [n, t] : f.tensors)
        std::printf("  %-*s  %-7s %-22s %zu\n", int(w), n.c_str(), dtype_name(t.dtype()), shape_str(t.shape()).c_str(),
                    t.nbytes());
    }
    std::printf("  total: %zu tensors, %lld elements, %s\n", f.tensors.size(), (long long)params,
                human_bytes(double(f.total_bytes())).c_str());
    for (const auto& [k, v] : per_dtype)
      std::printf("    %-7s %6lld tensors  %s\n", k.c_str(), (long long)v.first, human_bytes(double(v.second)).c_str());
    for (const auto& [k, v] : f.metadata) std::printf("  metadata %s = %s\n", k.c_str(), v.c_str());
  }
  if (o.json) std::cout << (all.size() == 1 ? all[0] : all).dump(2) << "\n";
  return 0;
}

}  // namespace

void register_info(CLI::App& app, Commands& cmds) {
  auto opts = std::make_shared<InfoOptions>();
  auto* sub = app.add_subcommand("info",
      "Describe checkpoint files: tensors (name, dtype, shape, bytes), totals, and what model each file is");
  sub->add_option("files", opts->files, ".safetensors, *.safetensors.index.json (or its folder), .pth/.pt")
      ->required();
  sub->add_flag("--json", opts->json, "Print JSON (one object per file; an array for several files)");
  sub->add_flag("--summary", opts->summary, "Only the totals and the model, not every tensor");
  cmds.emplace_back(sub, [opts] { return run_info(*opts); });
}

}  // namespace td::app
