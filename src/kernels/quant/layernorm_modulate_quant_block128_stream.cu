// Fused LayerNorm + AdaLN modulation + INT8 block128 quantization, "stream"
// kernel: one read of x, the next stripe's loads in flight while the current
// stripe is processed (issue 3).
//
// Why the two older paths stall (layernorm_modulate_quant.cu): a 128x128
// block's scale needs y over 128 rows, and y needs each row's statistics, so
// every code waits for the whole 128-row stripe. The portable kernel reads x
// twice (the second read mostly from HBM at Wan's shapes: 5 B/element); the
// cluster kernel reads once but runs load -> statistics -> cluster.sync ->
// write with nothing in flight between phases (measured 29-32% of copy).
//
// Design. A persistent grid of thread-block clusters, each looping over
// 128-row stripes (stripe s, s + clusters, ...). A cluster is row_parts x
// col_parts CTAs of 16 warps, one per SM: CTA (h, k) owns rows
// [h*128/row_parts, ...) of the stripe and columns [k*slab_cols, ...) (whole
// 128-column blocks), its "slab", which it keeps in shared memory.
//  * loads: a ring of chunks (16 or 32 rows of the slab, whole stripes:
//    ring_chunks is a multiple of the chunks per stripe). Each thread loads
//    with 16-byte cp.async exactly the 8-element packs it later reads (the
//    lane -> column map is the same in every pass), so the ring needs no
//    barrier: cp.async.wait_group before the first read, and the refill of a
//    chunk (the same chunk of the stripe `ring / chunks` stripes later) is
//    issued right after the thread's last read of it (pass D). Up to 2-3
//    stripes' slabs in flight per SM (96-192 KB, >> the ~30 KB per SM that
//    4 TB/s needs at ~1 us latency).
//    (The first version had one thread issue a cp.async.bulk per slab row on
//    mbarriers, between its own work: 11.7% of copy; this one: 25-33%.)
//  * per stripe:
//    A. per row of the slab: local mean and centered sum of squares (M2)
//       from registers (exact two-pass over the registers), one warp per 1-2
//       rows; (mean, M2) into shared memory;
//    B. publish: a remote mbarrier arrive on every column part of the row
//       part (DSMEM, release.cluster), wait for theirs, read their partials
//       with ld.shared::cluster and merge (Chan: mean = sum n_k m_k / n,
//       M2 = sum M2_k + n_k (m_k - mean)^2) -> mean, rstd per row;
//    C. per element n = (x - mean) * rstd; per column the max and min of n
//       over the slab's rows (y = fma(n, 1 + scale, shift) is monotone in n
//       for a fixed column, so max |y| over the rows is reached at one of the
//       two: the block amax costs 2 FMNMX per element, the modulation is
//       applied once per column at the end); per-block maxima through shared
//       memory, exchanged with the other row part (DSMEM) -> scales;
//    D. codes: fma(n, (1 + scale) * inv, shift * inv), rounded by the
//       1.5 * 2^23 addition (codes8), 8-byte stores.
//    A stripe that straddles two samples (rows_per_batch not a multiple of
//    128) takes a slower per-row path in C and D (y = fma(n, 1 + scale[b],
//    shift[b]) per row, then y * inv: the reference's order).
//  * the split: the candidate that keeps the most SMs busy (measured: the
//    kernel is bound by its SMs, not by the ring depth), then two stripes in
//    the ring, no idle column blocks, fewer CTAs per cluster. Wan: 1536 ->
//    1 x 2 CTAs (768 columns, 66 clusters = 132 SMs); 5120 -> 1 x 8 (640
//    columns, 15 clusters = 120 SMs).
//
// Prediction (H200, copy ~4.1 TB/s measured by the benches): the kernel is
// bound by instruction issue before HBM unless it stays under ~26 issued
// instructions per element (4.9 elements per SM-cycle at 93% of copy, 128
// lanes issued per SM-cycle). Count per element: A 4 (unpack, add, sub,
// fma), C 5 (unpack, sub, mul, 2 min/max), D 6.75, 16-byte shared loads 3/8,
// stores 1/8, reductions and loop ~1.5: ~18, i.e. ~70% of the issue slots at
// 93% of copy. Predicted 88-95% of copy at 32760x1536 and 85-93% at
// 75600x5120, against 42% / 39% for the portable path.
//
// Measured (H200, bench_ln_quant_block128, 2026-11-30): 43.0% of copy at
// 32760x1536 (portable 42.2% in the same run) and 32.0% at 75600x5120
// (portable 38.9%). Steps, same-run pairs: chunk loops of A, C, D unrolled
// by 2: 32.0 -> 33.8% / 25.5 -> 26.8%; the 1-row-per-warp slots' packs
// taken as lane + 32 kk (no per-slot division result kept: the Wan
// instantiation <bf16, 3 slots, 1 row> went from 60 bytes of spills to
// none): 34.0 -> 43.0% / 26.7 -> 32.0%. The prediction was wrong by ~3x. A
// clock64 breakdown per stripe before the spill fix (TD_LNQS_PROFILE, 1536,
// 1 x 2): pass A 23%,
// B (CTA barrier + cluster exchange + merge) 9%, C 16%, C's barriers and
// scales 8%, D 36%; the loads are in time (waiting for them: 4%). So every
// pass runs at ~3x the cycles per element counted above (latency-bound:
// 16 warps per SM, 24 elements per lane per chunk between dependent
// reductions and barriers; 60-80 bytes of spills at 128 registers), and D
// at 2.3x C's cost for 1.35x its instructions (stores and cp.async refills
// in the same loop). At 1536 it now edges the portable path (43.0 vs 42.2%);
// at 5120 it does not (32.0 vs 38.9%): not yet a candidate for the default.
// Next: fewer registers still (the 2-rows-per-warp instantiations spill),
// more elements per lane per chunk, fewer passes.
// Registers: 128 (512 threads, 1 CTA per SM); spills: none in the Wan
// instantiations (16-bit, 3 slots, 1 row per warp), 16 bytes in fp32's,
// ~96 bytes in the 2-rows-per-warp 3-slot ones; shared memory <= 212 KB ring
// + 9.7 KB static.
#include "kernels/quant/layernorm_modulate_quant_block128_stream.h"

