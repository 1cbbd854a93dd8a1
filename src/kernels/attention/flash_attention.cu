// Portable flash-attention forward (sm_80 and newer): the exact-attention
// fallback where cuDNN is absent or refuses a problem. BF16 Q/K/V/O, fp32
// accumulation, head_dim 64 or 128, any len_q / len_kv, any strides that are
// multiples of 8 elements, optional fp32 LSE.
//
// One CTA of 8 warps owns 128 query rows of one (batch, head); each warp owns
// 16 of them and keeps its Q fragments in registers for the whole pass. K and V
// stream through shared memory in tiles of 64 keys, kStages deep (cp.async,
// zero-filled past len_kv), so the next tiles load while the current one is
// multiplied. Per tile and warp:
//   S = Q·Kᵀ          mma.sync m16n8k16 bf16 -> fp32, K fragments by ldmatrix
//   online softmax    in the exp2 domain: scale·log2(e) folded into one FFMA,
//                     running max m and row sum l per row, O rescaled by 2^(m_old - m_new)
//   O += P·V          P rounded to bf16 straight from the S registers (the
//                     accumulator layout of S is the A-operand layout of P·V),
//                     V fragments by ldmatrix.trans
// Shared-memory rows are 16-byte chunks XOR-swizzled by (row & 7), so the
// 8-row ldmatrix reads and the cp.async writes hit distinct banks.
// At the end O is divided by l, staged through the warp's own (spent) Q rows in
// shared memory and written with 16-byte stores; LSE = (m + log2 l)·ln 2.
//
// The block-sparse variant (SLA's sparse branch, kSparse = true) is the same
// kernel walking only the key tiles its LUT row lists: query block i of 128
// rows visits tiles lut[b, h, i, 0 .. n_sel), each 64 keys, in LUT order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/attention/attention.h"

namespace td::kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockM = kWarps * 16;  // query rows per CTA
constexpr int kBlockN = 64;           // keys per K/V tile

struct FlashParams {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  __nv_bfloat16* o;
  float* lse;
  AttnStrides qs, ks, vs, os;
  int len_q, len_kv, heads;
  float scale_log2;  // softmax scale * log2(e)
  // Block-sparse mode only: int32 [batch, heads, lut_qblocks, n_sel] key-tile indices.
  const int32_t* lut;
  int n_sel, lut_qblocks;
};

template <int D, int kStages>
struct FlashTraits {
  static constexpr int kChunks = D / 8;                  // 16-byte chunks per row
  static constexpr int kQBytes = kBlockM * D * 2;
  static constexpr int kTileBytes = kBlockN * D * 2;     // one K or one V tile
  static constexpr int kStageBytes = 2 * kTileBytes;     // K then V
  static constexpr int kSmemBytes = kQBytes + kStages * kStageBytes;
  // Registers: 64 (O) + 32 (Q) + 32 (S) at D = 128 leave room for one CTA of
  // 256 threads per SM; at D = 64 two CTAs fit.
  static constexpr int kMinBlocks = D == 128 ? 1 : 2;
};

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile.
template <int kChunks>
__device__ __forceinline__ uint32_t swizzle(int row, int chunk) {
  return uint32_t(row * kChunks * 16 + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  // src-size 0 writes 16 zero bytes without reading: rows past the end of Q/K/V.
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a·b for one m16n8k16 tile: a = 4 regs of bf16 pairs, b = 2 regs, d = 4 fp32.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lower address, lower column) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Loads `kRows` rows of D bf16 (row r at src + r*row_stride) into a swizzled
// shared-memory tile, all 256 threads taking consecutive 16-byte chunks. Rows
// at or past `valid_rows` are zero-filled; their source address is clamped to
// row 0 so it stays inside the tensor.
template <int D, int kRows>
__device__ __forceinline__ void load_tile(uint32_t dst, const __nv_bfloat16* src, int64_t row_stride, int valid_rows,
                                          int tid) {
  constexpr int kChunks = D / 8;
  constexpr int kPerThread = kRows * kChunks / kThreads;
  static_assert(kRows * kChunks % kThreads == 0, "tile must split evenly over the CTA");
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = i * kThreads + tid;
    const int row = idx / kChunks, chunk = idx % kChunks;
    const bool valid = row < valid_rows;
    const __nv_bfloat16* g = src + (valid ? int64_t(row) * row_stride : 0) + chunk * 8;
    cp_async_16(dst + swizzle<kChunks>(row, chunk), g, valid);
  }
}

