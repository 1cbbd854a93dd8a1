// Fused LayerNorm (no affine) + AdaLN modulation + INT8 quantization in
// TurboDiffusion's 128x128 block format, "stream" kernel (issue 3): the same
// operation, arguments and outputs as layernorm_modulate_quant_block128_cuda
// (layernorm_modulate_quant.h), x read from HBM once, with loads of the next
// 128-row stripe in flight while the current one is normalized and
// quantized. sm_90+ (thread-block clusters, distributed shared memory); the
// design, its prediction and the H200 measurement are at the top of
// layernorm_modulate_quant_block128_stream.cu. Measured 43% / 32% of copy at
// Wan's 32760x1536 / 75600x5120 against the portable path's 42% / 39%: not
// the default (the lead wires the dispatch after measurements).
//
// Same requirements as the other CUDA paths (dim a multiple of 8, at most
// 32768; ld_x, ld_q, ld_mod multiples of 8; x, mod_shift, mod_scale 16-byte
// and q 8-byte aligned): InvalidArgument otherwise. Unsupported (the caller
// falls back to layernorm_modulate_quant_block128_cuda) on a device below
// sm_90, a build without sm_90 code, or a row width whose stripe slabs do not
// fit a cluster's shared memory (16-bit rows up to 12288 columns and fp32
// rows up to 6144 run, where the device schedules the cluster size needed).
#pragma once

#include <cstdint>

#include "kernels/quant/layernorm_modulate_quant.h"

namespace td::kernels {

#if TURBODIFF_HAVE_CUDA
// How a stripe is split over a cluster (chosen on the host; exposed for tests
// and the bench):
//   row_parts x col_parts CTAs per cluster: a CTA owns 128/row_parts rows of
//     each stripe and slab_cols columns (whole 128-column blocks), so its
//     blocks' maxima need only the other row part (DSMEM) and its rows'
//     statistics only the other column parts (DSMEM);
//   rows_per_warp (1 or 2) and slots: a warp covers rows_per_warp rows of a
//     chunk with `slots` 8-element packs per lane;
//   ring_chunks chunks of 16 * rows_per_warp rows of the slab in shared
//     memory, filled by per-thread cp.async; whole stripes, two where shared
//     memory allows (the next stripe loads while this one is processed).
struct LnQuantStreamPlan {
  int row_parts = 0, col_parts = 0, slab_cols = 0, rows_per_warp = 0, slots = 0, ring_chunks = 0;
  int clusters = 0;  // clusters resident at once (the persistent grid)
};

// Forces a split for tuning: 0 = choose. Must be one the chooser considers valid.
struct LnQuantStreamOptions {
  int row_parts = 0, col_parts = 0;
};

Status layernorm_modulate_quant_block128_stream_cuda(ElemType x_type, const void* x, int64_t rows, int64_t dim,
                                                     int64_t ld_x, const float* mod_shift, const float* mod_scale,
                                                     int64_t ld_mod, int64_t rows_per_batch, float eps, int8_t* q,
                                                     int64_t ld_q, float* scales, void* stream,
                                                     LnQuantStreamOptions options = {});

// The plan the entry point would run for this type and width on the current
// device (Unsupported where it would refuse).
Status layernorm_modulate_quant_block128_stream_plan(ElemType x_type, int64_t dim, LnQuantStreamOptions options,
                                                     LnQuantStreamPlan* plan);
#endif

}  // namespace td::kernels
