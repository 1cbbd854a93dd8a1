// Decides what a checkpoint is from its tensor names and shapes alone (no
// config file): a Wan DiT (T2V 1.3B / 14B, Wan2.1 I2V, Wan2.2 I2V A14B expert;
// original, diffusers or rCM/TurboDiffusion layout; INT8 "-quant"; with SLA
// proj_l), the Wan VAE, the umT5 text encoder, or the TAEHV tiny decoder
// (madebyollin's taew2_1.pth layout). Used by `turbodiff info`
// and by the loaders to pick a config.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/tensor_file.h"

namespace td::models {

enum class ModelKind { Unknown, WanDiT, WanVAE, UMT5Encoder, TAEHV };

enum class KeyLayout { Unknown, Original, Diffusers };

struct TensorMeta {
  std::string name;
  DType dtype;
  Shape shape;
};

struct ModelDetection {
  ModelKind kind = ModelKind::Unknown;
  KeyLayout layout = KeyLayout::Unknown;
  std::string prefix;        // wrapper prefix stripped from every name ("state_dict.net.", "net.", "")
  std::string variant;       // "Wan2.1-T2V-1.3B", "Wan2.1-T2V-14B", "Wan2.2-I2V-A14B expert", "custom", ...
  std::string description;   // one line for humans
  // DiT facts (0 when unknown)
  int64_t dim = 0, ffn_dim = 0, num_layers = 0, in_dim = 0, out_dim = 0, text_dim = 0, freq_dim = 0;
  bool patch_embedding_linear = false;  // rCM/TurboDiffusion store the patch embedding as Linear [D, in*4]
  bool int8_quantized = false;          // TurboDiffusion "-quant": *.int8_weight + *.scale
  bool has_sla_proj_l = false;          // TurboDiffusion SLA checkpoints: proj_l per block
  bool has_image_cross_attn = false;    // Wan2.1 I2V (CLIP image tokens): k_img / add_k_proj
  std::string weight_dtype;             // dominant dtype of the floating-point weights
  // umT5 / VAE facts
  int64_t vocab = 0, z_dim = 0;
};

ModelDetection detect_model(const std::vector<TensorMeta>& tensors);
ModelDetection detect_model(const io::TensorFile& file);

const char* model_kind_name(ModelKind k);

}  // namespace td::models