template <int D, int kStages, bool kSparse>
__global__ void __launch_bounds__(kThreads, FlashTraits<D, kStages>::kMinBlocks)
    flash_attention_fwd_kernel(const FlashParams p) {
  using T = FlashTraits<D, kStages>;
  constexpr int kChunks = T::kChunks;
  constexpr int kKSteps = D / 16;        // k-steps of Q·Kᵀ over head_dim
  constexpr int kSTiles = kBlockN / 8;   // n-tiles of S (8 keys each)
  constexpr int kPSteps = kBlockN / 16;  // k-steps of P·V over keys
  constexpr int kOTiles = D / 8;         // n-tiles of O (8 channels each)

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t smem_q = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t smem_kv = smem_q + T::kQBytes;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int q0 = blockIdx.x * kBlockM;
  const int h = blockIdx.y, b = blockIdx.z;

  const __nv_bfloat16* qg = p.q + int64_t(b) * p.qs.batch + int64_t(h) * p.qs.head + int64_t(q0) * p.qs.token;
  const __nv_bfloat16* kg = p.k + int64_t(b) * p.ks.batch + int64_t(h) * p.ks.head;
  const __nv_bfloat16* vg = p.v + int64_t(b) * p.vs.batch + int64_t(h) * p.vs.head;
  // Dense: tiles 0 .. n_tiles-1 in order. Sparse: the LUT row's tiles.
  const int32_t* lut_row =
      kSparse ? p.lut + ((int64_t(b) * p.heads + h) * p.lut_qblocks + blockIdx.x) * int64_t(p.n_sel) : nullptr;
  const int n_tiles = kSparse ? p.n_sel : (p.len_kv + kBlockN - 1) / kBlockN;
  auto tile_of = [&](int j) -> int { return kSparse ? __ldg(lut_row + j) : j; };

  // Prologue: Q with the first tile in group 0, then tiles 1 .. kStages-2.
  // Every stage commits a group, empty or not, so the wait counts below hold.
  load_tile<D, kBlockM>(smem_q, qg, p.qs.token, p.len_q - q0, tid);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) {
      const int tile = tile_of(s);
      const int valid = p.len_kv - tile * kBlockN;
      const uint32_t stage = smem_kv + s * T::kStageBytes;
      load_tile<D, kBlockN>(stage, kg + int64_t(tile) * kBlockN * p.ks.token, p.ks.token, valid, tid);
      load_tile<D, kBlockN>(stage + T::kTileBytes, vg + int64_t(tile) * kBlockN * p.vs.token, p.vs.token, valid,
                            tid);
    }
    cp_async_commit();
  }

  uint32_t qf[kKSteps][4];
  float o[kOTiles][4];
#pragma unroll
  for (int t = 0; t < kOTiles; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;
  // Running max (scaled, log2 domain) and this thread's part of the row sum, for
  // rows lane/4 and lane/4 + 8 of the warp's 16.
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  int stage_compute = 0, stage_load = kStages - 1;
  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<kStages - 2>();  // tile j (and Q) landed for this thread...
    __syncthreads();               // ...and for all; tile j-1's stage is free again

    if (j == 0) {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        const int row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int chunk = ks * 2 + (lane >> 4);
        ldmatrix_x4(qf[ks], smem_q + swizzle<kChunks>(row, chunk));
      }
    }

    {  // refill the stage freed by tile j-1 with tile j + kStages - 1
      const int jn = j + kStages - 1;
      if (jn < n_tiles) {
        const int tile = tile_of(jn);
        const int valid = p.len_kv - tile * kBlockN;
        const uint32_t stage = smem_kv + stage_load * T::kStageBytes;
        load_tile<D, kBlockN>(stage, kg + int64_t(tile) * kBlockN * p.ks.token, p.ks.token, valid, tid);
        load_tile<D, kBlockN>(stage + T::kTileBytes, vg + int64_t(tile) * kBlockN * p.vs.token, p.vs.token, valid,
                              tid);
      }
      cp_async_commit();
      stage_load = stage_load + 1 == kStages ? 0 : stage_load + 1;
    }

    const uint32_t sk = smem_kv + stage_compute * T::kStageBytes;
    const uint32_t sv = sk + T::kTileBytes;
    stage_compute = stage_compute + 1 == kStages ? 0 : stage_compute + 1;

    // S = Q·Kᵀ for the warp's 16 rows and the tile's 64 keys.
    float s[kSTiles][4];
