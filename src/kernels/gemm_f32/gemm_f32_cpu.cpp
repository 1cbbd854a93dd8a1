// Blocked, multi-threaded fp32 GEMM for the CPU reference path (see gemm_f32.h).
//
// Per task, one (MC x NC) tile of C is accumulated in an fp32 buffer, K is
// walked in KC slices, and each slice of A and W is packed (widened to fp32,
// zero-padded) into panels of MR rows / NR columns laid out k-major, so the
// 8x8 inner kernel reads both operands sequentially. GCC/Clang vector
// extensions give SIMD without intrinsics: 4-wide on any target (SSE2, NEON),
// 8-wide FMA where the CPU has AVX2 (picked once at start-up).
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/gemm_f32/gemm_f32.h"

namespace td::kernels {
namespace {

constexpr int64_t MR = 8, NR = 8;               // register tile (A panels of 8 rows, W panels of 8 columns)
constexpr int64_t MC = 128, NC = 128, KC = 256;  // cache blocks (multiples of MR / NR)

typedef float v4f __attribute__((vector_size(16)));

bool float_type(ElemType t) { return t == ElemType::F32 || t == ElemType::BF16 || t == ElemType::F16; }

// dst[0..count) = src elements [offset, offset + count) widened to fp32.
void load_f32(const void* base, ElemType t, int64_t offset, int64_t count, float* dst) {
  if (t == ElemType::F32) {
    std::memcpy(dst, static_cast<const float*>(base) + offset, size_t(count) * 4);
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(base) + offset;
  if (t == ElemType::BF16)
    for (int64_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(s[i]);
  else
    for (int64_t i = 0; i < count; ++i) dst[i] = f16_to_f32(s[i]);
}

void store_row(void* base, ElemType t, int64_t offset, int64_t count, const float* src) {
  if (t == ElemType::F32) {
    std::memcpy(static_cast<float*>(base) + offset, src, size_t(count) * 4);
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(base) + offset;
  if (t == ElemType::BF16)
    for (int64_t i = 0; i < count; ++i) d[i] = f32_to_bf16(src[i]);
  else
    for (int64_t i = 0; i < count; ++i) d[i] = f32_to_f16(src[i]);
}

// Packs rows [r0, r0 + rows) x columns [k0, k0 + kc) of a row-major operand into
// panels of `width` rows: panel p holds, for each k, `width` consecutive values
// (row r0 + p*width + i at [p][k][i]); rows past `rows` are zero.
void pack(const void* src, ElemType t, int64_t ld, int64_t r0, int64_t rows, int64_t k0, int64_t kc, int64_t width,
          float* dst, float* row_buf) {
  const int64_t panels = (rows + width - 1) / width;
  std::fill(dst, dst + panels * width * kc, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    load_f32(src, t, (r0 + r) * ld + k0, kc, row_buf);
    float* panel = dst + (r / width) * width * kc;
    const int64_t i = r % width;
    for (int64_t k = 0; k < kc; ++k) panel[k * width + i] = row_buf[k];
  }
}

inline v4f load4(const float* p) {
  v4f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void add_store4(float* p, v4f v) {
  v4f c = load4(p);
  c += v;
  std::memcpy(p, &c, sizeof c);
}

// ct[i][j] += sum_k ap[k][i0 + i] * wp[k][j] for rows i < 4 of the 8-row A panel
// starting at i0 (ct row stride ldct): 8 accumulators of 4 lanes, which fit the
// 16 registers of SSE2 / NEON.
void micro_kernel_4x8(int64_t kc, const float* ap, const float* wp, float* ct, int64_t ldct) {
  v4f c00 = {0, 0, 0, 0}, c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
  for (int64_t k = 0; k < kc; ++k) {
    const v4f w0 = load4(wp + k * NR), w1 = load4(wp + k * NR + 4);
    const float* a = ap + k * MR;
    const float a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
    c00 += a0 * w0;
    c01 += a0 * w1;
    c10 += a1 * w0;
    c11 += a1 * w1;
    c20 += a2 * w0;
    c21 += a2 * w1;
    c30 += a3 * w0;
    c31 += a3 * w1;
  }
  add_store4(ct, c00);
  add_store4(ct + 4, c01);
  add_store4(ct + ldct, c10);
  add_store4(ct + ldct + 4, c11);
  add_store4(ct + 2 * ldct, c20);
  add_store4(ct + 2 * ldct + 4, c21);
  add_store4(ct + 3 * ldct, c30);
  add_store4(ct + 3 * ldct + 4, c31);
}

void micro_kernel_generic(int64_t kc, const float* ap, const float* wp, float* ct, int64_t ldct) {
  micro_kernel_4x8(kc, ap, wp, ct, ldct);
  micro_kernel_4x8(kc, ap + 4, wp, ct + 4 * ldct, ldct);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The 8x8 tile in eight 8-lane FMA accumulators: enough independent chains to
// hide the FMA latency on AVX2 machines (chosen at run time, see below).
typedef float v8f __attribute__((vector_size(32)));

__attribute__((target("avx2,fma"))) void micro_kernel_avx2(int64_t kc, const float* ap, const float* wp, float* ct,
                                                           int64_t ldct) {
  v8f c[8];
  for (auto& v : c) v = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t k = 0; k < kc; ++k) {
    v8f w;
    std::memcpy(&w, wp + k * NR, sizeof w);
    const float* a = ap + k * MR;
    for (int i = 0; i < 8; ++i) c[i] += a[i] * w;
  }
  for (int i = 0; i < 8; ++i) {
    v8f t;
    std::memcpy(&t, ct + i * ldct, sizeof t);
    t += c[i];
    std::memcpy(ct + i * ldct, &t, sizeof t);
  }
}

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
const bool kHaveAvx2 = cpu_has_avx2();
#else
constexpr bool kHaveAvx2 = false;
#endif

using MicroKernel = void (*)(int64_t, const float*, const float*, float*, int64_t);
MicroKernel select_micro_kernel(bool force_portable) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (kHaveAvx2 && !force_portable) return micro_kernel_avx2;
#endif
  (void)force_portable;
  return micro_kernel_generic;
}

}  // namespace

bool gemm_f32_has_avx2() { return kHaveAvx2; }

Status gemm_f32_check(const GemmF32Params& p) {
  if (p.m < 0 || p.n < 0 || p.k < 0) return Status::InvalidArgument;
  if (!float_type(p.a_type) || !float_type(p.w_type) || !float_type(p.c_type) || !float_type(p.bias_type))
    return Status::InvalidArgument;
  if (p.m == 0 || p.n == 0) return Status::Ok;
  if (!p.c || p.ldc < p.n) return Status::InvalidArgument;
  if (p.k > 0 && (!p.a || !p.w || p.lda < p.k || p.ldw < p.k)) return Status::InvalidArgument;
  return Status::Ok;
}

Status gemm_f32_cpu(const GemmF32Params& p) {
  if (Status s = gemm_f32_check(p); s != Status::Ok) return s;
  if (p.m == 0 || p.n == 0) return Status::Ok;
  const int64_t m_blocks = (p.m + MC - 1) / MC, n_blocks = (p.n + NC - 1) / NC;
  const MicroKernel micro_kernel = select_micro_kernel(p.force_portable);
  td::parallel_for(m_blocks * n_blocks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> a_pack(size_t(MC * KC)), w_pack(size_t(NC * KC)), tile(size_t(MC * NC)),
        row(size_t(std::max<int64_t>(KC, NC)));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m0 = (t / n_blocks) * MC, n0 = (t % n_blocks) * NC;
      const int64_t mc = std::min(MC, p.m - m0), nc = std::min(NC, p.n - n0);
      // Start from the bias (or zero), then accumulate every K slice.
      if (p.bias) load_f32(p.bias, p.bias_type, n0, nc, row.data());
      for (int64_t i = 0; i < MC; ++i)
        for (int64_t j = 0; j < NC; ++j) tile[size_t(i * NC + j)] = (p.bias && j < nc) ? row[size_t(j)] : 0.f;
      for (int64_t k0 = 0; k0 < p.k; k0 += KC) {
        const int64_t kc = std::min(KC, p.k - k0);
        pack(p.a, p.a_type, p.lda, m0, mc, k0, kc, MR, a_pack.data(), row.data());
        pack(p.w, p.w_type, p.ldw, n0, nc, k0, kc, NR, w_pack.data(), row.data());
        for (int64_t i = 0; i < mc; i += MR)
          for (int64_t j = 0; j < nc; j += NR)
            micro_kernel(kc, a_pack.data() + i * kc, w_pack.data() + j * kc, tile.data() + i * NC + j, NC);
      }
      for (int64_t i = 0; i < mc; ++i) store_row(p.c, p.c_type, (m0 + i) * p.ldc + n0, nc, tile.data() + i * NC);
    }
  });
  return Status::Ok;
}

}  // namespace td::kernels
