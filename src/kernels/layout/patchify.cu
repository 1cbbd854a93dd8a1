// CUDA patchify / unpatchify (contract in patchify.h; reference in patchify_cpu.cpp).
// One thread per output element, output index -> source index arithmetic as in
// the reference. At Wan-1.3B 480p the latent is 16x21x60x104 f32 (8.4 MB):
// a few microseconds either way, against the host round trip it replaces.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/layout/patchify.h"

namespace td::kernels {
namespace {

struct Dims {
  int64_t C, T, H, W, pt, ph, pw, Hp, Wp, L, F, total;
};

Dims dims_of(const PatchGeometry& g) {
  Dims d;
  d.C = g.channels;
  d.T = g.frames;
  d.H = g.height;
  d.W = g.width;
  d.pt = g.pt;
  d.ph = g.ph;
  d.pw = g.pw;
  d.Hp = g.height / g.ph;
  d.Wp = g.width / g.pw;
  d.L = (g.frames / g.pt) * d.Hp * d.Wp;
  d.F = g.channels * g.pt * g.ph * g.pw;
  d.total = g.batch * d.L * d.F;
  return d;
}

template <typename OutT>
__device__ __forceinline__ void store(OutT* p, float v);
template <>
__device__ __forceinline__ void store<float>(float* p, float v) { *p = v; }
template <>
__device__ __forceinline__ void store<__nv_bfloat16>(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename OutT>
__global__ void patchify_kernel(const Dims d, const float* __restrict__ latent, OutT* __restrict__ tokens) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= d.total) return;
  const int64_t r = i / d.F, feat = i % d.F;
  const int64_t b = r / d.L, l = r % d.L;
  const int64_t f = l / (d.Hp * d.Wp), h = (l / d.Wp) % d.Hp, w = l % d.Wp;
  // feat in (c, kt, kh, kw) order
  const int64_t kw = feat % d.pw, kh = (feat / d.pw) % d.ph, kt = (feat / (d.pw * d.ph)) % d.pt,
                c = feat / (d.pw * d.ph * d.pt);
  const float v = latent[(((b * d.C + c) * d.T + f * d.pt + kt) * d.H + h * d.ph + kh) * d.W + w * d.pw + kw];
  store(tokens + i, v);
}

__global__ void unpatchify_kernel(const Dims d, const float* __restrict__ tokens, float* __restrict__ latent) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // latent index
  if (i >= d.total) return;
  const int64_t x = i % d.W, y = (i / d.W) % d.H, t = (i / (d.W * d.H)) % d.T, c = (i / (d.W * d.H * d.T)) % d.C,
                b = i / (d.W * d.H * d.T * d.C);
  const int64_t f = t / d.pt, kt = t % d.pt, h = y / d.ph, kh = y % d.ph, w = x / d.pw, kw = x % d.pw;
  const int64_t l = (f * d.Hp + h) * d.Wp + w;
  // feature in (kt, kh, kw, c) order
  const int64_t feat = ((kt * d.ph + kh) * d.pw + kw) * d.C + c;
  latent[i] = tokens[(b * d.L + l) * d.F + feat];
}

Status launched() { return cudaGetLastError() == cudaSuccess ? Status::Ok : Status::LaunchFailed; }

}  // namespace

Status patchify_cuda(const PatchGeometry& g, const float* latent, ElemType out_type, void* tokens, void* stream) {
  if (Status s = patchify_check(g, out_type); s != Status::Ok) return s;
  if (!latent || !tokens) return Status::InvalidArgument;
  const Dims d = dims_of(g);
  const int threads = 256;
  const int64_t blocks = (d.total + threads - 1) / threads;
  if (blocks > 0x7fffffffLL) return Status::Unsupported;
  auto st = static_cast<cudaStream_t>(stream);
  if (out_type == ElemType::F32)
    patchify_kernel<float><<<unsigned(blocks), threads, 0, st>>>(d, latent, static_cast<float*>(tokens));
  else
    patchify_kernel<__nv_bfloat16><<<unsigned(blocks), threads, 0, st>>>(d, latent,
                                                                         static_cast<__nv_bfloat16*>(tokens));
  return launched();
}

Status unpatchify_cuda(const PatchGeometry& g, const float* tokens, float* latent, void* stream) {
  if (Status s = patchify_check(g, ElemType::F32); s != Status::Ok) return s;
  if (!latent || !tokens) return Status::InvalidArgument;
  const Dims d = dims_of(g);
  const int threads = 256;
  const int64_t blocks = (d.total + threads - 1) / threads;
  if (blocks > 0x7fffffffLL) return Status::Unsupported;
  unpatchify_kernel<<<unsigned(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(d, tokens, latent);
  return launched();
}

}  // namespace td::kernels
