// A Wan DiT checkpoint of random weights at any size, built directly on the
// device (ops::random_fill_, Philox: same seed, same weights, on the CPU and on
// CUDA) without reading a file: what `turbodiff bench e2e` times at real size.
//
// Scales follow the layers' default inits, so activations stay in the range a
// trained model has: linear weights and biases U(-1/sqrt(in), 1/sqrt(in))
// (nn.Linear's), modulation tables with std 1/sqrt(dim) (Wan's randn / dim**0.5),
// norm weights U(0.9, 1.1), norm biases U(-0.02, 0.02). With an INT8 variant
// the block linears are random INT8 codes on [-127, 127] with fp32 scales of
// U(0.9, 1.1) / (127 sqrt(in)): the same dequantized range, in the variant's
// format (128x128 blocks or per output channel).
#pragma once

#include <cstdint>
#include <optional>

#include "models/wan/wan_loader.h"

namespace td::models::wan {

struct RandomWanOptions {
  Device device = Device::cpu();
  DType dtype = DType::F32;  // run dtype of the matmul weights (f32 or bf16), as WanLoadOptions::dtype
  std::optional<nn::Int8LinearVariant> int8_variant;  // W8A8 block linears, as WanLoadOptions::int8_variant
  bool with_proj_l = false;  // SLA proj_l in every block (random, not zero: a "trained" SLA checkpoint)
  uint64_t seed = 0;
};

// The checkpoint WanDiT takes, as load_wan_checkpoint would return it for a
// file of these sizes (names, shapes and dtypes from wan_tensor_specs).
WanCheckpoint random_wan_checkpoint(const WanConfig& config, const RandomWanOptions& options);

}  // namespace td::models::wan
