// Wan's patchify / unpatchify: the layout changes around the DiT's patch
// embedding and head, on the device the latent lives on (no host round trip).
//
//   patchify    latent f32 [B, C, T, H, W] (contiguous) -> tokens [B, L, C*pt*ph*pw]
//               in out_type (f32 or bf16, rounded once): token l = (f, h, w)
//               row-major over the (T/pt, H/ph, W/pw) patch grid, features in
//               (c, kt, kh, kw) order (the Conv3d weight's order).
//   unpatchify  tokens f32 [B, L, pt*ph*pw*C] in (kt, kh, kw, c) order (the
//               head's output order) -> f32 [B, C, T, H, W] (contiguous).
// T, H, W must be multiples of pt, ph, pw. Outputs must not overlap inputs.
#pragma once

#include <cstdint>

#include "kernels/status.h"

namespace td::kernels {

struct PatchGeometry {
  int64_t batch = 0, channels = 0, frames = 0, height = 0, width = 0;
  int64_t pt = 1, ph = 2, pw = 2;
};

// InvalidArgument for non-positive sizes, sizes that the patch does not divide,
// or an out_type other than F32/BF16 (patchify).
Status patchify_check(const PatchGeometry& g, ElemType out_type);

Status patchify_cpu(const PatchGeometry& g, const float* latent, ElemType out_type, void* tokens);
Status unpatchify_cpu(const PatchGeometry& g, const float* tokens, float* latent);

#if TURBODIFF_HAVE_CUDA
// One thread per output element (coalesced writes; the reads are strided but
// the whole tensor is a few MB at Wan sizes: microseconds).
Status patchify_cuda(const PatchGeometry& g, const float* latent, ElemType out_type, void* tokens, void* stream);
Status unpatchify_cuda(const PatchGeometry& g, const float* tokens, float* latent, void* stream);
#endif

}  // namespace td::kernels
