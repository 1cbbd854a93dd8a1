// Wan DiT tensor names. turbodiff's canonical names are the original Wan ones
// (wan/modules/model.py), which rCM and TurboDiffusion checkpoints also use;
// diffusers names map onto them (scripts/convert_wan_to_diffusers.py, read
// backwards; note diffusers' norm2 is Wan's norm3, the cross-attention
// affine LayerNorm). See shared/reference/wan21-and-rcm.md §1.6.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "models/detect.h"
#include "models/wan/wan_config.h"

namespace td::models::wan {

// A checkpoint name (wrapper prefix already stripped) in `layout` -> the
// original Wan name; nullopt when it follows no Wan DiT naming rule. Suffixes
// (.weight, .bias, TurboDiffusion's .int8_weight / .scale) pass through.
std::optional<std::string> to_original_name(std::string_view name, KeyLayout layout);
// The inverse, for messages in the checkpoint's own naming.
std::string from_original_name(std::string_view original, KeyLayout layout);

// Which dtype a tensor is kept in at run time.
enum class WanParamDType {
  Run,  // the run dtype (f32 on CPU, bf16 on CUDA): matmul weights and their biases
  F32,  // always f32, as the original computes it: time embedding and projection,
        // modulation tables, norm weights, the head, SLA proj_l
};

struct WanTensorSpec {
  std::string name;  // original Wan name
  Shape shape;       // the shape turbodiff keeps it in
  WanParamDType dtype = WanParamDType::Run;
  bool block_linear_weight = false;  // may come as TurboDiffusion INT8 (.int8_weight + .scale)
  bool proj_l = false;               // SLA proj_l: optional, all blocks or none
};

// Every tensor of a Wan DiT of this config, in model order. The patch
// embedding is listed as Linear [dim, in_dim * patch volume] (the loader also
// accepts the Conv3d shape [dim, in_dim, pt, ph, pw], the same memory).
std::vector<WanTensorSpec> wan_tensor_specs(const WanConfig& c, bool with_proj_l);

}  // namespace td::models::wan
