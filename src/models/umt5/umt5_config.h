// umT5 encoder configurations: umT5-XXL as Wan uses it (wan/modules/t5.py
// umt5_xxl, encoder only), an HF `config.json` (model_type "umt5"/"t5", any
// size; tiny test models), or the sizes read from a checkpoint's shapes.
#pragma once

#include <cstdint>
#include <string>

namespace td::models::umt5 {

struct UMT5Config {
  int64_t vocab = 256384, d_model = 4096, d_kv = 64, num_heads = 64, d_ff = 10240, num_layers = 24;
  int64_t num_buckets = 32, max_distance = 128;  // relative-position buckets (bidirectional)
  float eps = 1e-6f;                             // T5 RMSNorm epsilon
  int64_t pad_id = 0, eos_id = 1;
  std::string source = "umT5-XXL";  // where the config came from, for messages

  int64_t inner_dim() const { return d_kv * num_heads; }
  // Throws Format naming the source when a size is non-positive or the buckets
  // cannot be split as T5 splits them (even count, max_distance above the exact half).
  void validate() const;
  std::string describe() const;
};

// umT5-XXL: vocab 256384, d_model 4096, 64 heads x 64, d_ff 10240, 24 layers.
UMT5Config umt5_xxl_config();

// An HF T5/UMT5 config.json. Throws Io/Format naming the file; a config of a
// model that is not T5-like, or a non-gated / non-GELU feed-forward, is an error.
UMT5Config umt5_config_from_json(const std::string& path);

// Whether `path` is a JSON object whose model_type is "umt5" or "t5" (a Wan
// checkpoint folder also holds the DiT's config.json, which must be skipped).
bool is_umt5_config_json(const std::string& path);

// The umT5 config.json beside a weights path (`<dir>/config.json` for a folder,
// the file's folder otherwise) when it is a T5/UMT5 config; "" otherwise.
std::string find_umt5_config_json(const std::string& weights_path);

}  // namespace td::models::umt5
