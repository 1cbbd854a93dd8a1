// CUDA fused q/k RMSNorm (over the full dim) + Wan 3-D RoPE.
//
// Design: one CTA per token row, grid.y = 2 (q and k in one launch). The row
// (dim = heads * head_dim) is spread over the CTA as 8-element packs (pack p
// to thread p % threads; plan_row: 64 threads x 3 packs for 1536, 160 x 4 for
// 5120), all 16-byte loads issued first and kept in registers; one reduction
// (warp shuffles + one shared-memory exchange) gives sum(x^2); then each pack
// is scaled by rstd and its 8 fp32 weights (read through L1), and its 4
// interleaved pairs rotated with cos/sin looked up in the three small
// per-axis tables (a few KB to ~25 KB in all: L1/L2-resident, read with
// __ldg). head_dim is a multiple of 8, so a pack never straddles two heads and
// its 16-byte store is contiguous in both output layouts (BHLD: each head's
// 256-byte run of a token). One read and one write of each tensor.
//
// Traffic: (2 + 2) bytes per element (bf16 in, bf16 out), q and k.
// Predicted (bytes / 4.0 TB/s):
//   L 32760 x dim 1536 (Wan 1.3B 480p): 402.6 MB -> 101 us;
//   L 75600 x dim 5120 (Wan 14B 720p): 3096.6 MB -> 774 us.
#include <cstdlib>
#include <cstring>

#include "kernels/quant/quant_device.cuh"
#include "kernels/rope/qk_norm_rope.h"

namespace td::kernels {
namespace {

using namespace qdev;

struct RopeArgs {
  const void* in[2];
  int64_t ld_in[2];
  const float* weight[2];
  void* out[2];
  int64_t L, plane, height, width;
  int heads, head_dim, dim;
  float eps;
  bool bhld;
  const float* tables;
  int pairs_t, pairs_h, pairs_w;
  int64_t cos_t, sin_t, cos_h, sin_h, cos_w, sin_w;
  int64_t rows;  // batch * L
};

template <typename Tin, typename Tout, int V>
__global__ void __launch_bounds__(kMaxRowThreads) qk_norm_rope_kernel(RopeArgs a) {
  __shared__ float red[kMaxRowThreads / 32];
  const int which = int(blockIdx.y);
  const int t = int(threadIdx.x), threads = int(blockDim.x);
  const int64_t r = blockIdx.x;
  const int packs = a.dim / 8;
  const Tin* row = static_cast<const Tin*>(a.in[which]) + r * a.ld_in[which];

  Pack8<Tin> raw[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int p = t + j * threads;
    raw[j] = p < packs ? load_pack(row + p * 8) : zero_pack<Tin>();
  }
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float f[8];
    unpack(raw[j], f);  // invalid packs are zeros
#pragma unroll
    for (int i = 0; i < 8; ++i) ss = fmaf(f[i], f[i], ss);
  }
  ss = group_sum(ss, red, 0, threads, 0);
  const float rstd = __fdiv_rn(1.f, __fsqrt_rn(ss / float(a.dim) + a.eps));

  const int64_t b = r / a.L, l = r - b * a.L;
  const int64_t pos_t = l / a.plane, pos_h = (l / a.width) % a.height, pos_w = l % a.width;
  const float* weight = a.weight[which];
  Tout* out = static_cast<Tout*>(a.out[which]);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int p = t + j * threads;
    if (p >= packs) continue;
    const int col = p * 8, h = col / a.head_dim, c = col - h * a.head_dim;
    float y[8], w[8];
    unpack(raw[j], y);
    load_params8(weight + col, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = y[i] * rstd * w[i];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int pair = c / 2 + k;
      int64_t ci, si;
      if (pair < a.pairs_t) {
        ci = a.cos_t + pos_t * a.pairs_t + pair, si = a.sin_t + pos_t * a.pairs_t + pair;
      } else if (pair < a.pairs_t + a.pairs_h) {
        const int jj = pair - a.pairs_t;
        ci = a.cos_h + pos_h * a.pairs_h + jj, si = a.sin_h + pos_h * a.pairs_h + jj;
      } else {
        const int jj = pair - a.pairs_t - a.pairs_h;
        ci = a.cos_w + pos_w * a.pairs_w + jj, si = a.sin_w + pos_w * a.pairs_w + jj;
      }
      const float cs = __ldg(a.tables + ci), sn = __ldg(a.tables + si);
      const float re = y[2 * k], im = y[2 * k + 1];
      y[2 * k] = re * cs - im * sn;
      y[2 * k + 1] = re * sn + im * cs;
    }
    const int64_t dst = a.bhld ? ((b * a.heads + h) * a.L + l) * a.head_dim + c : r * a.dim + col;
    store_values(out + dst, y, 8, true);
  }
}

