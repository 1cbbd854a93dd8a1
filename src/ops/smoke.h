// Smoke tests `doctor` runs for each kernel family: tiny deterministic inputs,
// the CUDA op against the CPU reference, relative L2 against a bar.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/registry.h"

namespace td::ops::smoke {

using Results = std::vector<std::pair<std::string, SmokeResult>>;

// Deterministic N(0, 1) host tensor (a fixed LCG: doctor's runs are reproducible).
Tensor host_randn(const Shape& shape, DType dtype, uint64_t seed, float stddev = 1.f, float mean = 0.f);
// Compares a device (or host) result with the host reference; ok when rel L2 <= bar and all finite.
SmokeResult compare(const Tensor& got, const Tensor& ref, double max_rel_l2);
// Runs fn, turning a td::Error into a failed result.
template <typename F>
SmokeResult guarded(F&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return {false, e.what()};
  }
}

Results norm_family(int device);
Results elementwise_family(int device);
Results quant_family(int device);
Results rope_family(int device);
Results layout_family(int device);  // patchify / unpatchify, Philox random fills
Results attention_family(int device);
Results sla_family(int device);      // `sla`: selection, BF16 sparse kernel, linear branch + proj_l
Results sagesla_family(int device);  // `sagesla`: the same around the SageAttention-style kernel
Results sage_family(int device);
Results t5_attention_family(int device);

}  // namespace td::ops::smoke
