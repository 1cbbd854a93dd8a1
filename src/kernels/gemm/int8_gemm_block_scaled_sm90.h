// Variants of the sm90 block-scaled W8A8 kernel (kernels/gemm/int8_gemm.h's
// int8_gemm_block_scaled_sm90), kept beside the current one until an H200 run
// shows which is faster; declared here, not in int8_gemm.h, so adding them
// does not rebuild every user of that header.
#pragma once

#include "kernels/gemm/int8_gemm.h"

namespace td::kernels {

#if TURBODIFF_HAVE_SM90 || defined(__CUDACC__)
// Variants of the sm90 block-scaled kernel (same arguments, same results up to
// fp32 summation order; the .cu file's header says how they differ):
//   Baseline     I2F + FFMA promotion after each K block's wgmmas complete
//   FastPromote  exact int32 -> fp32 by the 2^23 magic-number trick (no I2F)
//   Pipelined    FastPromote + two int32 accumulator sets, promotion of K block
//                kt overlapping the wgmmas of kt + 1
//   PipelinedCvt Pipelined with the compiler's int32 -> fp32 conversion
//   PipelinedSmemEpi  Pipelined + the epilogue staged through shared memory
//                (coalesced 16-byte stores and residual loads)
//   PipelinedSmemScales  PipelinedCvt with each K block's scales copied into
//                shared memory by a producer warp beside the stage's TMA
//   ThreeConsumers  tile 192 x 128 on three consumer warpgroups (one int32
//                accumulator set each, compiler conversion), scales staged in
//                shared memory as in PipelinedSmemScales
//   ThreeConsumersFastCvt  ThreeConsumers with FastPromote's conversion
//   ThreeConsumersSmemEpi  ThreeConsumers with PipelinedSmemEpi's epilogue
//                (4 pipeline stages beside the staging buffers)
//   ThreeConsumersOrdered  ThreeConsumers with the warpgroups' wgmma issue
//                forced into turns (0, 1, 2, 0, ...) by shared-memory barriers
// Default = the environment variable TURBODIFF_GEMM_SM90_BLOCK_KERNEL
// (baseline | fast_promote | pipelined | pipelined_cvt | pipelined_smem_epi |
// pipelined_smem_scales | three_consumers | three_consumers_fast |
// three_consumers_smem_epi | three_consumers_ordered, read once per process), else
// ThreeConsumersSmemEpi (measured fastest on the Wan shapes, H200 2026-11-30;
// PipelinedCvt before that run).
// The two-argument overload above runs Default.
enum class BlockScaledSm90Kernel : int { Default = 0, Baseline = 1, FastPromote = 2, Pipelined = 3, PipelinedCvt = 4,
                                        PipelinedSmemEpi = 5, PipelinedSmemScales = 6, ThreeConsumers = 7,
                                        ThreeConsumersFastCvt = 8, ThreeConsumersSmemEpi = 9, ThreeConsumersOrdered = 10 };
Status int8_gemm_block_scaled_sm90(const Int8GemmBlockScaledArgs& args, void* stream, BlockScaledSm90Kernel kernel);
// "baseline", "fast_promote", "pipelined", "pipelined_cvt", "pipelined_smem_epi", "pipelined_smem_scales",
// "three_consumers", "three_consumers_fast", "three_consumers_smem_epi", "three_consumers_ordered"
// (Default: what it resolves to).
const char* block_scaled_sm90_kernel_name(BlockScaledSm90Kernel kernel);
#endif

}  // namespace td::kernels