// QkRopeKernel::SharedAngles (variant beside the kernel above; same
// arithmetic on the same fp32 table values, so the same results). Every head
// of a token has the same (t, h, w) position, so the head_dim / 2 (cos, sin)
// pairs a token needs are gathered once per CTA into shared memory (one
// float2 per pair, head_dim * 4 bytes: 512 B for head_dim 128) while the
// row's loads are in flight, and each pack reads its 4 pairs as two 16-byte
// shared loads instead of 8 scattered 4-byte __ldg with a 3-way branch per
// pair. The position decode uses 32-bit divisions (rows < 2^31 is checked),
// once per thread instead of four 64-bit ones (~70 instructions each).
// Predicted: the table lookups (8 L1 requests spanning ~4 sectors each per
// 8-element pack, vs 1 request for the pack's data) and the 64-bit divisions
// were the non-memory cost; without them the kernel should approach the
// norm kernels' ~90% of copy bandwidth (was 50-53%).
//
// kWarpRows (QkRopeKernel::SharedAnglesWarpRows): the same kernel with one
// warp per row and kWarpRowsPerCta independent rows per CTA (rows of up to
// 256 packs, V = packs / 32 per lane): the sum of squares is one shuffle
// tree, no shared-memory exchange or CTA barrier, and each warp gathers its
// own token's angles. (For issue 3's bar at 1536 columns, where the
// one-CTA-per-row kernel measured 88-89% of a same-traffic copy in BHLD.)
constexpr int kWarpRowsPerCta = 4;

template <typename Tin, typename Tout, int V, bool kWarpRows = false>
__global__ void __launch_bounds__(kMaxRowThreads) qk_norm_rope_shared_kernel(RopeArgs a) {
  __shared__ float red[kMaxRowThreads / 32];
  extern __shared__ float4 rot_smem[];  // head_dim / 2 float2 (cos, sin) per row of the CTA, as float4
  const int which = int(blockIdx.y);
  const int t = kWarpRows ? int(threadIdx.x & 31u) : int(threadIdx.x);
  const int threads = kWarpRows ? 32 : int(blockDim.x);
  const uint32_t r = kWarpRows ? blockIdx.x * kWarpRowsPerCta + (threadIdx.x >> 5) : blockIdx.x;
  if (kWarpRows && int64_t(r) >= a.rows) return;  // a whole warp; no CTA barrier follows
  float2* rot = reinterpret_cast<float2*>(rot_smem) + (kWarpRows ? (threadIdx.x >> 5) * (a.head_dim / 2) : 0);
  const int packs = a.dim / 8;
  const Tin* row = static_cast<const Tin*>(a.in[which]) + int64_t(r) * a.ld_in[which];

  Pack8<Tin> raw[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int p = t + j * threads;
    raw[j] = p < packs ? load_pack(row + p * 8) : zero_pack<Tin>();
  }

  // Token position (32-bit: L, plane, width < 2^31 since rows < 2^31).
  const uint32_t L = uint32_t(a.L), plane = uint32_t(a.plane), width = uint32_t(a.width);
  const uint32_t b = r / L, l = r - b * L;
  const uint32_t pos_t = l / plane, in_plane = l - pos_t * plane;
  const uint32_t pos_h = in_plane / width, pos_w = in_plane - pos_h * width;

  // This token's (cos, sin) per pair of a head, gathered while the loads fly.
  const int half = a.head_dim / 2;
  for (int pair = t; pair < half; pair += threads) {
    int64_t ci, si;
    if (pair < a.pairs_t) {
      ci = a.cos_t + int64_t(pos_t) * a.pairs_t + pair, si = a.sin_t + int64_t(pos_t) * a.pairs_t + pair;
    } else if (pair < a.pairs_t + a.pairs_h) {
      const int jj = pair - a.pairs_t;
      ci = a.cos_h + int64_t(pos_h) * a.pairs_h + jj, si = a.sin_h + int64_t(pos_h) * a.pairs_h + jj;
    } else {
      const int jj = pair - a.pairs_t - a.pairs_h;
      ci = a.cos_w + int64_t(pos_w) * a.pairs_w + jj, si = a.sin_w + int64_t(pos_w) * a.pairs_w + jj;
    }
    rot[pair] = make_float2(__ldg(a.tables + ci), __ldg(a.tables + si));
  }

  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float f[8];
    unpack(raw[j], f);  // invalid packs are zeros
#pragma unroll
    for (int i = 0; i < 8; ++i) ss = fmaf(f[i], f[i], ss);
  }
  // group_sum's __syncthreads (several warps) also publishes rot[]; a
  // one-warp row has no barrier in it, so sync the warp here.
  if (threads == 32) __syncwarp();
  if constexpr (kWarpRows)
    ss = warp_sum(ss);
  else
    ss = group_sum(ss, red, 0, threads, 0);
  const float rstd = __fdiv_rn(1.f, __fsqrt_rn(ss / float(a.dim) + a.eps));

  const float* weight = a.weight[which];
  Tout* out = static_cast<Tout*>(a.out[which]);
  const uint32_t head_dim = uint32_t(a.head_dim);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int p = t + j * threads;
    if (p >= packs) continue;
    const uint32_t col = uint32_t(p) * 8u, h = col / head_dim, c = col - h * head_dim;
    float y[8], w[8];
    unpack(raw[j], y);
    load_params8(weight + col, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = y[i] * rstd * w[i];
    const float4* rp = reinterpret_cast<const float4*>(rot + c / 2);  // 4 pairs, 32-byte aligned (c % 8 == 0)
    const float4 r01 = rp[0], r23 = rp[1];
    const float cs[4] = {r01.x, r01.z, r23.x, r23.z}, sn[4] = {r01.y, r01.w, r23.y, r23.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float re = y[2 * k], im = y[2 * k + 1];
      y[2 * k] = re * cs[k] - im * sn[k];
      y[2 * k + 1] = re * sn[k] + im * cs[k];
    }
    const int64_t dst = a.bhld ? ((int64_t(b) * a.heads + h) * a.L + l) * a.head_dim + c
                               : int64_t(r) * a.dim + col;
    store_values(out + dst, y, 8, true);
  }
}

