// Loads a umT5 encoder from Wan's `models_t5_umt5-xxl-enc-bf16.pth` names
// (wan/modules/t5.py: token_embedding, blocks.i.{norm1,attn,pos_embedding,
// norm2,ffn}, norm) or from HF `UMT5EncoderModel` names (shared,
// encoder.block.i.layer.{0,1}..., encoder.final_layer_norm), in any format
// io::read_tensor_file reads (.pth, safetensors, a sharded folder).
//
// Every tensor is checked before any is converted: all missing, unexpected and
// mis-shaped tensors are named together in one Format error. The sizes come
// from an explicit config.json, else a T5/UMT5 config.json beside the weights,
// else the shapes (all umT5 sizes are visible in them; max_distance and eps
// take umT5's 128 and 1e-6).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "models/umt5/umt5_config.h"

namespace td::models::umt5 {

enum class UMT5Layout { Wan, HF };
const char* umt5_layout_name(UMT5Layout l);

// Wan name <-> HF name (reference §4). nullopt-like "" when the name is not an
// encoder tensor of that layout. "encoder.embed_tokens.weight" (HF's tied copy
// of "shared.weight") maps to token_embedding.weight too.
std::string umt5_wan_to_hf_name(const std::string& wan_name);
std::string umt5_hf_to_wan_name(const std::string& hf_name);

struct UMT5LoadOptions {
  Device device = Device::cpu();
  DType dtype = DType::F32;  // run dtype of the linears: f32 (CPU reference) or bf16 (CUDA)
  std::string config_path;   // "" = a T5/UMT5 config.json beside the weights, else detected from shapes
};

struct UMT5Layer {
  Tensor norm1, q, k, v, o, norm2, gate, fc1, fc2;  // on the device: norms f32 [d_model], linears run dtype
  Tensor relative_bias;                             // f32 [num_buckets, num_heads] on the device
};

struct UMT5Weights {
  UMT5Config config;
  UMT5Layout layout = UMT5Layout::Wan;
  std::string path;
  DType dtype = DType::F32;
  Device device = Device::cpu();
  // Host, as read (a view of the file mapping when possible): only the rows of
  // the prompt's tokens are gathered and sent to the device, so the 2 GB
  // umT5-XXL table never occupies GPU memory.
  Tensor token_embedding;  // [vocab, d_model]
  std::vector<UMT5Layer> layers;
  Tensor final_norm;  // f32 [d_model] on the device
};

// Checks names, shapes and dtypes; returns Wan name -> host tensor as read.
// `what` names the checkpoint in messages. Used by load_umt5 and the tests.
std::vector<std::pair<std::string, Tensor>> match_umt5_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                               const UMT5Config& config, UMT5Layout layout,
                                                               const std::string& what);

// The layout of a set of names: Wan when token_embedding.weight / blocks.* are
// present, HF when shared.weight / encoder.* are; a mix or neither is a Format
// error naming `what` and an example name.
UMT5Layout detect_umt5_layout(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& what);

// The sizes read from the shapes (Format error naming the tensor when one is missing).
UMT5Config umt5_config_from_shapes(const std::vector<std::pair<std::string, Tensor>>& tensors, UMT5Layout layout,
                                   const std::string& what);

UMT5Weights load_umt5(const std::string& path, const UMT5LoadOptions& options);

}  // namespace td::models::umt5