#include <cuda_runtime.h>

#include <mutex>
#include <type_traits>
#include <utility>

#include "kernels/quant/quant_device.cuh"

namespace td::kernels {
namespace {

using namespace qdev;

constexpr int kConsumerWarps = 16;
constexpr int kThreads = kConsumerWarps * 32;  // every thread loads its own packs (no producer warp: 17
                                               // warps would cap registers at 96 per thread and spill)
constexpr int kMaxRing = 32;
constexpr int kMaxSlots = 3;                           // 8-element packs per lane per row iteration
[[maybe_unused]] constexpr int kMaxSlabPacks = 32 * kMaxSlots;          // with rows_per_warp 1
constexpr int kMaxClusterCtas = 16;
constexpr size_t kRingBudget = 212 * 1024;  // dynamic shared memory for the ring (227 KB minus the static part)

struct StreamArgs {
  const void* x;
  int64_t rows;
  int dim;
  int64_t ld_x;
  const float* shift;
  const float* scale;
  int64_t ld_mod;
  int64_t rows_per_batch;
  float eps;
  int8_t* q;
  int64_t ld_q;
  float* scales;
  int64_t stripes;
  int groups;      // ceil(dim / 128): scales per stripe
  int slab_cols;   // columns of a full column part (a multiple of 128, or dim when dim < 128)
  int col_parts;   // CTAs across the columns
  int row_parts;   // CTAs across the 128 rows (1 or 2)
  int ring_chunks;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define TD_LNQS_SM90 1
#endif

#ifdef TD_LNQS_SM90
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_id() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_count() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Arrive on the barrier at the same offset in CTA `rank` of the cluster,
// releasing this thread's (and, through the preceding CTA barrier, its CTA's)
// shared-memory writes at cluster scope.
__device__ __forceinline__ void mbar_arrive_remote(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n\t.reg .b32 ra;\n\tmapa.shared::cluster.u32 ra, %0, %1;\n\t"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n\t}" ::"r"(smem_addr(bar)),
      "r"(rank)
      : "memory");
}
__device__ __forceinline__ bool mbar_try_cluster(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n\t.reg .pred p;\n\tmbarrier.test_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(ok)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return ok != 0;
}
// 16-byte asynchronous copy global -> shared, through L2 only (x is read once).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most n of this thread's committed groups are pending (an
// immediate in PTX: a switch; n > 31 waits as for 31, i.e. longer).
__device__ __forceinline__ void cp_async_wait_pending(int n) {
  switch (n) {
#define TD_LNQS_WAIT(k) \
  case k: asm volatile("cp.async.wait_group " #k ";" ::: "memory"); break;
    TD_LNQS_WAIT(0) TD_LNQS_WAIT(1) TD_LNQS_WAIT(2) TD_LNQS_WAIT(3) TD_LNQS_WAIT(4) TD_LNQS_WAIT(5)
    TD_LNQS_WAIT(6) TD_LNQS_WAIT(7) TD_LNQS_WAIT(8) TD_LNQS_WAIT(9) TD_LNQS_WAIT(10) TD_LNQS_WAIT(11)
    TD_LNQS_WAIT(12) TD_LNQS_WAIT(13) TD_LNQS_WAIT(14) TD_LNQS_WAIT(15) TD_LNQS_WAIT(16) TD_LNQS_WAIT(17)
    TD_LNQS_WAIT(18) TD_LNQS_WAIT(19) TD_LNQS_WAIT(20) TD_LNQS_WAIT(21) TD_LNQS_WAIT(22) TD_LNQS_WAIT(23)
    TD_LNQS_WAIT(24) TD_LNQS_WAIT(25) TD_LNQS_WAIT(26) TD_LNQS_WAIT(27) TD_LNQS_WAIT(28) TD_LNQS_WAIT(29)
    TD_LNQS_WAIT(30)
#undef TD_LNQS_WAIT
    default: asm volatile("cp.async.wait_group 31;" ::: "memory"); break;
  }
}
__device__ __forceinline__ float2 ld_remote_f2(const void* local, uint32_t rank) {
  float2 v;
  asm volatile(
      "{\n\t.reg .b32 ra;\n\tmapa.shared::cluster.u32 ra, %2, %3;\n\tld.shared::cluster.v2.f32 {%0, %1}, [ra];\n\t}"
      : "=f"(v.x), "=f"(v.y)
      : "r"(smem_addr(local)), "r"(rank)
      : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_remote_u32(const void* local, uint32_t rank) {
  uint32_t v;
  asm volatile(
      "{\n\t.reg .b32 ra;\n\tmapa.shared::cluster.u32 ra, %1, %2;\n\tld.shared::cluster.u32 %0, [ra];\n\t}"
      : "=r"(v)
      : "r"(smem_addr(local)), "r"(rank)
      : "memory");
  return v;
}
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"r"(kConsumerWarps * 32) : "memory");
}
__device__ __forceinline__ void fence_cluster() { asm volatile("fence.acq_rel.cluster;" ::: "memory"); }
// Codes of 8 already scaled values t (|t| <= 128 up to rounding: y * 128 /
// amax), without the conversion pipe: min(t, 127) + 1.5 * 2^23 rounds to the
// nearest integer, ties to even, in the low mantissa bits (exact for
// |t| < 2^22), whose low byte is the two's-complement code; PRMT gathers the
// bytes. The same codes as cvt.rni.sat.s8.f32 for t >= -128.5 (below it would
// wrap: unreachable, as y >= -amax), at 2 FP32 instructions per code instead
// of one F2I on the quarter-rate conversion pipe (measured the slowest phase).
__device__ __forceinline__ uint2 codes8(const float (&t)[8]) {
  uint32_t c[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) c[i] = __float_as_uint(__fadd_rn(fminf(t[i], 127.f), 12582912.f));
  return make_uint2(__byte_perm(__byte_perm(c[0], c[1], 0x0040), __byte_perm(c[2], c[3], 0x0040), 0x5410),
                    __byte_perm(__byte_perm(c[4], c[5], 0x0040), __byte_perm(c[6], c[7], 0x0040), 0x5410));
}

// The 8 modulation parameters of a pack: 1 + scale and shift of sample b.
__device__ __forceinline__ void pack_modulation(const StreamArgs& a, int64_t b, int col, float (&sc1)[8],
                                                float (&sh)[8]) {
  load_params8(a.scale + b * a.ld_mod + col, sc1);
  load_params8(a.shift + b * a.ld_mod + col, sh);
#pragma unroll
  for (int e = 0; e < 8; ++e) sc1[e] = 1.f + sc1[e];
}

#endif  // TD_LNQS_SM90


#ifdef TD_LNQS_PROFILE
__device__ unsigned long long g_lnqs_prof[8 * 1024];
#endif
template <typename T, int KP, int RW>
__global__ void __launch_bounds__(kThreads, 1) ln_mod_quant_block128_stream_kernel(StreamArgs a) {
#ifdef TD_LNQS_SM90
  constexpr int kChunkRows = kConsumerWarps * RW;
  constexpr int kPackBytes = int(sizeof(Pack8<T>));
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ uint64_t stats_bar[2], amax_bar[2];
  __shared__ float2 part[2][kQuantGroup];  // (local mean, local M2) per row of this CTA's part of the stripe
  __shared__ float row_mean[kQuantGroup], row_rstd[kQuantGroup];
  __shared__ uint32_t pack_amax[kConsumerWarps][kMaxSlabPacks];  // float bits of |y| maxima per warp and pack
  constexpr int kMaxSlabGroups = kMaxSlabPacks / 16;              // 128-column blocks of a slab
  __shared__ uint32_t group_amax[2][kMaxSlabGroups];
  __shared__ float group_inv[kMaxSlabGroups];

  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const uint32_t rank = cluster_rank();
  const int cc = a.col_parts;
  const int h = int(rank) / cc, kpart = int(rank) % cc;
  const int part_rows = kQuantGroup / a.row_parts;
  const int chunks_per_part = part_rows / kChunkRows;  // 2, 4 or 8
  const int col0 = kpart * a.slab_cols;
  const int my_cols = max(0, min(a.dim - col0, a.slab_cols));
  const int my_packs = my_cols / 8;
  const int my_groups = (my_cols + kQuantGroup - 1) / kQuantGroup;
  const int group0 = kpart * ((a.slab_cols + kQuantGroup - 1) / kQuantGroup);
  const int pitch = a.slab_cols * int(sizeof(T));  // bytes of a slab row in shared memory
  const int chunk_bytes = kChunkRows * pitch;
  const int ring_chunks = a.ring_chunks;
  const int64_t first_stripe = cluster_id(), stripe_step = cluster_count();
#ifdef TD_LNQS_PROFILE
  long long prof[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const long long p_start = clock64();
#define PROF_MARK(k) { const long long now_ = clock64(); prof[k] += now_ - p_last; p_last = now_; }
#else
#define PROF_MARK(k)
#endif

  if (threadIdx.x == 0) {
    for (int i = 0; i < 2; ++i) mbar_init(&stats_bar[i], uint32_t(cc)), mbar_init(&amax_bar[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  for (int i = int(threadIdx.x); i < kConsumerWarps * kMaxSlabPacks; i += kThreads) (&pack_amax[0][0])[i] = 0u;
  __syncthreads();
  cluster_sync_all();  // every CTA's barriers exist before any remote arrive

  // Lane geometry: slot kk of this lane is flat pack f = lane + 32 kk of the
  // warp's RW rows of a chunk (row f / slab_packs, pack f % slab_packs): the
  // same columns in every chunk. A thread loads exactly the packs it later
  // reads (16-byte cp.async into its own ring positions), so the ring needs
  // no barrier: cp.async.wait_group orders a thread's copies before its reads,
  // and program order its reads before its next copy into the same place.
  const int slab_packs = a.slab_cols / 8;
  int slot_pack[KP], slot_row[KP];
  bool slot_ok[KP];
#pragma unroll
  for (int kk = 0; kk < KP; ++kk) {
    const int f = lane + 32 * kk;
    slot_row[kk] = RW == 1 ? 0 : f / slab_packs;
    slot_pack[kk] = RW == 1 ? f : f % slab_packs;  // (RW 1: f itself for every valid slot, and no division)
    slot_ok[kk] = f < RW * slab_packs && slot_pack[kk] < my_packs;
  }
  auto rows_in_part = [&](int64_t s) {
    const int64_t left = a.rows - (s * kQuantGroup + int64_t(h) * part_rows);
    return left <= 0 ? 0 : (left < part_rows ? int(left) : part_rows);
  };
  // Ring slots: stripes it, it + 1, ... take slots (it % ahead) * chunks_per_part
  // onward (ring_chunks is a multiple of chunks_per_part, chosen on the host).
  const int ahead = ring_chunks / chunks_per_part;
  auto chunk_base = [&](int it_local, int c) {  // this warp's rows of chunk c of local stripe it_local
    return ring + size_t((it_local % ahead) * chunks_per_part + c) * size_t(chunk_bytes) +
           size_t(warp * RW) * size_t(pitch);
  };
  // Loads of chunk c of stripe s (nrows rows in this part) into `buf`, one
  // commit group per chunk (empty past the last row). `src` is this warp's
  // first row of the stripe part at column col0.
  auto issue = [&](const T* src, int nrows, int c, unsigned char* buf) {
    const int rbase = c * kChunkRows + warp * RW;
    src += int64_t(c) * kChunkRows * a.ld_x;
#pragma unroll
    for (int kk = 0; kk < KP; ++kk) {
      if (slot_ok[kk] && rbase + slot_row[kk] < nrows) {
        unsigned char* dst = buf + slot_row[kk] * pitch + slot_pack[kk] * kPackBytes;
        const T* from = src + (slot_row[kk] ? a.ld_x : 0) + slot_pack[kk] * 8;
#pragma unroll
        for (int w = 0; w < kPackBytes / 16; ++w) cp_async16(dst + 16 * w, reinterpret_cast<const char*>(from) + 16 * w);
      }
    }
    cp_async_commit();
  };
  const T* xg = static_cast<const T*>(a.x);
  auto stripe_src = [&](int64_t s) {
    return xg + (s * kQuantGroup + int64_t(h) * part_rows + warp * RW) * a.ld_x + col0;
  };
  int committed = 0;
  for (int i = 0; i < ahead; ++i) {
    const int64_t s = first_stripe + int64_t(i) * stripe_step;
    const int nrows = s < a.stripes ? rows_in_part(s) : 0;
    const T* src = s < a.stripes ? stripe_src(s) : xg;
    for (int c = 0; c < chunks_per_part; ++c, ++committed) issue(src, nrows, c, chunk_base(i, c));
  }

  const float inv_cols = my_cols > 0 ? 1.f / float(my_cols) : 0.f;
  int it = 0;
  for (int64_t s = first_stripe; s < a.stripes; s += stripe_step, ++it) {
#ifdef TD_LNQS_PROFILE
    long long p_last = clock64();
#endif
    const int par = it & 1;
    const uint32_t par_phase = uint32_t(it >> 1) & 1u;
    const int64_t r0 = s * kQuantGroup + int64_t(h) * part_rows;
    const int nrows = rows_in_part(s);
    const int nchunks = (nrows + kChunkRows - 1) / kChunkRows;
    const int q0 = it * chunks_per_part;

    // A. local statistics of this warp's rows.
#pragma unroll 2
    for (int c = 0; c < nchunks; ++c) {
#ifdef TD_LNQS_PROFILE
      const long long w0 = clock64();
#endif
      cp_async_wait_pending(committed - (q0 + c) - 1);
#ifdef TD_LNQS_PROFILE
      prof[1] += clock64() - w0;
#endif
      const int rbase = c * kChunkRows + warp * RW;
      const unsigned char* buf = chunk_base(it, c);
      float v[KP][8];
      float s0 = 0.f, s1 = 0.f;
#pragma unroll
      for (int kk = 0; kk < KP; ++kk) {
        const bool ok = slot_ok[kk] && rbase + slot_row[kk] < nrows;
        if (ok) {
          unpack(*reinterpret_cast<const Pack8<T>*>(buf + slot_row[kk] * pitch + slot_pack[kk] * kPackBytes), v[kk]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) v[kk][e] = 0.f;
        }
        float t = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) t += v[kk][e];
        if (RW == 1 || slot_row[kk] == 0)
          s0 += t;
        else
          s1 += t;
      }
      s0 = warp_sum(s0);
      if (RW == 2) s1 = warp_sum(s1);
      const float m0 = s0 * inv_cols, m1 = s1 * inv_cols;
      float q0s = 0.f, q1s = 0.f;
#pragma unroll
      for (int kk = 0; kk < KP; ++kk) {
        const bool ok = slot_ok[kk] && rbase + slot_row[kk] < nrows;
        const float m = (RW == 1 || slot_row[kk] == 0) ? m0 : m1;
        float t = 0.f;
        if (ok) {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float d = v[kk][e] - m;
            t = fmaf(d, d, t);
          }
        }
        if (RW == 1 || slot_row[kk] == 0)
          q0s += t;
        else
          q1s += t;
      }
      q0s = warp_sum(q0s);
      if (RW == 2) q1s = warp_sum(q1s);
      if (lane == 0) {
        if (rbase < nrows) part[par][rbase] = make_float2(m0, q0s);
        if (RW == 2 && rbase + 1 < nrows) part[par][rbase + 1] = make_float2(m1, q1s);
      }
    }

    // B. merge the column parts' partials of each row (DSMEM).
    consumers_sync();  // this CTA's partials are written
    PROF_MARK(2);
    if (threadIdx.x == 0) {
      fence_cluster();
      for (int k = 0; k < cc; ++k) mbar_arrive_remote(&stats_bar[par], uint32_t(h * cc + k));
    }
    while (!mbar_try_cluster(&stats_bar[par], par_phase)) {
    }
    PROF_MARK(3);
    if ((cc & (cc - 1)) != 0) {
      // 3, 5, 6 ... column parts: a lane per row (nq <= 16), the parts in a loop.
      const int nq = chunks_per_part * RW;
      const int row = (lane / RW) * kChunkRows + warp * RW + lane % RW;
      if (lane < nq && row < nrows) {
        float sum = 0.f;
        for (int k = 0; k < cc; ++k) {
          const float nk = float(max(0, min(a.dim - k * a.slab_cols, a.slab_cols)));
          sum += nk * ld_remote_f2(&part[par][row], uint32_t(h * cc + k)).x;
        }
        const float mean = sum / float(a.dim);
        float m2 = 0.f;
        for (int k = 0; k < cc; ++k) {
          const float nk = float(max(0, min(a.dim - k * a.slab_cols, a.slab_cols)));
          const float2 pm = ld_remote_f2(&part[par][row], uint32_t(h * cc + k));
          const float d = pm.x - mean;
          m2 += fmaf(nk * d, d, pm.y);
        }
        row_mean[row] = mean;
        row_rstd[row] = __fdiv_rn(1.f, __fsqrt_rn(m2 / float(a.dim) + a.eps));
      }
      __syncwarp();
    } else {
      const int rows_per_round = 32 / cc;
      const int nq = chunks_per_part * RW;  // rows of this warp in the stripe part
      const int k = lane % cc;
      const float nk = float(max(0, min(a.dim - k * a.slab_cols, a.slab_cols)));
      for (int qb = 0; qb < nq; qb += rows_per_round) {
        const int qi = qb + lane / cc;
        const int row = (qi / RW) * kChunkRows + warp * RW + qi % RW;
        const bool ok = qi < nq && row < nrows;
        const float2 pm = ok ? ld_remote_f2(&part[par][row], uint32_t(h * cc + k)) : make_float2(0.f, 0.f);
        float sum = nk * pm.x;
        for (int o = 1; o < cc; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const float mean = sum / float(a.dim);
        const float d = pm.x - mean;
        float m2 = fmaf(nk * d, d, pm.y);
        for (int o = 1; o < cc; o <<= 1) m2 += __shfl_xor_sync(0xffffffffu, m2, o);
        if (ok && k == 0) {
          row_mean[row] = mean;
          row_rstd[row] = __fdiv_rn(1.f, __fsqrt_rn(m2 / float(a.dim) + a.eps));
        }
      }
      __syncwarp();
    }

    PROF_MARK(4);
    // C. block maxima of |y|.
    const int64_t b_first = r0 / a.rows_per_batch;
    const bool one_batch = nrows == 0 || (r0 + nrows - 1) / a.rows_per_batch == b_first;
    float slot_amax[KP];
    if (one_batch) {
      float nmax[KP][8], nmin[KP][8];
#pragma unroll
      for (int kk = 0; kk < KP; ++kk)
#pragma unroll
        for (int e = 0; e < 8; ++e) nmax[kk][e] = -3.0e38f, nmin[kk][e] = 3.0e38f;
#pragma unroll 2
      for (int c = 0; c < nchunks; ++c) {
        const int rbase = c * kChunkRows + warp * RW;
        const unsigned char* buf = chunk_base(it, c);
        const float mean0 = row_mean[rbase], rstd0 = row_rstd[rbase];
        const float mean1 = RW == 2 ? row_mean[rbase + 1] : 0.f, rstd1 = RW == 2 ? row_rstd[rbase + 1] : 0.f;
#pragma unroll
        for (int kk = 0; kk < KP; ++kk) {
          if (slot_ok[kk] && rbase + slot_row[kk] < nrows) {
            const float mean = (RW == 1 || slot_row[kk] == 0) ? mean0 : mean1;
            const float rstd = (RW == 1 || slot_row[kk] == 0) ? rstd0 : rstd1;
            float f[8];
            unpack(*reinterpret_cast<const Pack8<T>*>(buf + slot_row[kk] * pitch + slot_pack[kk] * kPackBytes), f);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              const float n = (f[e] - mean) * rstd;
              nmax[kk][e] = fmaxf(nmax[kk][e], n);
              nmin[kk][e] = fminf(nmin[kk][e], n);
            }
          }
        }
      }
#pragma unroll
      for (int kk = 0; kk < KP; ++kk) {
        slot_amax[kk] = 0.f;
        if (slot_ok[kk] && nmax[kk][0] >= nmin[kk][0]) {  // some row of the part reached this slot
          float sc1[8], sh[8];
          pack_modulation(a, b_first, col0 + slot_pack[kk] * 8, sc1, sh);
#pragma unroll
          for (int e = 0; e < 8; ++e)
            slot_amax[kk] = fmaxf(slot_amax[kk], fmaxf(fabsf(fmaf(nmax[kk][e], sc1[e], sh[e])),
                                                       fabsf(fmaf(nmin[kk][e], sc1[e], sh[e]))));
        }
      }
    } else {
      // Rows of several samples in this stripe: the modulation per row.
#pragma unroll
      for (int kk = 0; kk < KP; ++kk) slot_amax[kk] = 0.f;
      for (int c = 0; c < nchunks; ++c) {
        const int rbase = c * kChunkRows + warp * RW;
        const unsigned char* buf = chunk_base(it, c);
#pragma unroll
        for (int kk = 0; kk < KP; ++kk) {
          const int row = rbase + slot_row[kk];
          if (slot_ok[kk] && row < nrows) {
            const float mean = row_mean[row], rstd = row_rstd[row];
            float f[8], sc1[8], sh[8];
            pack_modulation(a, (r0 + row) / a.rows_per_batch, col0 + slot_pack[kk] * 8, sc1, sh);
            unpack(*reinterpret_cast<const Pack8<T>*>(buf + slot_row[kk] * pitch + slot_pack[kk] * kPackBytes), f);
#pragma unroll
            for (int e = 0; e < 8; ++e)
              slot_amax[kk] = fmaxf(slot_amax[kk], fabsf(fmaf((f[e] - mean) * rstd, sc1[e], sh[e])));
          }
        }
      }
    }
    PROF_MARK(5);
#pragma unroll
    for (int kk = 0; kk < KP; ++kk)
      if (slot_ok[kk]) atomicMax(&pack_amax[warp][slot_pack[kk]], __float_as_uint(slot_amax[kk]));
    consumers_sync();  // pack_amax complete
    if (warp * 32 < my_packs) {
      const int t = int(threadIdx.x);
      uint32_t m = 0u;
      if (t < my_packs) {
#pragma unroll 4
        for (int w = 0; w < kConsumerWarps; ++w) {
          m = max(m, pack_amax[w][t]);
          pack_amax[w][t] = 0u;  // ready for the next stripe (read once, here)
        }
      }
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
      if (t < my_packs && (t & 15) == 0) group_amax[par][t >> 4] = m;
    }
    consumers_sync();  // group_amax[par] complete
    if (a.row_parts == 2) {
      if (threadIdx.x == 0) {
        fence_cluster();
        mbar_arrive_remote(&amax_bar[par], uint32_t((1 - h) * cc + kpart));
      }
      while (!mbar_try_cluster(&amax_bar[par], par_phase)) {
      }
    }
    if (int(threadIdx.x) < my_groups) {
      uint32_t m = group_amax[par][threadIdx.x];
      if (a.row_parts == 2) m = max(m, ld_remote_u32(&group_amax[par][threadIdx.x], uint32_t((1 - h) * cc + kpart)));
      const QuantParams qp = block128_params_dev(__uint_as_float(m));
      group_inv[threadIdx.x] = qp.inv;
      if (h == 0) a.scales[s * a.groups + group0 + int(threadIdx.x)] = qp.scale;
    }
    consumers_sync();  // group_inv complete

    PROF_MARK(6);
    // D. codes; each chunk's ring positions are refilled right after with
    // the same chunk of the stripe `ahead` stripes later.
    const int64_t s_next = s + int64_t(ahead) * stripe_step;
    const int next_rows = s_next < a.stripes ? rows_in_part(s_next) : 0;
    const T* next_src = s_next < a.stripes ? stripe_src(s_next) : xg;
    float inv[KP];
#pragma unroll
    for (int kk = 0; kk < KP; ++kk) inv[kk] = group_inv[slot_pack[kk] >> 4];
    if (one_batch) {
      // (1 + scale) * inv and shift * inv per column: one FMA per element.
      float sci[KP][8], shi[KP][8];
#pragma unroll
      for (int kk = 0; kk < KP; ++kk) {
        if (slot_ok[kk]) {
          pack_modulation(a, b_first, col0 + slot_pack[kk] * 8, sci[kk], shi[kk]);
#pragma unroll
          for (int e = 0; e < 8; ++e) sci[kk][e] *= inv[kk], shi[kk][e] *= inv[kk];
        }
      }
#pragma unroll 2
      for (int c = 0; c < nchunks; ++c) {
        const int rbase = c * kChunkRows + warp * RW;
        const unsigned char* buf = chunk_base(it, c);
        const float mean0 = row_mean[rbase], rstd0 = row_rstd[rbase];
        const float mean1 = RW == 2 ? row_mean[rbase + 1] : 0.f, rstd1 = RW == 2 ? row_rstd[rbase + 1] : 0.f;
        int8_t* qrow = a.q + (r0 + rbase) * a.ld_q + col0;
#pragma unroll
        for (int kk = 0; kk < KP; ++kk) {
          if (slot_ok[kk] && rbase + slot_row[kk] < nrows) {
            const float mean = (RW == 1 || slot_row[kk] == 0) ? mean0 : mean1;
            const float rstd = (RW == 1 || slot_row[kk] == 0) ? rstd0 : rstd1;
            float f[8], t[8];
            unpack(*reinterpret_cast<const Pack8<T>*>(buf + slot_row[kk] * pitch + slot_pack[kk] * kPackBytes), f);
#pragma unroll
            for (int e = 0; e < 8; ++e) t[e] = fmaf((f[e] - mean) * rstd, sci[kk][e], shi[kk][e]);
            *reinterpret_cast<uint2*>(qrow + slot_row[kk] * a.ld_q + slot_pack[kk] * 8) = codes8(t);
          }
        }
        issue(next_src, next_rows, c, const_cast<unsigned char*>(buf));
        ++committed;
      }
    } else {
      for (int c = 0; c < nchunks; ++c) {
        const int rbase = c * kChunkRows + warp * RW;
        const unsigned char* buf = chunk_base(it, c);
        int8_t* qrow = a.q + (r0 + rbase) * a.ld_q + col0;
#pragma unroll
        for (int kk = 0; kk < KP; ++kk) {
          const int row = rbase + slot_row[kk];
          if (slot_ok[kk] && row < nrows) {
            const float mean = row_mean[row], rstd = row_rstd[row];
            float f[8], sc1[8], sh[8], y[8];
            pack_modulation(a, (r0 + row) / a.rows_per_batch, col0 + slot_pack[kk] * 8, sc1, sh);
            unpack(*reinterpret_cast<const Pack8<T>*>(buf + slot_row[kk] * pitch + slot_pack[kk] * kPackBytes), f);
#pragma unroll
            for (int e = 0; e < 8; ++e) y[e] = fmaf((f[e] - mean) * rstd, sc1[e], sh[e]);
            *reinterpret_cast<uint2*>(qrow + slot_row[kk] * a.ld_q + slot_pack[kk] * 8) = quantize8_prmt(y, inv[kk]);
          }
        }
        issue(next_src, next_rows, c, const_cast<unsigned char*>(buf));
        ++committed;
      }
    }
    // Chunks past the last row of this part (the last stripe): keep one
    // group per chunk sequence number.
    for (int c = nchunks; c < chunks_per_part; ++c, ++committed)
      issue(next_src, next_rows, c, chunk_base(it, c));
    PROF_MARK(7);
  }
#ifdef TD_LNQS_PROFILE
  if (threadIdx.x == 0) {
    unsigned long long* o = g_lnqs_prof + blockIdx.x * 8;
    o[0] = clock64() - p_start; for (int k = 1; k < 8; ++k) o[k] = prof[k];
  }
#endif
  cp_async_wait_pending(0);
  cluster_sync_all();  // no CTA leaves while a peer may still read its partials or maxima
#else
  (void)a;  // launched only on sm_90+ (the host checks the device)
#endif
}

// ---- host: the split of a stripe, occupancy, launch ----------------------------

struct Plan {
  int row_parts = 0, col_parts = 0, slab_cols = 0, rows_per_warp = 0, slots = 0, ring_chunks = 0;
  size_t ring_bytes = 0;
};

// The candidates for `dim` columns of `elem` bytes, best first: a ring that
// holds two stripe parts (loads of the next stripe never wait), no idle
// 128-column blocks, fewer CTAs per cluster.
int candidate_plans(int dim, int elem, LnQuantStreamOptions opt, Plan* out, int max_out) {
  struct Scored {
    Plan p;
    int key[3];
  } list[16];
  int n = 0;
  const int groups = (dim + kQuantGroup - 1) / kQuantGroup;
  for (int rp : {1, 2}) {
    for (int cp : {1, 2, 3, 4, 6, 8, 16}) {
      if (rp * cp > kMaxClusterCtas) continue;
      if ((opt.row_parts && opt.row_parts != rp) || (opt.col_parts && opt.col_parts != cp)) continue;
      const int per_part = (groups + cp - 1) / cp;
      if (cp > 1 && (cp - 1) * per_part >= groups) continue;  // a column part with nothing to do
      const int slab_cols = groups == 1 ? dim : per_part * kQuantGroup;
      const int packs = slab_cols / 8;
      int rw = 0, slots = 0, idle = 1 << 30;
      for (int r : {1, 2}) {
        const int kp = (r * packs + 31) / 32;
        if (kp > kMaxSlots) continue;
        const int lanes_idle = 32 * kp - r * packs;
        if (lanes_idle < idle) idle = lanes_idle, rw = r, slots = kp;
      }
      if (rw == 0) continue;
      const int chunk_rows = kConsumerWarps * rw, part_rows = kQuantGroup / rp;
      if (part_rows % chunk_rows != 0) continue;
      const int chunks_per_part = part_rows / chunk_rows;
      const size_t chunk_bytes = size_t(chunk_rows) * size_t(slab_cols) * size_t(elem);
      int ring = int(kRingBudget / chunk_bytes);
      if (ring > kMaxRing) ring = kMaxRing;
      if (ring > 3 * chunks_per_part) ring = 3 * chunks_per_part;
      ring -= ring % chunks_per_part;  // whole stripes: a chunk is refilled with the same chunk of a later stripe
      if (ring < chunks_per_part) continue;
      Plan p{rp, cp, slab_cols, rw, slots, ring, size_t(ring) * chunk_bytes};
      list[n++] = Scored{p, {ring >= 2 * chunks_per_part ? 0 : 1, cp * per_part - groups, rp * cp}};
    }
  }
  // Insertion sort by key (lexicographic), stable.
  for (int i = 1; i < n; ++i)
    for (int j = i; j > 0; --j) {
      const int* a = list[j - 1].key;
      const int* b = list[j].key;
      const bool less = b[0] != a[0] ? b[0] < a[0] : b[1] != a[1] ? b[1] < a[1] : b[2] < a[2];
      if (!less) break;
      std::swap(list[j - 1], list[j]);
    }
  int m = 0;
  for (int i = 0; i < n && m < max_out; ++i) out[m++] = list[i].p;
  return m;
}

template <typename F>
Status dispatch_plan(int slots, int rows_per_warp, F&& f) {
  if (rows_per_warp == 1) {
    switch (slots) {
      case 1: return f(std::integral_constant<int, 1>{}, std::integral_constant<int, 1>{});
      case 2: return f(std::integral_constant<int, 2>{}, std::integral_constant<int, 1>{});
      case 3: return f(std::integral_constant<int, 3>{}, std::integral_constant<int, 1>{});
    }
  } else if (rows_per_warp == 2) {
    switch (slots) {
      case 1: return f(std::integral_constant<int, 1>{}, std::integral_constant<int, 2>{});
      case 2: return f(std::integral_constant<int, 2>{}, std::integral_constant<int, 2>{});
      case 3: return f(std::integral_constant<int, 3>{}, std::integral_constant<int, 2>{});
    }
  }
  return Status::InvalidArgument;
}

template <typename T>
void fill_launch(cudaLaunchConfig_t& cfg, cudaLaunchAttribute& attr, const Plan& p, int clusters, cudaStream_t s) {
  cfg = cudaLaunchConfig_t{};
  cfg.gridDim = dim3{unsigned(clusters * p.row_parts * p.col_parts), 1u, 1u};
  cfg.blockDim = dim3{unsigned(kThreads), 1u, 1u};
  cfg.dynamicSmemBytes = p.ring_bytes;
  cfg.stream = s;
  attr = cudaLaunchAttribute{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(p.row_parts * p.col_parts);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
}

// Clusters of this plan resident at once on the current device (0: none fit).
template <typename T>
int resident_clusters(const Plan& p) {
  int clusters = 0;
  dispatch_plan(p.slots, p.rows_per_warp, [&](auto kp, auto rw) {
    auto kernel = ln_mod_quant_block128_stream_kernel<T, decltype(kp)::value, decltype(rw)::value>;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kRingBudget)) != cudaSuccess)
      return Status::Unsupported;
    if (p.row_parts * p.col_parts > 8 &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
      return Status::Unsupported;
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr;
    fill_launch<T>(cfg, attr, p, 1, nullptr);
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) clusters = 0;
    return Status::Ok;
  });
  return clusters;
}


// The plan for (type, dim, options) on device `dev`, cached: a launch must
// not pay for the occupancy queries. plan.clusters == 0: none runs here.
template <typename T>
LnQuantStreamPlan choose_plan(int dev, int dim, LnQuantStreamOptions opt, Plan* chosen) {
  struct Entry {
    int dev, dim, rp, cp;
    LnQuantStreamPlan pub;
    Plan plan;
  };
  static std::mutex mu;
  static Entry cache[32];
  static int cached = 0, next = 0;
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < cached; ++i) {
    const Entry& e = cache[i];
    if (e.dev == dev && e.dim == dim && e.rp == opt.row_parts && e.cp == opt.col_parts) {
      *chosen = e.plan;
      return e.pub;
    }
  }
  LnQuantStreamPlan pub;
  Plan best;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9) {
    Plan plans[16];
    const int n = candidate_plans(dim, int(sizeof(T)), opt, plans, 16);
    // The most SMs busy wins (measured on the H200: the kernel is bound by
    // its SMs' issue, not by the ring depth: 1 x 2 CTAs, 132 SMs, ran 1.34x
    // faster than 1 x 4 on 120 SMs at 32760 x 1536); ties go to the earlier
    // (preferred) candidate.
    int best_sms = 0;
    for (int i = 0; i < n; ++i) {
      const int clusters = resident_clusters<T>(plans[i]);
      const int sms = clusters * plans[i].row_parts * plans[i].col_parts;
      if (clusters >= 1 && sms > best_sms) {
        best_sms = sms;
        best = plans[i];
        pub = LnQuantStreamPlan{best.row_parts, best.col_parts, best.slab_cols, best.rows_per_warp,
                                best.slots,     best.ring_chunks, clusters};
      }
    }
  }
  (void)cudaGetLastError();  // a refused configuration is not a launch error
  Entry& e = cache[next];
  e = Entry{dev, dim, opt.row_parts, opt.col_parts, pub, best};
  next = (next + 1) % 32;
  if (cached < 32) ++cached;
  *chosen = best;
  return pub;
}

bool sm90_code_built() {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, ln_mod_quant_block128_stream_kernel<__nv_bfloat16, 1, 1>) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.binaryVersion >= 90;
}

}  // namespace

