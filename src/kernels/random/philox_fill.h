// Deterministic random fills from Philox4x32-10 (the generator of
// sampling/noise.h): the random-weight models of `turbodiff bench e2e` are
// built with them directly on the device, at real size, without a checkpoint.
//
// Value i of (seed, stream) uses word i % 4 of
//   philox4x32_10(counter = {b lo32, b hi32, stream lo32, stream hi32},
//                 key = {seed lo32, seed hi32}),  b = i / 4:
//   uniform  lo + (hi - lo) * u, u = ((c >> 8) + 0.5) / 2^24 (exact in fp32,
//            one fused multiply-add on both sides, so CPU and CUDA agree bit
//            for bit), rounded once to out_type (F32/F16/BF16)
//   int8     (c % 255) - 127: uniform on [-127, 127], the range of symmetric
//            INT8 weight codes
#pragma once

#include <cstdint>

#include "kernels/status.h"

#if defined(__CUDACC__)
#define TD_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TD_HOST_DEVICE inline
#endif

namespace td::kernels {

struct Philox4 {
  uint32_t v[4];
};

TD_HOST_DEVICE Philox4 philox4x32_10_hd(uint64_t block, uint64_t stream, uint64_t seed) {
  uint32_t c0 = uint32_t(block), c1 = uint32_t(block >> 32), c2 = uint32_t(stream), c3 = uint32_t(stream >> 32);
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return Philox4{{c0, c1, c2, c3}};
}

TD_HOST_DEVICE float philox_unit24(uint32_t c) { return (float(c >> 8) + 0.5f) * 5.9604644775390625e-08f; }

struct RandomFill {
  uint64_t seed = 0, stream = 0;
  int64_t n = 0;
  ElemType out_type = ElemType::F32;  // F32 / F16 / BF16 (uniform) or I8 (int8 codes)
  float lo = -1.f, hi = 1.f;          // uniform range (ignored for I8)
  void* out = nullptr;
};

Status random_fill_cpu(const RandomFill& f);
#if TURBODIFF_HAVE_CUDA
Status random_fill_cuda(const RandomFill& f, void* stream);
#endif

}  // namespace td::kernels
