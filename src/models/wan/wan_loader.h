// Loads a Wan DiT from any layout turbodiff knows: original Wan names
// (safetensors or .pth), diffusers names (a single or sharded safetensors with
// its index), rCM / TurboDiffusion .pth (wrapper prefixes such as "net." or
// "state_dict.net.", the patch embedding as Linear [D, 64] or Conv3d), SLA
// proj_l tensors, and TurboDiffusion "-quant" INT8 tensors.
//
// Every tensor is checked against the config before anything is converted:
// all missing, unexpected and mis-shaped tensors are reported together, by
// name, in one error. Then tensors are converted one at a time to the dtype
// they run in (matmul weights and biases: the run dtype; time embedding,
// modulation, norms, head, proj_l: f32) and copied to the device, so at most
// one tensor exists twice. On the CPU an f32 tensor that needs no conversion
// is used in place (a view of the file mapping).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/detect.h"
#include "models/wan/wan_config.h"
#include "nn/int8_linear.h"

namespace td::models::wan {

struct WanLoadOptions {
  Device device = Device::cpu();
  DType dtype = DType::F32;  // run dtype of the matmul weights: f32 (CPU reference) or bf16
  // A diffusers config.json to use; "" = the one beside the first weights path
  // if present, else the config detected from names and shapes.
  std::string config_path;
  // W8A8 (--quant-linear): the block linears (q, k, v, o of both attentions,
  // ffn.0, ffn.2; the list TurboDiffusion's Int8Linear replacement covers) are
  // kept as INT8 in this variant's format: TurboDiffusion *.int8_weight/*.scale
  // as they are (re-quantized per channel for post-scale), float weights
  // quantized at load. Unset: float everywhere (INT8 tensors dequantized).
  std::optional<nn::Int8LinearVariant> int8_variant;
};

struct WanCheckpoint {
  WanConfig config;
  ModelDetection detection;
  std::vector<std::string> paths;
  std::map<std::string, Tensor> tensors;  // original Wan names (wan_keys.h) -> tensors on the device
  bool int8_dequantized = false;          // INT8 block linears were dequantized to the run dtype
  // With WanLoadOptions::int8_variant: block linear base name ("blocks.0.ffn.0")
  // -> its INT8 weight on the device (its bias stays in `tensors`).
  std::map<std::string, ops::Int8LinearWeight> int8_weights;
  std::optional<nn::Int8LinearVariant> int8_variant;
  size_t int8_from_checkpoint = 0;        // INT8 weights taken from *.int8_weight/*.scale
  size_t int8_quantized_at_load = 0;      // float weights quantized at load
  bool has_proj_l = false;                // SLA proj_l tensors present (and loaded)
  size_t device_bytes = 0;                // bytes of the loaded tensors
};

// paths: one or more checkpoint files or folders (io::read_tensor_file
// each); their tensors are merged, a name in two files being an error.
WanCheckpoint load_wan_checkpoint(const std::vector<std::string>& paths, const WanLoadOptions& options);

// The check alone, on tensors already read (names as in the files): throws
// td::Error(Format) listing every problem, else returns the original name ->
// source tensor map the loader converts. Used by load_wan_checkpoint and the tests.
struct WanSourceTensor {
  std::string source_name;
  Tensor tensor;               // host, as read
  Tensor int8_scale;           // for INT8 block linears: the fp32 [ceil(N/128), ceil(K/128)] scales
};
std::map<std::string, WanSourceTensor> match_wan_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                         const ModelDetection& detection, const WanConfig& config,
                                                         const std::string& what);

}  // namespace td::models::wan
