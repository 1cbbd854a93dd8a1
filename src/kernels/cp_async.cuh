// The cp.async building blocks (sm_80+) shared by kernels that stage global
// memory in shared memory with plain 16-byte asynchronous copies: the
// destination as a shared-window address, L2-only (.cg) copies, commit and
// wait by group count.
#pragma once

#include <cstdint>

namespace td::kernels {

// 16 bytes global -> shared (dst: a shared-window address, 16-byte aligned).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace td::kernels
