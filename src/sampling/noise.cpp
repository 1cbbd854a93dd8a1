#include "sampling/noise.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "core/error.h"

namespace td::sampling {
namespace {

// Philox4x32 round constants (multipliers and Weyl key increments) from the
// Random123 paper.
constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;
constexpr uint32_t kWeyl1 = 0xBB67AE85u;

inline void mul_hi_lo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

inline double unit_open(uint32_t c) { return (double(c) + 0.5) * 0x1p-32; }

// Four normals of block `block` of (seed, stream).
inline std::array<float, 4> normal_block(uint64_t seed, uint64_t stream, uint64_t block) {
  const PhiloxCounter c = philox4x32_10(
      {uint32_t(block), uint32_t(block >> 32), uint32_t(stream), uint32_t(stream >> 32)},
      {uint32_t(seed), uint32_t(seed >> 32)});
  std::array<float, 4> out{};
  for (int pair = 0; pair < 2; ++pair) {
    const double r = std::sqrt(-2.0 * std::log(unit_open(c[2 * pair])));
    const double theta = 2.0 * std::numbers::pi * unit_open(c[2 * pair + 1]);
    out[2 * pair] = float(r * std::cos(theta));
    out[2 * pair + 1] = float(r * std::sin(theta));
  }
  return out;
}

}  // namespace

PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kWeyl0;
      key[1] += kWeyl1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo(kMul0, ctr[0], hi0, lo0);
    mul_hi_lo(kMul1, ctr[2], hi1, lo1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
  }
  return ctr;
}

float normal_at(uint64_t seed, uint64_t stream, uint64_t index) {
  return normal_block(seed, stream, index / 4)[index % 4];
}

void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t first, ThreadPool& pool) {
  TD_CHECK(n >= 0, Internal, "fill_normal: negative count ", n);
  if (n == 0) return;
  TD_CHECK(out != nullptr, Internal, "fill_normal: null output for ", n, " values");
  // Chunks are whole multiples of nothing in particular: every value is a pure
  // function of its absolute index, so any split gives the same numbers.
  pool.parallel_for(n, 4096, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    while (i < end) {
      const uint64_t j = first + uint64_t(i);
      const std::array<float, 4> block = normal_block(seed, stream, j / 4);
      for (uint64_t lane = j % 4; lane < 4 && i < end; ++lane, ++i) out[i] = block[lane];
    }
  });
}

Tensor randn(const Shape& shape, uint64_t seed, uint64_t stream, DType dtype, ThreadPool& pool) {
  TD_CHECK(dtype == DType::F32 || dtype == DType::F64 || dtype == DType::BF16 || dtype == DType::F16, DType,
           "randn: noise of shape ", shape_str(shape), " requested as ", dtype_name(dtype),
           "; expected a float dtype (F32, F64, BF16, F16)");
  Tensor f32 = Tensor::empty(shape, DType::F32);
  fill_normal(f32.data<float>(), f32.numel(), seed, stream, 0, pool);
  return dtype == DType::F32 ? f32 : f32.to(dtype);
}

Tensor randn_per_sample(const Shape& shape, const std::vector<uint64_t>& seeds, uint64_t stream, DType dtype,
                        ThreadPool& pool) {
  TD_CHECK(!shape.empty() && shape[0] == int64_t(seeds.size()), Internal, "randn_per_sample: shape ",
           shape_str(shape), " with ", seeds.size(), " seeds; expected one seed per sample (dim 0)");
  Tensor f32 = Tensor::empty(shape, DType::F32);
  const int64_t per = seeds.empty() ? 0 : f32.numel() / int64_t(seeds.size());
  for (size_t k = 0; k < seeds.size(); ++k)
    fill_normal(f32.data<float>() + int64_t(k) * per, per, seeds[k], stream, 0, pool);
  return dtype == DType::F32 ? f32 : f32.to(dtype);
}

}  // namespace td::sampling
