// Wan self-attention's q/k epilogue, fused: RMSNorm over the full model
// dimension, then 3-D RoPE per head, for q and k in one launch.
//
//   in     row r = b * L + l (token l of sample b, L = frames * height * width)
//          at in + r * ld_in, dim = heads * head_dim elements (fp32/fp16/bf16;
//          Wan's q = W_q x + b_q is bf16)
//   y[c]   = in[c] * rsqrt(mean_c(in^2) + eps) * weight[c]   (fp32, weight [dim])
//   out    y with each head's channels rotated (rope_tables.h), rounded once
//          to out_type (bf16 or fp32), in one of two layouts:
//            BLHD: [B, L, heads, head_dim] dense (= the input's row order)
//            BHLD: [B, heads, L, head_dim] dense (what attention kernels read)
//
// Numerics: Wan computes the norm in fp32, casts it to bf16, multiplies by
// the fp32 weight and applies RoPE in fp64; TurboDiffusion's FastRMSNorm keeps
// norm * weight in fp32 and casts once. We keep everything in fp32 (tables
// from fp64) and round once at the output, which is at least as accurate as
// either. Outputs must not overlap the inputs.
//
// CUDA requirements: dim a multiple of 8 and at most 32768, head_dim a
// multiple of 8, ld_in multiples of 8, in/out/weights/tables 16-byte aligned;
// otherwise Status::InvalidArgument. The CPU reference takes any even head_dim.
#pragma once

#include <cstdint>

#include "kernels/rope/rope_tables.h"
#include "kernels/status.h"

namespace td::kernels {

enum class RopeOutLayout { BLHD, BHLD };

Status qk_norm_rope_cpu(ElemType in_type, const void* q_in, int64_t ld_q_in, const void* k_in, int64_t ld_k_in,
                        const float* q_weight, const float* k_weight, int64_t batch, int64_t frames, int64_t height,
                        int64_t width, int heads, int head_dim, float eps, const float* rope_tables,
                        RopeOutLayout layout, ElemType out_type, void* q_out, void* k_out);

// CUDA kernel variants (same contract, same results up to fp32 contraction):
//   GlobalTables  each pack looks its 4 (cos, sin) pairs up in the global
//                 tables (8 scattered __ldg per 8 elements); the default.
//   SharedAngles  a token's head_dim / 2 (cos, sin) pairs are gathered once
//                 per CTA into shared memory and shared by all its heads;
//                 32-bit position decode. (The default since the H200 run of 2026-11-30.)
//   Auto          TURBODIFF_QK_ROPE_KERNEL=shared|global|shared_warps if set, else
//                 SharedAnglesWarpRows where it takes the rows (1536: 90.8-91.1% /
//                 92.8-93.5% of a same-traffic copy in BHLD / BLHD on the H200,
//                 SharedAngles 89.2-89.3% / 91.8-92.0%), SharedAngles elsewhere
//                 (93-98% at 5120; GlobalTables ~52%).
//   SharedAnglesWarpRows  SharedAngles with a warp per row, 4 rows per CTA
//                 (no CTA barrier), for rows of 256..2048 columns in steps of
//                 256; other widths run SharedAngles.
enum class QkRopeKernel { Auto, GlobalTables, SharedAngles, SharedAnglesWarpRows };

#if TURBODIFF_HAVE_CUDA
// One CTA per token row (grid.y selects q or k), the row in registers: one
// read, one write. rope_tables is the device copy of rope_tables_cpu's buffer.
Status qk_norm_rope_cuda(ElemType in_type, const void* q_in, int64_t ld_q_in, const void* k_in, int64_t ld_k_in,
                         const float* q_weight, const float* k_weight, int64_t batch, int64_t frames, int64_t height,
                         int64_t width, int heads, int head_dim, float eps, const float* rope_tables,
                         RopeOutLayout layout, ElemType out_type, void* q_out, void* k_out, void* stream,
                         QkRopeKernel kernel = QkRopeKernel::Auto);
#endif

}  // namespace td::kernels
