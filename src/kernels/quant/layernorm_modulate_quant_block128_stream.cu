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
// col_parts CTAs, one per SM: CTA (h, k) owns rows [h*128/row_parts, ...) of
// the stripe and columns [k*slab_cols, ...) (whole 128-column blocks), its
// "slab". Per CTA: 16 consumer warps + 1 producer warp.
//  * producer (one lane): fills a ring of chunks (16 or 32 rows of the slab)
//    in shared memory with cp.async.bulk (one bulk copy per row, completion
//    counted in bytes on the chunk's mbarrier), as far ahead as the ring
//    allows. The ring holds >= 2 stripes' slabs where the chosen split allows
//    it (Wan: 1536 -> 1 x 4 CTAs, 384 columns, 4 chunks of 32 rows, 9 chunks
//    of 24 KB; 5120 -> 2 x 8 CTAs, 64 rows x 640 columns, 4 chunks of 16
//    rows, 10 chunks of 20 KB), so a whole stripe is in flight (80-96 KB per
//    SM, ~3x the ~30 KB per SM that 4 TB/s needs at ~1 us latency) while the
//    current one is processed: loads never wait for the phases below.
//  * consumers, per stripe:
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
//    D. codes: fma(n, (1 + scale) * inv, shift * inv) -> cvt.rni.sat.s8,
//       8-byte stores; each chunk is handed back to the producer when all
//       warps are done with it.
//    A stripe that straddles two samples (rows_per_batch not a multiple of
//    128) takes a slower per-row path in C and D (y = fma(n, 1 + scale[b],
//    shift[b]) per row, then y * inv: the reference's order).
//
// Prediction (H200, copy ~4.1 TB/s measured by the benches): the kernel is
// bound by instruction issue before HBM unless it stays under ~26 issued
// instructions per element (4.9 elements per SM-cycle at 93% of copy, 128
// lanes issued per SM-cycle). Count per element: A 4 (unpack, add, sub,
// fma), C 5 (unpack, sub, mul, 2 min/max), D 6.75 (unpack, sub, mul, fma,
// cvt, 3/4 prmt), 16-byte shared loads 3/8, stores 1/8, reductions and loop
// ~1.5: ~18, i.e. ~70% of the issue slots at 93% of copy, with no phase
// waiting for memory. Predicted 88-95% of copy at 32760x1536 and 85-93% at
// 75600x5120 (the 16-CTA cluster may leave a GPC's remainder of SMs idle:
// 8 clusters x 16 = 128 of 132 SMs), against 42% / 39% for the portable path.
// Registers: <= 120 (544 threads, 1 CTA per SM); shared memory <= 227 KB.
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
constexpr int kThreads = kConsumerWarps * 32;  // thread 0 also issues the loads (no producer warp: 17 warps
                                               // would cap registers at 96 per thread and spill)
