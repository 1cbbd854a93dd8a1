// The INT8 quantization formulas shared by every quantizer in this folder (CPU
// references, CUDA kernels and tests), written once so that the host and the
// device agree bit for bit. Host-only helpers here; the device twins are in
// quant_device.cuh. C++17 (included from .cu files).
//
// Two symmetric formats:
//
// 1. TurboDiffusion's 128x128 block format (weights and activations of its
//    W8A8 linears; checkpoints' `*.int8_weight` + `*.scale`). Read from
//    thu-ml/TurboDiffusion @ aaecff5, turbodiffusion/ops/quant/quant.hpp
//    (class Quantization, _reduce_amax, _quantization), common/load.hpp,
//    common/store.hpp, and ops/core.py (int8_quant, Int8Linear.from_linear,
//    which quantizes weights with the same quant_cuda):
//      amax  = max(1e-8, max |x| over the block)   (reduction starts at 1e-8;
//                                                   elements outside the
//                                                   matrix load as 0)
//      q     = cvt.rni.sat.s8.f32(x * (128 / amax)) (CUTLASS NumericConverter
//                                                   <int8_t, float,
//                                                   round_to_nearest>: round
//                                                   half to even, saturate to
//                                                   [-128, 127])
//      scale = amax / 128                           (stored fp32; x ~ q * scale)
//    So an all-zero block stores scale 1e-8/128 = 7.8125e-11 and codes 0 (no
//    NaN, no division by zero), and a block's positive maximum saturates to
//    127 (error = scale) while its negative maximum maps to -128 exactly.
//    TurboDiffusion builds with --use_fast_math (setup.py), under which nvcc
//    compiles both 128.f/amax and amax/128.f to div.approx.ftz.f32 (checked on
//    that source pattern with nvcc 13): the multiplier is within 2 ulp of the
//    IEEE quotient. We use the correctly rounded quotient on host and device
//    (bit-reproducible, testable on the CPU). Codes can then differ from
//    TurboDiffusion's by +-1 only where x*128/amax lies within ~2 ulp of a
//    rounding boundary (exact ties included, which 16-bit inputs hit for
//    ~1e-4 of the codes); the scales (amax/128, a power-of-two divisor) agree
//    to within an ulp, normally exactly. Either side's checkpoints load in
//    the other.
//
// 2. Symmetric amax/127 groups (per-token 1x128 groups and per-row/per-channel):
//      amax  = max |x| over the group
//      scale = amax / 127, q = round_half_even(x * (127 / amax)) in [-127, 127]
//    127 rather than TurboDiffusion's 128 because the range is then symmetric:
//    the group maximum is represented exactly and no value saturates, so the
//    rounding error is at most scale/2 everywhere (with /128 the positive
//    maximum is clipped by a full step). A group whose amax is below 2^-100
//    (all zeros, or denormal noise) stores scale 0 and codes 0: dequantization
//    gives exact zeros, and 127/amax never overflows to inf (which would turn
//    0*inf into NaN).
//
// Non-finite inputs are not supported by either format.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace td::kernels {

// Both formats group 128 consecutive elements along K (and 128 rows for blocks).
inline constexpr int kQuantGroup = 128;

inline constexpr float kBlockAmaxFloor = 1e-8f;   // TurboDiffusion's initial amax
inline constexpr float kBlockQuantRange = 128.f;  // TurboDiffusion's "int8_max"
inline constexpr float kSymQuantRange = 127.f;
inline constexpr float kSymAmaxMin = 0x1p-100f;   // below: a zero group

inline int64_t quant_groups(int64_t n) { return (n + kQuantGroup - 1) / kQuantGroup; }

struct QuantParams {
  float scale = 0.f;  // stored: x ~ q * scale
  float inv = 0.f;    // multiplier applied before rounding
};

// TurboDiffusion's block parameters for a block whose max |x| is amax.
inline QuantParams block128_params(float amax) {
  const float a = std::max(amax, kBlockAmaxFloor);
  return {a / kBlockQuantRange, kBlockQuantRange / a};  // a/128 is exact (power of two)
}

// Symmetric amax/127 parameters (per-token groups, per-row / per-channel).
inline QuantParams symmetric_params(float amax) {
  if (!(amax >= kSymAmaxMin)) return {0.f, 0.f};
  return {amax / kSymQuantRange, kSymQuantRange / amax};
}

// Round half to even and saturate to [-128, 127], NaN -> 0: what the device's
// cvt.rni.sat.s8.f32 does. Assumes the default rounding mode (nearest).
inline int8_t quantize_rn_sat(float v) {
  if (std::isnan(v)) return 0;
  const float r = std::nearbyint(v);
  return static_cast<int8_t>(std::min(127.f, std::max(-128.f, r)));
}

}  // namespace td::kernels
