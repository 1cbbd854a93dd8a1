#include "models/umt5/umt5_config.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace td::models::umt5 {
namespace fs = std::filesystem;
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  TD_CHECK(f.good(), Io, "cannot open umT5 config ", path);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::Format, path, ": not valid JSON (", e.what(), ")");
  }
}

int64_t json_int(const nlohmann::json& j, const char* key, int64_t def, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return def;
  TD_CHECK(j[key].is_number_integer(), Format, path, ": \"", key, "\" must be an integer, found ", j[key].dump());
  return j[key].get<int64_t>();
}

}  // namespace

void UMT5Config::validate() const {
  if (vocab <= 0 || d_model <= 0 || d_kv <= 0 || num_heads <= 0 || d_ff <= 0 || num_layers <= 0)
    fail(ErrorKind::Format, source, ": every umT5 size must be positive (", describe(), ")");
  if (num_buckets < 4 || num_buckets % 4 != 0)
    fail(ErrorKind::Format, source, ": relative_attention_num_buckets is ", num_buckets,
         ", expected a positive multiple of 4 (half per direction, half of that exact)");
  if (max_distance <= num_buckets / 4)
    fail(ErrorKind::Format, source, ": relative_attention_max_distance is ", max_distance, ", expected more than ",
         num_buckets / 4, " (the exact buckets)");
  if (!(eps > 0.f)) fail(ErrorKind::Format, source, ": layer_norm_epsilon is ", eps, ", expected > 0");
}

std::string UMT5Config::describe() const {
  return cat("umT5 encoder vocab ", vocab, ", d_model ", d_model, ", ", num_heads, " heads x ", d_kv, ", d_ff ", d_ff,
             ", ", num_layers, " layers, ", num_buckets, " buckets / max distance ", max_distance);
}

UMT5Config umt5_xxl_config() { return UMT5Config{}; }

bool is_umt5_config_json(const std::string& path) {
  std::ifstream f(path);
  if (!f.good()) return false;
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("model_type") || !j["model_type"].is_string()) return false;
  const std::string t = j["model_type"].get<std::string>();
  return t == "umt5" || t == "t5";
}

UMT5Config umt5_config_from_json(const std::string& path) {
  const nlohmann::json j = read_json(path);
  TD_CHECK(j.is_object(), Format, path, ": an HF config must be a JSON object");
  const std::string type = j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>()
                                                                                   : std::string("(none)");
  TD_CHECK(type == "umt5" || type == "t5", Format, path, ": model_type is \"", type,
           "\", expected \"umt5\" (the config of a umT5 text encoder)");
  for (const char* key : {"d_model", "d_kv", "num_heads", "d_ff", "num_layers", "vocab_size"})
    TD_CHECK(j.contains(key), Format, path, ": missing \"", key, "\" (an HF UMT5 config has it)");
  if (j.contains("feed_forward_proj")) {
    TD_CHECK(j["feed_forward_proj"].is_string(), Format, path, ": \"feed_forward_proj\" must be a string");
    const std::string ff = j["feed_forward_proj"].get<std::string>();
    TD_CHECK(ff == "gated-gelu", Unsupported, path, ": feed_forward_proj is \"", ff,
             "\"; turbodiff implements umT5's \"gated-gelu\" (GELU-tanh gate) only");
  }
  UMT5Config c;
  c.source = path;
  c.vocab = json_int(j, "vocab_size", c.vocab, path);
  c.d_model = json_int(j, "d_model", c.d_model, path);
  c.d_kv = json_int(j, "d_kv", c.d_kv, path);
  c.num_heads = json_int(j, "num_heads", c.num_heads, path);
  c.d_ff = json_int(j, "d_ff", c.d_ff, path);
  c.num_layers = json_int(j, "num_layers", c.num_layers, path);
  c.num_buckets = json_int(j, "relative_attention_num_buckets", c.num_buckets, path);
  c.max_distance = json_int(j, "relative_attention_max_distance", c.max_distance, path);
  c.pad_id = json_int(j, "pad_token_id", c.pad_id, path);
  c.eos_id = json_int(j, "eos_token_id", c.eos_id, path);
  if (j.contains("layer_norm_epsilon")) {
    TD_CHECK(j["layer_norm_epsilon"].is_number(), Format, path, ": \"layer_norm_epsilon\" must be a number, found ",
             j["layer_norm_epsilon"].dump());
    c.eps = j["layer_norm_epsilon"].get<float>();
  }
  c.validate();
  return c;
}

std::string find_umt5_config_json(const std::string& weights_path) {
  std::error_code ec;
  const fs::path p(weights_path);
  const fs::path dir = fs::is_directory(p, ec) ? p : p.parent_path();
  const fs::path cfg = (dir.empty() ? fs::path(".") : dir) / "config.json";
  return fs::is_regular_file(cfg, ec) && is_umt5_config_json(cfg.string()) ? cfg.string() : std::string();
}

}  // namespace td::models::umt5