constexpr int kMaxRing = 32;
constexpr int kMaxSlots = 3;                           // 8-element packs per lane per row iteration
constexpr int kMaxSlabPacks = 32 * kMaxSlots;          // with rows_per_warp 1
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
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
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
__device__ __forceinline__ bool mbar_try(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n\t.reg .pred p;\n\tmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(ok)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return ok != 0;
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
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
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
// Codes of 8 already scaled values (cvt.rni.sat.s8), packed by PRMT as quantize8_prmt.
__device__ __forceinline__ uint2 codes8(const float (&t)[8]) {
  uint32_t c[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) c[i] = uint32_t(cvt_rn_sat_s8(t[i]));
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


template <typename T, int KP, int RW>
__global__ void __launch_bounds__(kThreads, 1) ln_mod_quant_block128_stream_kernel(StreamArgs a) {
#ifdef TD_LNQS_SM90
  constexpr int kChunkRows = kConsumerWarps * RW;
  constexpr int kPackBytes = int(sizeof(Pack8<T>));
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ uint64_t full_bar[kMaxRing], empty_bar[kMaxRing], stats_bar[2], amax_bar[2];
  __shared__ float2 part[2][kQuantGroup];  // (local mean, local M2) per row of this CTA's part of the stripe
  __shared__ float row_mean[kQuantGroup], row_rstd[kQuantGroup];
  __shared__ uint32_t pack_amax[kConsumerWarps][kMaxSlabPacks];  // float bits of |y| maxima per warp and pack
  constexpr int kMaxSlabGroups = kMaxSlabPacks / 16;  // 128-column blocks of a slab
  __shared__ uint32_t group_amax[2][kMaxSlabGroups];
  __shared__ float group_inv[kMaxSlabGroups];

  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const uint32_t rank = cluster_rank();
  const int cc = a.col_parts;
  const int h = int(rank) / cc, kpart = int(rank) % cc;
  const int part_rows = kQuantGroup / a.row_parts;
  const int col0 = kpart * a.slab_cols;
  const int my_cols = max(0, min(a.dim - col0, a.slab_cols));
  const int my_packs = my_cols / 8;
  const int my_groups = (my_cols + kQuantGroup - 1) / kQuantGroup;
  const int group0 = kpart * ((a.slab_cols + kQuantGroup - 1) / kQuantGroup);
  const int pitch = a.slab_cols * int(sizeof(T));  // bytes of a slab row in shared memory
  const int chunk_bytes = kChunkRows * pitch;
  const int ring_chunks = a.ring_chunks;
  const int64_t first_stripe = cluster_id(), stripe_step = cluster_count();

  if (threadIdx.x == 0) {
    for (int i = 0; i < ring_chunks; ++i) mbar_init(&full_bar[i], 1), mbar_init(&empty_bar[i], kConsumerWarps);
    for (int i = 0; i < 2; ++i) mbar_init(&stats_bar[i], uint32_t(cc)), mbar_init(&amax_bar[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  for (int i = int(threadIdx.x); i < kConsumerWarps * kMaxSlabPacks; i += kThreads) (&pack_amax[0][0])[i] = 0u;
  __syncthreads();
  cluster_sync_all();  // every CTA's barriers exist before any remote arrive

  // ---- loads: thread 0 keeps the ring full between its own work (pump) ----
  // Chunk sequence number g_issue goes to ring slot g_issue % ring_chunks once
  // every warp has handed that slot back (empty barrier); the bytes land on
  // the slot's full barrier. Polled, never blocking: thread 0 calls it in
  // every wait loop and after each chunk it processes.
  // (The issue position lives in shared memory, not in registers: every
  // thread would otherwise carry thread 0's state.)
  __shared__ long long issue_stripe;
  __shared__ int issue_chunk, issue_rows;
  __shared__ uint32_t issue_g;
  auto part_rows_of = [&](int64_t s) {
    const int64_t left = a.rows - (s * kQuantGroup + int64_t(h) * part_rows);
    return left <= 0 ? 0 : (left < part_rows ? int(left) : part_rows);
  };
  auto pump = [&]() {
    int64_t stripe = issue_stripe;
    int chunk = issue_chunk, rows_here = issue_rows;
    uint32_t gi = issue_g;
    while (stripe < a.stripes) {
      if (chunk * kChunkRows >= rows_here) {
        stripe += stripe_step;
        chunk = 0;
        rows_here = stripe < a.stripes ? part_rows_of(stripe) : 0;
        continue;
      }
      const int slot = int(gi % uint32_t(ring_chunks));
      if (!mbar_try(&empty_bar[slot], ((gi / uint32_t(ring_chunks)) & 1u) ^ 1u)) break;
      const int crows = min(kChunkRows, rows_here - chunk * kChunkRows);
      const uint32_t row_bytes = uint32_t(my_cols) * uint32_t(sizeof(T));
      mbar_arrive_expect_tx(&full_bar[slot], uint32_t(crows) * row_bytes);
      if (row_bytes > 0) {
        unsigned char* dst = ring + size_t(slot) * size_t(chunk_bytes);
        const T* src = static_cast<const T*>(a.x) +
                       (stripe * kQuantGroup + int64_t(h) * part_rows + int64_t(chunk) * kChunkRows) * a.ld_x + col0;
        for (int i = 0; i < crows; ++i) bulk_copy_g2s(dst + i * pitch, src + i * a.ld_x, row_bytes, &full_bar[slot]);
      }
      ++chunk;
      ++gi;
    }
    issue_stripe = stripe, issue_chunk = chunk, issue_rows = rows_here, issue_g = gi;
  };
  if (threadIdx.x == 0) {
    issue_stripe = first_stripe, issue_chunk = 0, issue_g = 0;
    issue_rows = first_stripe < a.stripes ? part_rows_of(first_stripe) : 0;
  }
  const bool is_pump = threadIdx.x == 0;
  if (is_pump) pump();
  {
    // ---- consumers ----
    // Lane geometry: slot kk of this lane is flat pack f = lane + 32 kk of
    // the warp's RW rows (row f / slab_packs, pack f % slab_packs): the same
    // columns in every row iteration.
    const int slab_packs = a.slab_cols / 8;
    int slot_pack[KP], slot_row[KP];
    bool slot_ok[KP];
#pragma unroll
    for (int kk = 0; kk < KP; ++kk) {
      const int f = lane + 32 * kk;
      slot_row[kk] = RW == 1 ? 0 : f / slab_packs;
      slot_pack[kk] = f % slab_packs;
      slot_ok[kk] = f < RW * slab_packs && slot_pack[kk] < my_packs;
    }
    const float inv_cols = my_cols > 0 ? 1.f / float(my_cols) : 0.f;
    uint32_t g = 0;
    int it = 0;
    for (int64_t s = first_stripe; s < a.stripes; s += stripe_step, ++it) {
      const int par = it & 1;
      const uint32_t par_phase = uint32_t(it >> 1) & 1u;
      const int64_t r0 = s * kQuantGroup + int64_t(h) * part_rows;
      const int64_t left = a.rows - r0;
      const int nrows = left <= 0 ? 0 : (left < part_rows ? int(left) : part_rows);
      const int nchunks = (nrows + kChunkRows - 1) / kChunkRows;

      // A. local statistics of this warp's rows.
      for (int c = 0; c < nchunks; ++c) {
        const uint32_t gc = g + uint32_t(c);
        const int slot = int(gc % uint32_t(ring_chunks));
        while (!mbar_try(&full_bar[slot], (gc / uint32_t(ring_chunks)) & 1u))
          if (is_pump) pump();
        const int rbase = c * kChunkRows + warp * RW;
        const unsigned char* buf = ring + size_t(slot) * size_t(chunk_bytes) + size_t(warp * RW) * size_t(pitch);
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
        float q0 = 0.f, q1 = 0.f;
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
            q0 += t;
          else
            q1 += t;
        }
        q0 = warp_sum(q0);
        if (RW == 2) q1 = warp_sum(q1);
        if (lane == 0) {
          if (rbase < nrows) part[par][rbase] = make_float2(m0, q0);
          if (RW == 2 && rbase + 1 < nrows) part[par][rbase + 1] = make_float2(m1, q1);
        }
        if (is_pump) pump();
      }

      // B. merge the column parts' partials of each row (DSMEM).
      consumers_sync();  // this CTA's partials are written
      if (threadIdx.x == 0) {
        fence_cluster();
        for (int k = 0; k < cc; ++k) mbar_arrive_remote(&stats_bar[par], uint32_t(h * cc + k));
      }
      while (!mbar_try_cluster(&stats_bar[par], par_phase))
        if (is_pump) pump();
      {
        const int rows_per_round = 32 / cc;
        const int nq = (part_rows / kChunkRows) * RW;  // rows of this warp in the stripe part
        const int k = lane % cc;
        const float nk = float(max(0, min(a.dim - k * a.slab_cols, a.slab_cols)));
        for (int q0i = 0; q0i < nq; q0i += rows_per_round) {
          const int qi = q0i + lane / cc;
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
        for (int c = 0; c < nchunks; ++c) {
          const int slot = int((g + uint32_t(c)) % uint32_t(ring_chunks));
          const int rbase = c * kChunkRows + warp * RW;
          const unsigned char* buf = ring + size_t(slot) * size_t(chunk_bytes) + size_t(warp * RW) * size_t(pitch);
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
          if (is_pump) pump();
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
          const int slot = int((g + uint32_t(c)) % uint32_t(ring_chunks));
          const int rbase = c * kChunkRows + warp * RW;
          const unsigned char* buf = ring + size_t(slot) * size_t(chunk_bytes) + size_t(warp * RW) * size_t(pitch);
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
          if (is_pump) pump();
        }
      }
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
        const uint32_t peer = uint32_t((1 - h) * cc + kpart);
        if (threadIdx.x == 0) {
          fence_cluster();
          mbar_arrive_remote(&amax_bar[par], peer);
        }
        while (!mbar_try_cluster(&amax_bar[par], par_phase))
          if (is_pump) pump();
      }
      if (int(threadIdx.x) < my_groups) {
        uint32_t m = group_amax[par][threadIdx.x];
        if (a.row_parts == 2) m = max(m, ld_remote_u32(&group_amax[par][threadIdx.x], uint32_t((1 - h) * cc + kpart)));
        const QuantParams qp = block128_params_dev(__uint_as_float(m));
        group_inv[threadIdx.x] = qp.inv;
        if (h == 0) a.scales[s * a.groups + group0 + int(threadIdx.x)] = qp.scale;
      }
      consumers_sync();  // group_inv complete

      // D. codes.
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
        for (int c = 0; c < nchunks; ++c) {
          const int slot = int((g + uint32_t(c)) % uint32_t(ring_chunks));
          const int rbase = c * kChunkRows + warp * RW;
          const unsigned char* buf = ring + size_t(slot) * size_t(chunk_bytes) + size_t(warp * RW) * size_t(pitch);
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
          __syncwarp();
          if (lane == 0) mbar_arrive(&empty_bar[slot]);
          if (is_pump) pump();
        }
      } else {
        for (int c = 0; c < nchunks; ++c) {
          const int slot = int((g + uint32_t(c)) % uint32_t(ring_chunks));
          const int rbase = c * kChunkRows + warp * RW;
          const unsigned char* buf = ring + size_t(slot) * size_t(chunk_bytes) + size_t(warp * RW) * size_t(pitch);
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
          __syncwarp();
          if (lane == 0) mbar_arrive(&empty_bar[slot]);
          if (is_pump) pump();
        }
      }
      g += uint32_t(nchunks);
    }
  }
  __syncwarp();
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
    for (int cp : {1, 2, 4, 8, 16}) {
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
    for (int i = 0; i < n; ++i) {
      const int clusters = resident_clusters<T>(plans[i]);
      if (clusters >= 1) {
        best = plans[i];
        pub = LnQuantStreamPlan{best.row_parts, best.col_parts, best.slab_cols, best.rows_per_warp,
                                best.slots,     best.ring_chunks, clusters};
        break;
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
      return launch_status();
    });
  });
}

}  // namespace td::kernels
