// CUDA residual_gate_norm (contract in residual_gate_norm.h; fp32 reference in
// residual_gate_norm_cpu.cpp).
//
// Design (shared row engine, norm_rows.cuh, residual mode): each thread issues
// all its 16-byte loads of x and y for the row first, then forms
// x_new = x + gate[b] * y in fp32 (product and sum rounded separately, as
// eager PyTorch does), rounds it to the residual type, stores it to x_out at
// once (same thread, same addresses: x_out == x is safe) and keeps the rounded
// value in registers for the LayerNorm (two-pass statistics on registers), the
// optional affine and the optional modulation, then stores out. x and y are
// read once, x_out and out written once: the minimum traffic of the pair of
// ops it replaces (PyTorch: add/mul kernels + upcast + layer_norm + modulate,
// each a full pass).
//
// Bytes moved, bf16 y and out:
//   bf16 residual: read x, y + write x_out, out = 8 bytes per element
//   fp32 residual (Wan's original stream): 4 + 2 + 4 + 2 = 12 bytes per element
// Predicted at 4.0 TB/s:
//   32760 x 1536, bf16 residual: 402.6 MB -> 100.6 us;   fp32 residual: 603.8 MB -> 151.0 us
//   75600 x 5120, bf16 residual: 3096.6 MB -> 774.1 us;  fp32 residual: 4644.9 MB -> 1161.2 us
// Measured (H200, bench_norm, one run): 111 us (91%), 165 us (92%); 750 us (97%), 1157 us (95%).
// Row plan: from 1024 columns at most 4 chunks per thread (session 9; 6
// until then, and still below 1024, where it was not measured). At 1536
// columns that is 2 warps per row (48 of 64 threads hold chunks) instead of
// 1 warp x 6 chunks: ~76 instead of 97 registers for the fp32 residual, so 3
// CTAs of 256 threads per SM instead of 2. H200, 2026-11-30, bench_norm,
// fraction of a same-traffic copy at 32760x1536 (two runs each): fp32
// residual 94.2-95.1% (154-155 us) against 88.6-89.0% (167-170 us), bf16
// 94.2-95.1% against 88.7-89.7%; 5120 columns plan 4 chunks either way
// (94.1-94.5% / 97.5-98.1%). Also tried: 6 chunks with 64, 96 or 128-thread
// CTAs, 87.7-90.3% for the fp32 residual.
#include <cstdio>
#include <cstdlib>

#include "kernels/norm/norm_host.h"
#include "kernels/norm/norm_rows.cuh"
#include "kernels/norm/residual_gate_norm.h"

namespace td::kernels {

Status residual_gate_norm_cuda(const ResidualGateNormParams& p, void* stream) {
  if (Status s = residual_gate_norm_check(p); s != Status::Ok) return s;
  if (p.rows == 0) return Status::Ok;
  using namespace gpu;
  const bool vectorized = p.dim % 8 == 0 && p.x_stride % 8 == 0 && p.x_out_stride % 8 == 0 &&
                          p.y_stride % 8 == 0 && (!p.out || p.out_stride % 8 == 0) && p.mod_stride % 4 == 0 &&
                          (!p.codes || (p.codes_stride % 8 == 0 && reinterpret_cast<uintptr_t>(p.codes) % 8 == 0)) &&
                          aligned16(p.x) && aligned16(p.x_out) && aligned16(p.y) && aligned16(p.out) &&
                          aligned16(p.gate) && aligned16(p.weight) && aligned16(p.bias) && aligned16(p.scale) &&
                          aligned16(p.shift);
  // TURBODIFF_RGN_PLAN=max_vpt,block_threads (A/B knob, read per call;
  // "6,256" is the plan before session 9).
  int max_vpt = p.dim >= 1024 ? 4 : 6, block_threads = 256;
  if (const char* e = std::getenv("TURBODIFF_RGN_PLAN")) {
    int v = 0, b = 0;
    if (std::sscanf(e, "%d,%d", &v, &b) == 2 && v >= 4 && b >= 32 && b <= 1024) max_vpt = v, block_threads = b;
  }
  RowPlan plan;
  if (!plan_rows(p.dim, vectorized, &plan, max_vpt, block_threads)) return Status::Unsupported;
  NormRowsArgs a;
  a.x = p.x;
  a.x_stride = p.x_stride;
  a.y = p.y;
  a.y_stride = p.y_stride;
  a.x_out = p.x_out;
  a.x_out_stride = p.x_out_stride;
  a.out = p.out;
  a.out_stride = p.out_stride;
  a.gate = p.gate;
  a.weight = p.weight;
  a.bias = p.bias;
  a.scale = p.scale;
  a.shift = p.shift;
  a.mod_stride = p.mod_stride;
  a.rows_per_batch = p.rows_per_batch;
  a.rows = p.rows;
  a.dim = int(p.dim);
  a.eps = p.eps;
  a.codes = p.codes;
  a.codes_stride = p.codes_stride;
  a.code_scales = p.code_scales;
  a.ld_scales = p.ld_scales;
  const auto cs = static_cast<cudaStream_t>(stream);
  if (p.codes) {
    // The token128 output (Wan's W8A8 blocks: 16-bit y and out; the
    // launcher says Unsupported for widths it cannot group).
    if (!vectorized || p.dim % 128 != 0 || p.y_type != ElemType::BF16 || p.out_type != ElemType::BF16)
      return Status::Unsupported;
    using BF = __nv_bfloat16;
    if (p.residual_type == ElemType::F32) return launch_norm_rows<NormKind::Layer, true, float, BF, BF, true>(a, plan, cs);
    return launch_norm_rows<NormKind::Layer, true, BF, BF, BF, true>(a, plan, cs);
  }
  // The residual is F32 or BF16 (checked); y and out any activation type.
  auto with_residual = [&](auto rt) -> Status {
    using RT = typename decltype(rt)::type;
    return act_type_dispatch(p.y_type, [&](auto yt) {
      using YT = typename decltype(yt)::type;
      return act_type_dispatch(p.out_type, [&](auto ot) {
        using OT = typename decltype(ot)::type;
        return launch_norm_rows<NormKind::Layer, true, RT, YT, OT>(a, plan, cs);
      });
    });
  };
  if (p.residual_type == ElemType::F32) return with_residual(TypeTag<float>{});
  return with_residual(TypeTag<__nv_bfloat16>{});
}

}  // namespace td::kernels
