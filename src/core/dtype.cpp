#include "core/dtype.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace td {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: return 2;
    case DType::F8E4M3: case DType::F8E5M2: case DType::I8: case DType::U8: case DType::Bool: return 1;
  }
  fail(ErrorKind::Internal, "dtype_size: unknown dtype ", int(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F64: return "f64";
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F8E4M3: return "f8e4m3";
    case DType::F8E5M2: return "f8e5m2";
    case DType::I64: return "i64";
    case DType::I32: return "i32";
    case DType::I16: return "i16";
    case DType::I8: return "i8";
    case DType::U8: return "u8";
    case DType::Bool: return "bool";
  }
  return "?";
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F8E4M3: return "F8_E4M3";
    case DType::F8E5M2: return "F8_E5M2";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::Bool: return "BOOL";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors_name(std::string_view s) {
  for (DType t : kAllDTypes)
    if (s == dtype_safetensors_name(t)) return t;
  return std::nullopt;
}

std::optional<DType> dtype_from_name(std::string_view s) {
  for (DType t : kAllDTypes)
    if (s == dtype_name(t)) return t;
  if (s == "float32" || s == "float" || s == "fp32") return DType::F32;
  if (s == "float16" || s == "half" || s == "fp16") return DType::F16;
  if (s == "bfloat16" || s == "bf16") return DType::BF16;
  if (s == "float64" || s == "double" || s == "fp64") return DType::F64;
  if (s == "float8_e4m3fn" || s == "fp8") return DType::F8E4M3;
  if (s == "int8") return DType::I8;
  if (s == "int32") return DType::I32;
  if (s == "int64") return DType::I64;
  if (s == "uint8") return DType::U8;
  return std::nullopt;
}

bool dtype_is_floating(DType t) {
  switch (t) {
    case DType::F64: case DType::F32: case DType::F16: case DType::BF16:
    case DType::F8E4M3: case DType::F8E5M2: return true;
    default: return false;
  }
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return f32_from_bits(sign);
    // subnormal: value = man * 2^-24
    float v = float(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (man << 13));
  return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65536: inf
  if (a < 0x38800000u) {
    // result is subnormal or zero: scale into integer units of 2^-24 and round to nearest even
    float v = f32_from_bits(a) * 16777216.0f;  // exact (power of two)
    float r = std::nearbyint(v);               // default rounding mode: nearest even
    return uint16_t(sign | uint16_t(r));
  }
  uint32_t mant = a & 0x7fffffu;
  uint32_t exp = (a >> 23) - 112;
  uint32_t half = (exp << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half += 1;  // may carry into exponent: correct
  return uint16_t(sign | half);
}

float f8e4m3_to_f32(uint8_t v) {
  const bool neg = v & 0x80;
  const int exp = (v >> 3) & 0xf;
  const int man = v & 0x7;
  float r;
  if (exp == 0xf && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) r = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
  else r = std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
  return neg ? -r : r;
}

// Generic round-to-nearest-even encoder for small float formats with
// `ebits` exponent bits, `mbits` mantissa bits and the given bias and max finite value.
static uint8_t encode_small_float(float f, int mbits, int bias, float max_finite, uint8_t nan_code,
                                  bool saturate, bool has_inf, uint8_t inf_code) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return uint8_t(sign | nan_code);
  float a = std::fabs(f);
  if (a > max_finite) {
    // values that round down to max_finite still map to it
    const int e = std::ilogb(max_finite);
    const float half_ulp = std::ldexp(1.0f, e - mbits - 1);
    if (a < max_finite + half_ulp || saturate) {
      a = max_finite;
    } else {
      return uint8_t(sign | (has_inf ? inf_code : nan_code));
    }
  }
  const int min_normal_exp = 1 - bias;
  int e = a == 0 ? min_normal_exp : std::max(std::ilogb(a), min_normal_exp);
  // quantum at this exponent
  const float q = std::ldexp(1.0f, e - mbits);
  float units = std::nearbyint(a / q);  // a/q exact in float for these ranges
  if (units >= float(2 << mbits)) {     // rounding carried into the next binade
    e += 1;
    units = float(1 << mbits);
  }
  uint32_t code;
  if (units < float(1 << mbits)) {
    code = uint32_t(units);  // subnormal (exponent field 0)
  } else {
    code = (uint32_t(e + bias) << mbits) | (uint32_t(units) - (1u << mbits));
  }
  return uint8_t(sign | code);
}

uint8_t f32_to_f8e4m3(float f, bool saturate) {
  return encode_small_float(f, 3, 7, 448.0f, 0x7f, saturate, false, 0);
}

float f8e5m2_to_f32(uint8_t v) {
  return f16_to_f32(uint16_t(uint16_t(v) << 8));
}

uint8_t f32_to_f8e5m2(float f) {
  return encode_small_float(f, 2, 15, 57344.0f, 0x7f, false, true, 0x7c);
}

double load_as_f64(const void* data, DType t, size_t i) {
  const auto* b = static_cast<const uint8_t*>(data);
  switch (t) {
    case DType::F64: { double v; std::memcpy(&v, b + 8 * i, 8); return v; }
    case DType::F32: { float v; std::memcpy(&v, b + 4 * i, 4); return v; }
    case DType::F16: { uint16_t v; std::memcpy(&v, b + 2 * i, 2); return f16_to_f32(v); }
    case DType::BF16: { uint16_t v; std::memcpy(&v, b + 2 * i, 2); return bf16_to_f32(v); }
    case DType::F8E4M3: return f8e4m3_to_f32(b[i]);
    case DType::F8E5M2: return f8e5m2_to_f32(b[i]);
    case DType::I64: { int64_t v; std::memcpy(&v, b + 8 * i, 8); return double(v); }
    case DType::I32: { int32_t v; std::memcpy(&v, b + 4 * i, 4); return v; }
    case DType::I16: { int16_t v; std::memcpy(&v, b + 2 * i, 2); return v; }
    case DType::I8: return int8_t(b[i]);
    case DType::U8: return b[i];
    case DType::Bool: return b[i] ? 1.0 : 0.0;
  }
  fail(ErrorKind::Internal, "load_as_f64: unknown dtype");
}

template <typename I>
static I saturate_int(double v) {
  if (std::isnan(v)) return 0;
  v = std::nearbyint(v);
  if (v < double(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (v > double(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return I(v);
}

void store_from_f64(void* data, DType t, size_t i, double v) {
  auto* b = static_cast<uint8_t*>(data);
  switch (t) {
    case DType::F64: std::memcpy(b + 8 * i, &v, 8); return;
    case DType::F32: { float f = float(v); std::memcpy(b + 4 * i, &f, 4); return; }
    case DType::F16: { uint16_t h = f32_to_f16(float(v)); std::memcpy(b + 2 * i, &h, 2); return; }
    case DType::BF16: { uint16_t h = f32_to_bf16(float(v)); std::memcpy(b + 2 * i, &h, 2); return; }
    case DType::F8E4M3: b[i] = f32_to_f8e4m3(float(v), true); return;
    case DType::F8E5M2: b[i] = f32_to_f8e5m2(float(v)); return;
    case DType::I64: { int64_t x = saturate_int<int64_t>(v); std::memcpy(b + 8 * i, &x, 8); return; }
    case DType::I32: { int32_t x = saturate_int<int32_t>(v); std::memcpy(b + 4 * i, &x, 4); return; }
    case DType::I16: { int16_t x = saturate_int<int16_t>(v); std::memcpy(b + 2 * i, &x, 2); return; }
    case DType::I8: b[i] = uint8_t(saturate_int<int8_t>(v)); return;
    case DType::U8: b[i] = saturate_int<uint8_t>(v); return;
    case DType::Bool: b[i] = v != 0.0; return;
  }
  fail(ErrorKind::Internal, "store_from_f64: unknown dtype");
}

void convert_elements(const void* src, DType src_t, void* dst, DType dst_t, size_t n) {
  if (src_t == dst_t) {
    std::memcpy(dst, src, n * dtype_size(src_t));
    return;
  }
  if (src_t == DType::BF16 && dst_t == DType::F32) {  // the common load path
    const auto* s = static_cast<const uint16_t*>(src);
    auto* d = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
    return;
  }
  if (src_t == DType::F32 && dst_t == DType::BF16) {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i) store_from_f64(dst, dst_t, i, load_as_f64(src, src_t, i));
}

}  // namespace td
