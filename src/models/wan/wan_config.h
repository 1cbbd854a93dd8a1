// Wan DiT configurations: the published sizes (Wan2.1-T2V-1.3B, Wan2.1-T2V-14B,
// Wan2.2-I2V-A14B experts), a diffusers `config.json` (any size; tiny test
// models need it, since the head count cannot be inferred from shapes), or
// what models/detect.h found in a checkpoint's names and shapes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "models/detect.h"

namespace td::models::wan {

struct WanConfig {
  std::string variant = "custom";  // a preset name, or "custom"
  int64_t dim = 0, ffn_dim = 0, num_heads = 0, num_layers = 0;
  int64_t in_dim = 16, out_dim = 16, text_dim = 4096, freq_dim = 256;
  int64_t patch_t = 1, patch_h = 2, patch_w = 2;
  float eps = 1e-6f;
  double rope_theta = 10000.0;
  std::string source;  // where the config came from, for messages

  int64_t head_dim() const { return num_heads > 0 ? dim / num_heads : 0; }
  int64_t patch_volume() const { return patch_t * patch_h * patch_w; }
  int64_t patch_in_features() const { return in_dim * patch_volume(); }    // patch embedding input
  int64_t patch_out_features() const { return out_dim * patch_volume(); }  // head output per token
  // Throws Format naming the source when the sizes are inconsistent
  // (heads not dividing dim, odd head_dim, non-positive sizes, ...).
  void validate() const;
  std::string describe() const;  // one line: variant and sizes
};

// The published sizes: "Wan2.1-T2V-1.3B", "Wan2.1-T2V-14B", "Wan2.2-I2V-A14B".
const std::vector<std::string>& wan_preset_names();
WanConfig wan_preset(std::string_view name);  // Usage error listing the names when unknown

// Reads a diffusers WanTransformer3DModel config.json. Throws Io/Format for a
// bad file, Unsupported for features turbodiff does not implement (the
// Wan2.1 I2V CLIP image branch: image_dim / added_kv_proj_dim).
WanConfig wan_config_from_json(const std::string& path);

// The config.json that applies to a weights path: `<dir>/config.json` for a
// folder, the file's own folder otherwise. "" when there is none.
std::string find_wan_config_json(const std::string& weights_path);

// The config of a checkpoint recognised by detect_model at a published size
// (num_heads = dim / 128). A custom size is a Format error saying config.json
// is needed; the Wan2.1 I2V CLIP branch is Unsupported. `what` names the
// checkpoint in messages.
WanConfig wan_config_from_detection(const ModelDetection& d, const std::string& what);

}  // namespace td::models::wan