#pragma unroll
    for (int t = 0; t < kSTiles; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        // matrices: keys +0..7 / channels +0..7, keys +0..7 / +8..15, keys +8..15 / +0..7, keys +8..15 / +8..15
        const int key = np * 16 + (lane >> 4) * 8 + (lane & 7);
        const int chunk = ks * 2 + ((lane >> 3) & 1);
        uint32_t kb[4];
        ldmatrix_x4(kb, sk + swizzle<kChunks>(key, chunk));
        mma_bf16(s[2 * np], qf[ks], kb[0], kb[1]);
        mma_bf16(s[2 * np + 1], qf[ks], kb[2], kb[3]);
      }
    }

    // Keys past len_kv (zero rows in shared memory) get no weight: last tile only.
    const int tile_j = tile_of(j);
    if ((tile_j + 1) * kBlockN > p.len_kv) {
      const int valid = p.len_kv - tile_j * kBlockN;
#pragma unroll
      for (int t = 0; t < kSTiles; ++t) {
        const int key = t * 8 + (lane & 3) * 2;
        if (key >= valid) s[t][0] = s[t][2] = -INFINITY;
        if (key + 1 >= valid) s[t][1] = s[t][3] = -INFINITY;
      }
    }

    // Online softmax. Every tile holds at least one valid key, so the new max is finite.
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int t = 0; t < kSTiles; ++t) {
      mx0 = fmaxf(mx0, fmaxf(s[t][0], s[t][1]));
      mx1 = fmaxf(mx1, fmaxf(s[t][2], s[t][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float m0_new = fmaxf(m0, mx0 * p.scale_log2);
    const float m1_new = fmaxf(m1, mx1 * p.scale_log2);
    const float alpha0 = fast_exp2(m0 - m0_new);  // 0 on the first tile (m = -inf)
    const float alpha1 = fast_exp2(m1 - m1_new);
    m0 = m0_new;
    m1 = m1_new;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int t = 0; t < kSTiles; ++t) {
      s[t][0] = fast_exp2(fmaf(s[t][0], p.scale_log2, -m0));
      s[t][1] = fast_exp2(fmaf(s[t][1], p.scale_log2, -m0));
      s[t][2] = fast_exp2(fmaf(s[t][2], p.scale_log2, -m1));
      s[t][3] = fast_exp2(fmaf(s[t][3], p.scale_log2, -m1));
      sum0 += s[t][0] + s[t][1];
      sum1 += s[t][2] + s[t][3];
    }
    l0 = l0 * alpha0 + sum0;
    l1 = l1 * alpha1 + sum1;
#pragma unroll
    for (int t = 0; t < kOTiles; ++t) {
      o[t][0] *= alpha0;
      o[t][1] *= alpha0;
      o[t][2] *= alpha1;
      o[t][3] *= alpha1;
    }

    // O += P·V. The S accumulators of n-tiles 2kk and 2kk+1 are exactly the
    // A fragment of keys 16kk .. 16kk+15.
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      uint32_t pa[4];
      pa[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < kOTiles / 2; ++dp) {
        // matrices (transposed): keys +0..7 / channels +0..7, keys +8..15 / +0..7, keys +0..7 / +8..15, keys +8..15 / +8..15
        const int key = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
        const int chunk = dp * 2 + (lane >> 4);
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, sv + swizzle<kChunks>(key, chunk));
        mma_bf16(o[2 * dp], pa, vb[0], vb[1]);
        mma_bf16(o[2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the CTA exits

  // Complete the row sums across the 4 lanes that share a row, normalise.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;

  // Stage the warp's 16x D output tile in its own Q rows (read only by this
  // warp, at j == 0), then write 16-byte chunks of whole rows.
  const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
  __syncwarp();
#pragma unroll
  for (int t = 0; t < kOTiles; ++t) {
    const uint32_t col_bytes = uint32_t((lane & 3) * 4);
    const uint32_t w0 = pack_bf16(o[t][0] * inv0, o[t][1] * inv0);
    const uint32_t w1 = pack_bf16(o[t][2] * inv1, o[t][3] * inv1);
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(smem_q + swizzle<kChunks>(r0, t) + col_bytes), "r"(w0) : "memory");
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(smem_q + swizzle<kChunks>(r1, t) + col_bytes), "r"(w1) : "memory");
  }
  __syncwarp();
  __nv_bfloat16* og = p.o + int64_t(b) * p.os.batch + int64_t(h) * p.os.head;
#pragma unroll
  for (int i = 0; i < 16 * kChunks / 32; ++i) {
    const int idx = i * 32 + lane;
    const int r = idx / kChunks, chunk = idx % kChunks;
    const int row = q0 + warp * 16 + r;
    if (row < p.len_q) {
      uint4 val;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                   : "r"(smem_q + swizzle<kChunks>(warp * 16 + r, chunk)));
      *reinterpret_cast<uint4*>(og + int64_t(row) * p.os.token + chunk * 8) = val;
    }
  }

  if (p.lse != nullptr && (lane & 3) == 0) {
    constexpr float kLn2 = 0.69314718055994531f;
    float* lse = p.lse + (int64_t(b) * p.heads + h) * p.len_q;
    const int row0 = q0 + r0, row1 = q0 + r1;
    if (row0 < p.len_q) lse[row0] = (m0 + __log2f(l0)) * kLn2;
    if (row1 < p.len_q) lse[row1] = (m1 + __log2f(l1)) * kLn2;
  }
}

template <int D, int kStages, bool kSparse>
Status launch(const FlashParams& params, int64_t batch, int64_t heads, int64_t len_q, cudaStream_t stream) {
  auto kernel = flash_attention_fwd_kernel<D, kStages, kSparse>;
  constexpr int smem = FlashTraits<D, kStages>::kSmemBytes;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess)
    return detail::attn_fail(Status::LaunchFailed, std::string("attention_flash_cuda: cannot raise shared memory to ") +
                                                       std::to_string(smem) + " bytes: " + cudaGetErrorString(e));
  const dim3 grid(unsigned((len_q + kBlockM - 1) / kBlockM), unsigned(heads), unsigned(batch));
  kernel<<<grid, kThreads, smem, stream>>>(params);
  e = cudaGetLastError();
  if (e != cudaSuccess)
    return detail::attn_fail(Status::LaunchFailed,
                             std::string("attention_flash_cuda: launch failed: ") + cudaGetErrorString(e));
  return Status::Ok;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

Status attention_flash_supports(const AttnProblem& p) {
  using detail::attn_fail;
  if (Status s = attention_check(p); s != Status::Ok) return s;
  if (p.qkv_type != ElemType::BF16 || p.o_type != ElemType::BF16)
    return attn_fail(Status::Unsupported, "attention_flash_cuda: takes bf16 Q/K/V and O only");
  if (p.head_dim != 64 && p.head_dim != 128)
    return attn_fail(Status::Unsupported, "attention_flash_cuda: head_dim must be 64 or 128, got " +
                                              std::to_string(p.head_dim));
  const std::pair<const char*, const AttnStrides*> all[] = {{"Q", &p.q}, {"K", &p.k}, {"V", &p.v}, {"O", &p.o}};
  for (const auto& [name, s] : all)
    if (s->batch % 8 || s->head % 8 || s->token % 8)
      return attn_fail(Status::Unsupported, std::string("attention_flash_cuda: ") + name +
                                                " strides must be multiples of 8 elements (16-byte rows), got batch " +
                                                std::to_string(s->batch) + ", head " + std::to_string(s->head) +
                                                ", token " + std::to_string(s->token));
  if (p.len_q > (int64_t(1) << 31) - kBlockM || p.len_kv > (int64_t(1) << 31) - kBlockN || p.heads > 65535 ||
      p.batch > 65535)
    return attn_fail(Status::Unsupported, "attention_flash_cuda: len_q/len_kv must be < 2^31 and batch/heads <= 65535, got len_q " +
                                              std::to_string(p.len_q) + ", len_kv " + std::to_string(p.len_kv) +
                                              ", batch " + std::to_string(p.batch) + ", heads " + std::to_string(p.heads));
  detail::attn_clear_error();
  return Status::Ok;
}

namespace {

// The dense and the block-sparse entry points after their own checks.
Status flash_run(const char* name, const AttnProblem& p, const void* q, const void* k, const void* v, void* o,
                 float* lse, const int32_t* lut, int64_t n_sel, void* stream) {
  using detail::attn_fail;
  if (!q || !k || !v || !o)
    return attn_fail(Status::InvalidArgument, std::string(name) + ": null pointer for " +
                                                  (!q ? "Q" : !k ? "K" : !v ? "V" : "O"));
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(o))
    return attn_fail(Status::Unsupported, std::string(name) + ": " +
                                              (!aligned16(q) ? "Q" : !aligned16(k) ? "K" : !aligned16(v) ? "V" : "O") +
                                              " is not 16-byte aligned");
  int device = 0, cc_major = 0, smem_optin = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (cc_major < 8)
    return attn_fail(Status::Unsupported, std::string(name) + ": needs compute capability 8.0 or newer, device " +
                                              std::to_string(device) + " has " + std::to_string(cc_major) + ".x");

  FlashParams params;
  params.q = static_cast<const __nv_bfloat16*>(q);
  params.k = static_cast<const __nv_bfloat16*>(k);
  params.v = static_cast<const __nv_bfloat16*>(v);
  params.o = static_cast<__nv_bfloat16*>(o);
  params.lse = lse;
  params.qs = p.q;
  params.ks = p.k;
  params.vs = p.v;
  params.os = p.o;
  params.len_q = int(p.len_q);
  params.len_kv = int(p.len_kv);
  params.heads = int(p.heads);
  params.scale_log2 = float(double(p.scale) * 1.4426950408889634);
  params.lut = lut;
  params.n_sel = int(n_sel);
  params.lut_qblocks = int((p.len_q + kBlockM - 1) / kBlockM);
  const auto st = static_cast<cudaStream_t>(stream);

  // Three K/V stages where the SM's shared memory allows (A100, Hopper); two on
  // the ~100 KB parts (sm_86/89/120) at head_dim 128.
  if (lut) {
    if (p.head_dim == 64) return launch<64, 3, true>(params, p.batch, p.heads, p.len_q, st);
    if (smem_optin >= FlashTraits<128, 3>::kSmemBytes) return launch<128, 3, true>(params, p.batch, p.heads, p.len_q, st);
    if (smem_optin >= FlashTraits<128, 2>::kSmemBytes) return launch<128, 2, true>(params, p.batch, p.heads, p.len_q, st);
  } else {
    if (p.head_dim == 64) return launch<64, 3, false>(params, p.batch, p.heads, p.len_q, st);
    if (smem_optin >= FlashTraits<128, 3>::kSmemBytes) return launch<128, 3, false>(params, p.batch, p.heads, p.len_q, st);
    if (smem_optin >= FlashTraits<128, 2>::kSmemBytes) return launch<128, 2, false>(params, p.batch, p.heads, p.len_q, st);
  }
  return attn_fail(Status::Unsupported, std::string(name) + ": head_dim 128 needs " +
                                            std::to_string(FlashTraits<128, 2>::kSmemBytes) +
                                            " bytes of shared memory per block, device " + std::to_string(device) +
                                            " allows " + std::to_string(smem_optin));
}

}  // namespace

