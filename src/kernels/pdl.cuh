// Programmatic dependent launch (sm_90+), shared by the kernels of a launch
// chain (SageSLA's fused path: K/V pass, quantize pass, block selection, the
// block-sparse kernel, the linear apply).
//
// A kernel launched with launch_pdl may start while the kernel before it in
// the stream is still running: its CTAs run up to pdl_wait(), which returns
// once that kernel has completed and its memory is visible. The earlier kernel
// lets it start by calling pdl_launch_dependents() (the launch happens when
// every CTA of the earlier kernel has called it or exited). What gains: the
// launch latency, each kernel's prologue, and work that does not read the
// earlier kernel's output, which runs on the SMs the earlier kernel's last
// wave leaves idle.
//
// The rules every kernel here keeps, so that "kernel n completed" still means
// "every kernel before it completed" (pdl_wait only waits for the kernel
// directly before):
//   - every thread calls pdl_wait() before its CTA exits, and before it reads
//     anything an earlier kernel of the stream wrote or writes anything an
//     earlier kernel may still read;
//   - pdl_launch_dependents() comes after pdl_wait(), unless the kernel's own
//     dependents wait for it before reading what it writes (noted where so).
// Measured on the H200 (docs/benchmarks.md, session 15): pdl_wait() in a
// kernel whose predecessor never waited returned only when the kernel before
// that had ended too, so a dependent cannot use pdl_wait() to start on its
// predecessor's output while an earlier kernel still runs; flags in memory
// (release / acquire) can.
// On a device below sm_90, or launched without the attribute, pdl_wait() and
// pdl_launch_dependents() are no-ops and the launch is an ordinary one.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace td::kernels {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches on the current device get the programmatic-serialization
// attribute: compute capability 9.0 or above, and TURBODIFF_PDL not "0" (an
// A/B switch; read once per process).
bool pdl_enabled();

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream
// serialization where `allow` and pdl_enabled().
template <typename... KernelArgs, typename... Args>
cudaError_t launch_pdl(bool allow, void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  if (allow && pdl_enabled()) {
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace td::kernels
