// int8_gemm_post_scale_lean_sm90.cuh without GELU, in the full kernel's tile
// and schedule: 128x128x128, clusters of 2 along M, ping-pong consumers.
#include "kernels/gemm/int8_gemm_post_scale_lean_sm90.cuh"

namespace td::kernels {

Status int8_gemm_post_scale_sm90_lean(const Int8GemmPostScaleArgs& args, int sm_count, int swizzle,
                                      post_scale_lean::RasterOrder raster, void* stream) {
  using G = post_scale_lean::LeanGemm<cute::Shape<cute::_128, cute::_128, cute::_128>, cute::Shape<cute::_2, cute::_1, cute::_1>,
                                      cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                      cutlass::epilogue::TmaWarpSpecialized, false>;
  return G::run(args, sm_count, swizzle, raster, stream);
}

}  // namespace td::kernels