Status attention_flash_cuda(const AttnProblem& p, const void* q, const void* k, const void* v, void* o, float* lse,
                            void* stream) {
  if (Status s = attention_flash_supports(p); s != Status::Ok) return s;
  return flash_run("attention_flash_cuda", p, q, k, v, o, lse, nullptr, 0, stream);
}

Status attention_flash_block_sparse_cuda(const AttnProblem& p, const void* q, const void* k, const void* v, void* o,
                                         float* lse, const int32_t* lut, int64_t n_sel, void* stream) {
  using detail::attn_fail;
  if (Status s = attention_flash_supports(p); s != Status::Ok) return s;
  const int64_t kb = (p.len_kv + kBlockN - 1) / kBlockN;
  if (!lut) return attn_fail(Status::InvalidArgument, "attention_flash_block_sparse_cuda: null LUT");
  if (n_sel < 1 || n_sel > kb)
    return attn_fail(Status::InvalidArgument, "attention_flash_block_sparse_cuda: n_sel must be in [1, " +
                                                  std::to_string(kb) + "] key blocks of 64, got " +
                                                  std::to_string(n_sel));
  return flash_run("attention_flash_block_sparse_cuda", p, q, k, v, o, lse, lut, n_sel, stream);
}

}  // namespace td::kernels
