// SLA block selection on the GPU (kernels/sla/sla.h): three small kernels.
//
//   1. block_pool:  one CTA per (block index, head, batch), one thread per
//      channel: the mean of the query block's tokens (pooled Q) and the sum of
//      the key block's tokens (raw K block sums), fp32, a partial last block
//      over the tokens it has.
//   2. key_smooth:  one CTA per (head, batch): the K mean over all tokens from
//      the block sums, summed in block order (deterministic), then pooled
//      smoothed K = block sum / tokens in block - mean (the reference's
//      mean of (k - mean), rearranged).
//   3. topk:        one CTA per (query block, head, batch): the pooled scores
//      against every key block (a warp per key block, fp32), each packed with
//      its index into a 64-bit key that sorts by descending score, then by
//      ascending index (the reference's tie rule; -0 counts as +0), a bitonic
//      sort in shared memory, the first n_sel indices into the LUT and the map.
// The work is tiny next to the attention itself (QB·KB·D MACs per head).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/sla/sla.h"

namespace td::kernels {
namespace {

constexpr int kTopkThreads = 256;
constexpr int64_t kMaxKeyBlocks = 16384;  // 128 KiB of sort keys in shared memory

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

struct PoolParams {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  AttnStrides qs, ks;
  int heads, len, dim, block_q, block_k, qblocks, kblocks;
  float* pq;  // [B, H, QB, D] pooled Q (means)
  float* pk;  // [B, H, KB, D] K block sums, then pooled smoothed K
};

__global__ void block_pool_kernel(const PoolParams p) {
  const int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z, c = threadIdx.x;
  if (c >= p.dim) return;
  const int64_t bh = int64_t(b) * p.heads + h;
  if (blk < p.qblocks) {
    const int t0 = blk * p.block_q, t1 = min(p.len, t0 + p.block_q);
    const __nv_bfloat16* src = p.q + int64_t(b) * p.qs.batch + int64_t(h) * p.qs.head + c;
    float acc = 0.f;
    for (int t = t0; t < t1; ++t) acc += __bfloat162float(src[int64_t(t) * p.qs.token]);
    p.pq[(bh * p.qblocks + blk) * p.dim + c] = acc / float(t1 - t0);
  }
  if (blk < p.kblocks) {
    const int t0 = blk * p.block_k, t1 = min(p.len, t0 + p.block_k);
    const __nv_bfloat16* src = p.k + int64_t(b) * p.ks.batch + int64_t(h) * p.ks.head + c;
    float acc = 0.f;
    for (int t = t0; t < t1; ++t) acc += __bfloat162float(src[int64_t(t) * p.ks.token]);
    p.pk[(bh * p.kblocks + blk) * p.dim + c] = acc;
  }
}

__global__ void key_smooth_kernel(const PoolParams p) {
  const int h = blockIdx.x, b = blockIdx.y, c = threadIdx.x;
  if (c >= p.dim) return;
  float* pk = p.pk + (int64_t(b) * p.heads + h) * p.kblocks * p.dim + c;
  float sum = 0.f;
  for (int j = 0; j < p.kblocks; ++j) sum += pk[int64_t(j) * p.dim];
  const float mean = sum / float(p.len);
  for (int j = 0; j < p.kblocks; ++j) {
    const int n = min(p.len, (j + 1) * p.block_k) - j * p.block_k;
    pk[int64_t(j) * p.dim] = pk[int64_t(j) * p.dim] / float(n) - mean;
  }
}

struct TopkParams {
  const float* pq;
  const float* pk;
  int heads, dim, qblocks, kblocks, sort_size, n_sel;
  int32_t* lut;       // [B, H, QB, n_sel] or null
  uint8_t* map;       // [B, H, QB, KB] or null
};

// Float -> uint32 whose unsigned order is the float order (+0 for -0).
__device__ __forceinline__ uint32_t ordered_bits(float s) {
  uint32_t u = s == 0.f ? 0u : __float_as_uint(s);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kTopkThreads) topk_kernel(const TopkParams p) {
  extern __shared__ unsigned long long keys[];
  float* pq = reinterpret_cast<float*>(keys + p.sort_size);
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t bh = int64_t(b) * p.heads + h;
  for (int c = tid; c < p.dim; c += kTopkThreads) pq[c] = p.pq[(bh * p.qblocks + i) * p.dim + c];
  __syncthreads();
  const float* pk = p.pk + bh * p.kblocks * p.dim;
  for (int j = warp; j < p.sort_size; j += kTopkThreads / 32) {
    if (j < p.kblocks) {
      const float* row = pk + int64_t(j) * p.dim;
      float s = 0.f;
      for (int c = lane; c < p.dim; c += 32) s = fmaf(pq[c], row[c], s);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      // Descending score first, then ascending block index.
      if (lane == 0) keys[j] = (uint64_t(~ordered_bits(s)) << 32) | uint32_t(j);
    } else if (lane == 0) {
      keys[j] = ~0ull;  // padding sorts last
    }
  }
  __syncthreads();
  for (int k = 2; k <= p.sort_size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int x = tid; x < p.sort_size; x += kTopkThreads) {
        const int y = x ^ j;
        if (y > x) {
          const unsigned long long a = keys[x], c = keys[y];
          const bool ascending = (x & k) == 0;
          if ((a > c) == ascending) {
            keys[x] = c;
            keys[y] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  const int64_t row = bh * p.qblocks + i;
  if (p.lut)
    for (int s = tid; s < p.n_sel; s += kTopkThreads) p.lut[row * p.n_sel + s] = int32_t(uint32_t(keys[s]));
  if (p.map) {
    uint8_t* m = p.map + row * p.kblocks;
    for (int j = tid; j < p.kblocks; j += kTopkThreads) m[j] = 0;
    __syncthreads();
    for (int s = tid; s < p.n_sel; s += kTopkThreads) m[uint32_t(keys[s])] = 1;
  }
}

Status launch_error(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::Ok;
  return detail::sla_fail(Status::LaunchFailed, std::string("sla_block_select_cuda: ") + what +
                                                    " launch failed: " + cudaGetErrorString(e));
}

}  // namespace

size_t sla_block_select_workspace_size(const SlaProblem& p) {
  const size_t bh = size_t(p.batch * p.heads), d = size_t(p.head_dim);
  return align256(bh * size_t(p.query_blocks()) * d * 4) + align256(bh * size_t(p.key_blocks()) * d * 4);
}

Status sla_block_select_cuda(const SlaProblem& p, const void* q, const void* k, uint8_t* block_map, int32_t* lut,
                             void* workspace, size_t workspace_bytes, void* stream) {
  using detail::sla_fail;
  if (Status s = sla_check(p); s != Status::Ok) return s;
  if (!q || !k) return sla_fail(Status::InvalidArgument, "sla_block_select_cuda: null Q or K");
  if (p.head_dim > 256)
    return sla_fail(Status::Unsupported,
                    "sla_block_select_cuda: head_dim must be <= 256, got " + std::to_string(p.head_dim));
  const int64_t QB = p.query_blocks(), KB = p.key_blocks();
  if (KB > kMaxKeyBlocks)
    return sla_fail(Status::Unsupported, "sla_block_select_cuda: at most " + std::to_string(kMaxKeyBlocks) +
                                             " key blocks, got " + std::to_string(KB));
  if (p.len > (int64_t(1) << 30) || p.heads > 65535 || p.batch > 65535 || QB > (int64_t(1) << 30))
    return sla_fail(Status::Unsupported, "sla_block_select_cuda: len must be < 2^30 and batch, heads <= 65535");
  const size_t need = sla_block_select_workspace_size(p);
  if (workspace_bytes < need || !workspace)
    return sla_fail(Status::InvalidArgument, "sla_block_select_cuda: workspace of " + std::to_string(need) +
                                                 " bytes needed, got " + std::to_string(workspace_bytes));
  if (!lut && !block_map) return Status::Ok;
  const auto st = static_cast<cudaStream_t>(stream);
  const size_t bh = size_t(p.batch * p.heads), d = size_t(p.head_dim);

  PoolParams pp;
  pp.q = static_cast<const __nv_bfloat16*>(q);
  pp.k = static_cast<const __nv_bfloat16*>(k);
  pp.qs = p.q;
  pp.ks = p.k;
  pp.heads = int(p.heads);
  pp.len = int(p.len);
  pp.dim = int(p.head_dim);
  // A block larger than the sequence is one (partial) block: clamp, so int holds it.
  pp.block_q = int(p.block_q > p.len ? p.len : p.block_q);
  pp.block_k = int(p.block_k > p.len ? p.len : p.block_k);
  pp.qblocks = int(QB);
  pp.kblocks = int(KB);
  pp.pq = static_cast<float*>(workspace);
  pp.pk = reinterpret_cast<float*>(static_cast<char*>(workspace) + align256(bh * size_t(QB) * d * 4));
  const unsigned threads = unsigned((p.head_dim + 31) / 32 * 32);
  block_pool_kernel<<<dim3(unsigned(QB > KB ? QB : KB), unsigned(p.heads), unsigned(p.batch)), threads, 0, st>>>(pp);
  if (Status s = launch_error("block_pool"); s != Status::Ok) return s;
  key_smooth_kernel<<<dim3(unsigned(p.heads), unsigned(p.batch)), threads, 0, st>>>(pp);
  if (Status s = launch_error("key_smooth"); s != Status::Ok) return s;

  TopkParams tp;
  tp.pq = pp.pq;
  tp.pk = pp.pk;
  tp.heads = int(p.heads);
  tp.dim = int(p.head_dim);
  tp.qblocks = int(QB);
  tp.kblocks = int(KB);
  int sort_size = 1;
  while (sort_size < KB) sort_size <<= 1;
  tp.sort_size = sort_size;
  tp.n_sel = int(sla_selected_blocks(p.topk, KB));
  tp.lut = lut;
  tp.map = block_map;
  const size_t smem = size_t(sort_size) * 8 + d * 4;
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess)
      return sla_fail(Status::Unsupported, "sla_block_select_cuda: " + std::to_string(KB) + " key blocks need " +
                                               std::to_string(smem) + " bytes of shared memory: " +
                                               cudaGetErrorString(e));
  }
  topk_kernel<<<dim3(unsigned(QB), unsigned(p.heads), unsigned(p.batch)), kTopkThreads, smem, st>>>(tp);
  return launch_error("topk");
}

}  // namespace td::kernels
