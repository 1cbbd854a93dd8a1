// CUDA standalone 3-D RoPE (contract in rope_apply.h; reference in
// rope_apply_cpu.cpp). One thread per (row, head, pair): simple on purpose,
// it is the unfused baseline `--default-norm` measures against the fused
// qk_norm_rope kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/rope/rope_apply.h"

namespace td::kernels {
namespace {

struct Geo {
  int64_t L, plane, width, height, rows, ld_in, dim;
  int heads, half;  // half = head_dim / 2 pairs
  int pairs_t, pairs_h;
  RopeTableLayout tl;
};

__device__ __forceinline__ float load(const void* p, ElemType t, int64_t i) {
  if (t == ElemType::F32) return static_cast<const float*>(p)[i];
  if (t == ElemType::BF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}
__device__ __forceinline__ void store(void* p, ElemType t, int64_t i, float v) {
  if (t == ElemType::F32) static_cast<float*>(p)[i] = v;
  else if (t == ElemType::BF16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else static_cast<__half*>(p)[i] = __float2half_rn(v);
}

__global__ void rope_apply_kernel(const Geo g, const void* __restrict__ in, ElemType in_t, void* __restrict__ out,
                                  ElemType out_t, const float* __restrict__ tables) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = g.rows * g.heads * g.half;
  if (i >= total) return;
  const int p = int(i % g.half);
  const int h = int((i / g.half) % g.heads);
  const int64_t r = i / (int64_t(g.half) * g.heads);
  const int64_t l = r % g.L;
  int axis_pair;
  int64_t pos;
  const float *ct, *st;
  int pairs;
  if (p < g.pairs_t) {
    axis_pair = p, pos = l / g.plane, ct = tables + g.tl.cos_t, st = tables + g.tl.sin_t, pairs = g.pairs_t;
  } else if (p < g.pairs_t + g.pairs_h) {
    axis_pair = p - g.pairs_t, pos = (l / g.width) % g.height, ct = tables + g.tl.cos_h, st = tables + g.tl.sin_h,
    pairs = g.pairs_h;
  } else {
    axis_pair = p - g.pairs_t - g.pairs_h, pos = l % g.width, ct = tables + g.tl.cos_w, st = tables + g.tl.sin_w,
    pairs = g.tl.pairs_w;
  }
  const float c = ct[pos * pairs + axis_pair], s = st[pos * pairs + axis_pair];
  const int64_t src = r * g.ld_in + int64_t(h) * 2 * g.half + 2 * p;
  const int64_t dst = r * g.dim + int64_t(h) * 2 * g.half + 2 * p;
  const float re = load(in, in_t, src), im = load(in, in_t, src + 1);
  store(out, out_t, dst, __fsub_rn(__fmul_rn(re, c), __fmul_rn(im, s)));
  store(out, out_t, dst + 1, __fadd_rn(__fmul_rn(re, s), __fmul_rn(im, c)));
}

}  // namespace

Status rope_apply_cuda(const RopeApplyArgs& a, void* stream) {
  if (Status s = rope_apply_check(a); s != Status::Ok) return s;
  if (a.batch == 0) return Status::Ok;
  Geo g;
  g.L = a.frames * a.height * a.width;
  g.plane = a.height * a.width;
  g.width = a.width;
  g.height = a.height;
  g.rows = a.batch * g.L;
  g.ld_in = a.ld_in;
  g.dim = int64_t(a.heads) * a.head_dim;
  g.heads = a.heads;
  g.half = a.head_dim / 2;
  g.tl = rope_table_layout(a.head_dim, a.frames, a.height, a.width);
  g.pairs_t = g.tl.pairs_t;
  g.pairs_h = g.tl.pairs_h;
  const int64_t total = g.rows * g.heads * g.half;
  const int threads = 256;
  const int64_t blocks = (total + threads - 1) / threads;
  if (blocks > 0x7fffffffLL) return Status::Unsupported;
  rope_apply_kernel<<<unsigned(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(g, a.in, a.in_type, a.out,
                                                                                           a.out_type, a.tables);
  return cudaGetLastError() == cudaSuccess ? Status::Ok : Status::LaunchFailed;
}

}  // namespace td::kernels