// Which kernel QkRopeKernel::Auto means: TURBODIFF_QK_ROPE_KERNEL=shared or
// =global (read per call, so a benchmark can switch it), else SharedAngles.
QkRopeKernel resolve_kernel(QkRopeKernel k) {
  if (k != QkRopeKernel::Auto) return k;
  if (const char* e = std::getenv("TURBODIFF_QK_ROPE_KERNEL")) {
    if (std::strcmp(e, "global") == 0) return QkRopeKernel::GlobalTables;
    if (std::strcmp(e, "shared_warps") == 0) return QkRopeKernel::SharedAnglesWarpRows;
  }
  // SharedAngles: 94-100% of copy bandwidth on the H200 (2026-11-30,
  // bench_quant_rope) against 50-54% for GlobalTables; GPU tests passed.
  // SharedAnglesWarpRows where it takes the rows (launch() falls back to
  // SharedAngles elsewhere): at 32760x1536, fraction of a same-traffic copy,
  // two runs (H200, session 8): BHLD 90.8-91.1% against 89.2-89.3%, BLHD
  // 92.8-93.5% against 91.8-92.0%.
  return QkRopeKernel::SharedAnglesWarpRows;
}

template <typename Tin, typename Tout>
Status launch(const RopeArgs& a, int64_t rows, const RowPlan& plan, QkRopeKernel kernel, cudaStream_t s) {
  if (kernel == QkRopeKernel::SharedAnglesWarpRows) {
    const int packs = a.dim / 8;
    if (packs % 32 == 0 && packs / 32 <= 8) {
      const dim3 grid{unsigned((rows + kWarpRowsPerCta - 1) / kWarpRowsPerCta), 2u, 1u};
      return dispatch_packs(packs / 32, [&](auto v) {
        qk_norm_rope_shared_kernel<Tin, Tout, decltype(v)::value, true>
            <<<grid, unsigned(32 * kWarpRowsPerCta), size_t(kWarpRowsPerCta) * size_t(a.head_dim) * 4, s>>>(a);
        return launch_status();
      });
    }
    kernel = QkRopeKernel::SharedAngles;  // rows of other widths: one CTA per row
  }
  const dim3 grid{unsigned(rows), 2u, 1u};
  return dispatch_packs(plan.packs_per_thread, [&](auto v) {
    if (kernel == QkRopeKernel::SharedAngles)
      qk_norm_rope_shared_kernel<Tin, Tout, decltype(v)::value>
          <<<grid, unsigned(plan.threads), size_t(a.head_dim) * 4, s>>>(a);
    else
      qk_norm_rope_kernel<Tin, Tout, decltype(v)::value><<<grid, unsigned(plan.threads), 0, s>>>(a);
    return launch_status();
  });
}

}  // namespace