Status layernorm_modulate_quant_block128_stream_plan(ElemType x_type, int64_t dim, LnQuantStreamOptions options,
                                                     LnQuantStreamPlan* plan) {
  if (!plan || dim <= 0 || dim % 8 != 0 || dim > kMaxRowDim) return Status::InvalidArgument;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return Status::Unsupported;
  if (!sm90_code_built()) return Status::Unsupported;
  return dispatch_act_type(x_type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    Plan p;
    *plan = choose_plan<T>(dev, int(dim), options, &p);
    return plan->clusters > 0 ? Status::Ok : Status::Unsupported;
  });
}

Status layernorm_modulate_quant_block128_stream_cuda(ElemType x_type, const void* x, int64_t rows, int64_t dim,
                                                     int64_t ld_x, const float* mod_shift, const float* mod_scale,
                                                     int64_t ld_mod, int64_t rows_per_batch, float eps, int8_t* q,
                                                     int64_t ld_q, float* scales, void* stream,
                                                     LnQuantStreamOptions options) {
  // The checks of the other CUDA paths (layernorm_modulate_quant.cu).
  if (rows < 0 || dim < 0 || rows_per_batch < 1 || !(eps >= 0.f)) return Status::InvalidArgument;
  if (x_type != ElemType::F32 && x_type != ElemType::F16 && x_type != ElemType::BF16) return Status::InvalidArgument;
  if (rows == 0 || dim == 0) return Status::Ok;
  if (dim % 8 != 0 || dim > kMaxRowDim) return Status::InvalidArgument;
  if (!x || !mod_shift || !mod_scale || !q || !scales) return Status::InvalidArgument;
  if (ld_x < dim || ld_q < dim || ld_mod < dim) return Status::InvalidArgument;
  if (ld_x % 8 != 0 || ld_q % 8 != 0 || ld_mod % 8 != 0) return Status::InvalidArgument;
  if (!aligned_to(x, 16) || !aligned_to(mod_shift, 16) || !aligned_to(mod_scale, 16) || !aligned_to(q, 8))
    return Status::InvalidArgument;
  if (options.row_parts < 0 || options.col_parts < 0) return Status::InvalidArgument;
  const int64_t stripes = quant_groups(rows);
  if (stripes > 0x7fffffff) return Status::InvalidArgument;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return Status::LaunchFailed;
  if (!sm90_code_built()) return Status::Unsupported;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_act_type(x_type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    Plan p;
    const LnQuantStreamPlan pub = choose_plan<T>(dev, int(dim), options, &p);
    if (pub.clusters < 1) return Status::Unsupported;
    const int clusters = int(stripes < pub.clusters ? stripes : pub.clusters);
    const StreamArgs a{x,         rows,         int(dim),     ld_x,        mod_shift,
                       mod_scale, ld_mod,       rows_per_batch, eps,       q,
                       ld_q,      scales,       stripes,      int(quant_groups(dim)), p.slab_cols,
                       p.col_parts, p.row_parts, p.ring_chunks};
    return dispatch_plan(p.slots, p.rows_per_warp, [&](auto kp, auto rw) {
      cudaLaunchConfig_t cfg;
      cudaLaunchAttribute attr;
      fill_launch<T>(cfg, attr, p, clusters, s);
      if (cudaLaunchKernelEx(&cfg, ln_mod_quant_block128_stream_kernel<T, decltype(kp)::value, decltype(rw)::value>,
                             a) != cudaSuccess)
        return Status::LaunchFailed;
#ifdef TD_LNQS_PROFILE
      {
        static int calls = 0;
        if (++calls == 5) {
          cudaDeviceSynchronize();
          static unsigned long long hb[8 * 1024];
          cudaMemcpyFromSymbol(hb, g_lnqs_prof, sizeof(hb));
          const int ctas = clusters * p.row_parts * p.col_parts;
          double sum[8] = {};
          for (int i = 0; i < ctas; ++i)
            for (int k = 0; k < 8; ++k) sum[k] += double(hb[i * 8 + k]) / ctas;
          fprintf(stderr, "LNQS_PROFILE dim %d ctas %d: total %.0f Await %.0f A %.0f Bsync %.0f Bmerge %.0f C %.0f Csync %.0f D %.0f (cycles, CTA mean)\n",
                  int(dim), ctas, sum[0], sum[1], sum[2], sum[3], sum[4], sum[5], sum[6], sum[7]);
        }
      }
#endif
      return launch_status();
    });
  });
}

}  // namespace td::kernels
