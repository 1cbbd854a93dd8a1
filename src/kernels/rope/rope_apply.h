// Wan's 3-D RoPE alone (no norm): the unfused path of `--default-norm`, where
// q and k go through a plain RMSNorm first and are rotated by this kernel
// after, as the original Wan code does (rope_apply after WanRMSNorm).
//
//   in     row r = b * L + l at in + r * ld_in, dim = heads * head_dim elements
//          (F32/F16/BF16)
//   out    [B, L, heads, head_dim] dense (BLHD) in out_type (F32/F16/BF16):
//          each head's interleaved pairs rotated by the tables of
//          rope_tables.h, in fp32, rounded once.
// Outputs must not overlap the input. The CUDA kernel takes any even head_dim
// (one thread per pair; no alignment needed).
#pragma once

#include <cstdint>

#include "kernels/rope/rope_tables.h"
#include "kernels/status.h"

namespace td::kernels {

struct RopeApplyArgs {
  ElemType in_type = ElemType::BF16, out_type = ElemType::BF16;
  const void* in = nullptr;
  int64_t ld_in = 0;
  void* out = nullptr;
  int64_t batch = 0, frames = 0, height = 0, width = 0;  // the patch grid
  int heads = 0, head_dim = 0;
  const float* tables = nullptr;  // rope_tables_cpu's buffer for head_dim and the grid (device copy on CUDA)
};

Status rope_apply_check(const RopeApplyArgs& a);
Status rope_apply_cpu(const RopeApplyArgs& a);
#if TURBODIFF_HAVE_CUDA
Status rope_apply_cuda(const RopeApplyArgs& a, void* stream);
#endif

}  // namespace td::kernels