Status qk_norm_rope_cuda(ElemType in_type, const void* q_in, int64_t ld_q_in, const void* k_in, int64_t ld_k_in,
                         const float* q_weight, const float* k_weight, int64_t batch, int64_t frames, int64_t height,
                         int64_t width, int heads, int head_dim, float eps, const float* rope_tables,
                         RopeOutLayout layout, ElemType out_type, void* q_out, void* k_out, void* stream,
                         QkRopeKernel kernel) {
  if (batch < 0 || frames < 1 || height < 1 || width < 1 || heads < 1 || head_dim < 8 || head_dim % 8 != 0 ||
      !(eps >= 0.f))
    return Status::InvalidArgument;
  const int64_t dim = int64_t(heads) * head_dim, L = frames * height * width, rows = batch * L;
  if (dim > kMaxRowDim || rows > 0x7fffffff) return Status::InvalidArgument;
  if (rows == 0) return Status::Ok;
  if (out_type != in_type && out_type != ElemType::F32) return Status::InvalidArgument;
  if (!q_in || !k_in || !q_weight || !k_weight || !rope_tables || !q_out || !k_out) return Status::InvalidArgument;
  if (ld_q_in < dim || ld_k_in < dim || ld_q_in % 8 != 0 || ld_k_in % 8 != 0) return Status::InvalidArgument;
  for (const void* p : {q_in, k_in, static_cast<const void*>(q_weight), static_cast<const void*>(k_weight),
                        static_cast<const void*>(rope_tables), static_cast<const void*>(q_out),
                        static_cast<const void*>(k_out)})
    if (!aligned_to(p, 16)) return Status::InvalidArgument;

  const RopeTableLayout tl = rope_table_layout(head_dim, frames, height, width);
  RopeArgs a{};
  a.in[0] = q_in, a.in[1] = k_in;
  a.ld_in[0] = ld_q_in, a.ld_in[1] = ld_k_in;
  a.weight[0] = q_weight, a.weight[1] = k_weight;
  a.out[0] = q_out, a.out[1] = k_out;
  a.L = L, a.plane = height * width, a.height = height, a.width = width;
  a.heads = heads, a.head_dim = head_dim, a.dim = int(dim), a.eps = eps;
  a.bhld = layout == RopeOutLayout::BHLD;
  a.rows = rows;
  a.tables = rope_tables;
  a.pairs_t = tl.pairs_t, a.pairs_h = tl.pairs_h, a.pairs_w = tl.pairs_w;
  a.cos_t = tl.cos_t, a.sin_t = tl.sin_t, a.cos_h = tl.cos_h, a.sin_h = tl.sin_h, a.cos_w = tl.cos_w,
  a.sin_w = tl.sin_w;

  const RowPlan plan = plan_row(dim / 8);
  if (plan.threads == 0) return Status::InvalidArgument;
  kernel = resolve_kernel(kernel);
  // SharedAngles keeps head_dim * 4 bytes of angles in shared memory: up to
  // 48 KB without opting in, i.e. head_dim <= 12288 (any real model).
  // SharedAnglesWarpRows keeps kWarpRowsPerCta tokens' angles: head_dim <= 3072.
  if (kernel == QkRopeKernel::SharedAnglesWarpRows && head_dim > 12288 / kWarpRowsPerCta)
    kernel = QkRopeKernel::SharedAngles;
  if (kernel == QkRopeKernel::SharedAngles && head_dim > 12288) kernel = QkRopeKernel::GlobalTables;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_act_type(in_type, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    if (out_type == ElemType::F32) return launch<Tin, float>(a, rows, plan, kernel, s);
    return launch<Tin, Tin>(a, rows, plan, kernel, s);
  });
}

}  // namespace td::kernels
