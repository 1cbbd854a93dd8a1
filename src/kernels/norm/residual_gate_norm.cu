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
#include "kernels/norm/norm_host.h"
#include "kernels/norm/norm_rows.cuh"
#include "kernels/norm/residual_gate_norm.h"

namespace td::kernels {

Status residual_gate_norm_cuda(const ResidualGateNormParams& p, void* stream) {
  if (Status s = residual_gate_norm_check(p); s != Status::Ok) return s;
  if (p.rows == 0) return Status::Ok;
  using namespace gpu;
  const bool vectorized = p.dim % 8 == 0 && p.x_stride % 8 == 0 && p.x_out_stride % 8 == 0 &&
                          p.y_stride % 8 == 0 && p.out_stride % 8 == 0 && p.mod_stride % 4 == 0 &&
                          aligned16(p.x) && aligned16(p.x_out) && aligned16(p.y) && aligned16(p.out) &&
                          aligned16(p.gate) && aligned16(p.weight) && aligned16(p.bias) && aligned16(p.scale) &&
                          aligned16(p.shift);
  RowPlan plan;
  if (!plan_rows(p.dim, vectorized, &plan, /*max_vpt=*/6, /*block_threads=*/256)) return Status::Unsupported;
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
  const auto cs = static_cast<cudaStream_t>(stream);
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
