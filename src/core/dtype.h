// Element types and scalar conversions used on the host (CPU kernels, readers,
// tests). Conversions round to nearest even, as the GPU's cvt instructions do.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace td {

enum class DType : uint8_t {
  F64,
  F32,
  F16,
  BF16,
  F8E4M3,  // e4m3 "fn": no infinities, max 448, NaN = 0x7f / 0xff
  F8E5M2,
  I64,
  I32,
  I16,
  I8,
  U8,
  Bool,
};

inline constexpr DType kAllDTypes[] = {DType::F64, DType::F32,   DType::F16, DType::BF16,
                                       DType::F8E4M3, DType::F8E5M2, DType::I64, DType::I32,
                                       DType::I16, DType::I8,    DType::U8,  DType::Bool};

size_t dtype_size(DType t);
// Short name used in messages and `turbodiff info`: "f32", "bf16", "f8e4m3", "i8", ...
const char* dtype_name(DType t);
// The safetensors header spelling: "F32", "BF16", "F8_E4M3", "I8", ...
const char* dtype_safetensors_name(DType t);
std::optional<DType> dtype_from_safetensors_name(std::string_view s);
// Accepts dtype_name() spellings and common aliases (float32, bfloat16, half, int8).
std::optional<DType> dtype_from_name(std::string_view s);
bool dtype_is_floating(DType t);

// ---- scalar conversions ----------------------------------------------------

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                         // round to nearest even
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float f8e4m3_to_f32(uint8_t v);
// saturate=true clamps |f| > 448 to ±448 (what the quantizing kernels do);
// saturate=false maps overflow to NaN (PyTorch's cast semantics).
uint8_t f32_to_f8e4m3(float f, bool saturate = true);
float f8e5m2_to_f32(uint8_t v);
uint8_t f32_to_f8e5m2(float f);

// Reads element i of a buffer of type t as double (used by readers, info, tests).
double load_as_f64(const void* data, DType t, size_t i);
// Writes v (converted, rounded to nearest even) as element i of a buffer of type t.
void store_from_f64(void* data, DType t, size_t i, double v);

// Converts n elements between types through f64 (host only, not a hot path).
void convert_elements(const void* src, DType src_t, void* dst, DType dst_t, size_t n);

}  // namespace td
