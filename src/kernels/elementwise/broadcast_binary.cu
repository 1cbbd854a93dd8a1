// CUDA broadcast_binary (contract in broadcast_binary.h; fp32 reference in
// broadcast_binary_cpu.cpp).
//
// Design (elementwise_common.cuh): rows of `tpr` threads, 4 chunks of 8
// elements per thread with 16-byte loads and stores, all loads first. The
// broadcast operand's row is chosen once per thread (Full: row r; PerSample:
// r / rows_per_batch, one division; Vector: row 0); fp32 vector rows are
// read through the same 16-byte path and stay in L1/L2. The op and the
// broadcast kind are uniform runtime branches.
//
// Bytes moved (bf16 a, b, out): Full 6 bytes per element, Vector / PerSample
// 4 (the fp32 vector rows are cached). Predicted at 4.0 TB/s:
//   32760 x 1536: Full 301.9 MB -> 75.5 us;    Vector/PerSample 201.3 MB -> 50.3 us
//   75600 x 5120: Full 2322.4 MB -> 580.6 us;  Vector/PerSample 1548.3 MB -> 387.1 us
// Measured (H200, bench_norm, one run): Full 75.1 / 534 us (100%), Vector 54.0 / 374 us (93% / 97.5%).
#include "kernels/elementwise/broadcast_binary.h"
#include "kernels/elementwise/elementwise_common.cuh"
#include "kernels/norm/norm_host.h"

namespace td::kernels {
namespace gpu {
namespace {

struct BinaryArgs {
  const void* a;
  int64_t a_stride;
  const void* b;
  int64_t b_stride;
  int64_t rows_per_batch;
  void* out;
  int64_t out_stride;
  int64_t rows;
  int dim;
  Broadcast broadcast;
  BinaryOp op;
};

// AT: a's type; BT: b's (AT for Full, float for Vector / PerSample); OutT: out's.
template <typename AT, typename BT, typename OutT, int kChunk>
__global__ void __launch_bounds__(kElementwiseMaxThreads) broadcast_binary_kernel(const BinaryArgs p) {
  using AIO = ChunkIO<AT, kChunk>;
  using BIO = ChunkIO<BT, kChunk>;
  using OIO = ChunkIO<OutT, kChunk>;
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= p.rows) return;  // no barriers below
  const int tpr = int(blockDim.x);
  const int nchunks = p.dim / kChunk;
  const int first = int(blockIdx.y) * tpr * kElementwiseVpt + int(threadIdx.x);
  const int64_t b_row = p.broadcast == Broadcast::Full        ? row
                        : p.broadcast == Broadcast::PerSample ? row / p.rows_per_batch
                                                              : 0;
  const AT* a = static_cast<const AT*>(p.a) + row * p.a_stride;
  const BT* b = static_cast<const BT*>(p.b) + b_row * p.b_stride;
  OutT* out = static_cast<OutT*>(p.out) + row * p.out_stride;
  typename AIO::Raw ar[kElementwiseVpt];
  typename BIO::Raw br[kElementwiseVpt];
#pragma unroll
  for (int k = 0; k < kElementwiseVpt; ++k) {
    const int c = first + k * tpr;
    if (c < nchunks) {
      ar[k] = AIO::load(a + c * kChunk);
      br[k] = BIO::load(b + c * kChunk);
    }
  }
#pragma unroll
  for (int k = 0; k < kElementwiseVpt; ++k) {
    const int c = first + k * tpr;
    if (c < nchunks) {
      float fa[kChunk], fb[kChunk];
      AIO::unpack(ar[k], fa);
      BIO::unpack(br[k], fb);
      if (p.op == BinaryOp::Add) {
#pragma unroll
        for (int j = 0; j < kChunk; ++j) fa[j] += fb[j];
      } else {
#pragma unroll
        for (int j = 0; j < kChunk; ++j) fa[j] *= fb[j];
      }
      OIO::store(out + c * kChunk, OIO::pack(fa));
    }
  }
}

template <typename AT, typename BT, typename OutT>
Status launch_binary(const BinaryArgs& a, const ElementwisePlan& plan, cudaStream_t stream) {
  const int64_t blocks = (a.rows + plan.rpb - 1) / plan.rpb;
  if (blocks > int64_t(INT32_MAX)) return Status::InvalidArgument;
  const dim3 grid{unsigned(blocks), unsigned(plan.tiles)};
  const dim3 block{unsigned(plan.tpr), unsigned(plan.rpb)};
  if (plan.chunk == 8)
    broadcast_binary_kernel<AT, BT, OutT, 8><<<grid, block, 0, stream>>>(a);
  else
    broadcast_binary_kernel<AT, BT, OutT, 1><<<grid, block, 0, stream>>>(a);
  return launch_status();
}

}  // namespace
}  // namespace gpu

Status broadcast_binary_cuda(const BroadcastBinaryParams& p, void* stream) {
  if (Status s = broadcast_binary_check(p); s != Status::Ok) return s;
  if (p.rows == 0) return Status::Ok;
  using namespace gpu;
  const bool b_is_vector = p.broadcast != Broadcast::Full;
  // fp32 vector rows need 16-byte aligned starts: b_stride a multiple of 4 floats.
  const bool b_stride_ok = b_is_vector ? (p.broadcast == Broadcast::Vector || p.b_stride % 4 == 0) : p.b_stride % 8 == 0;
  const bool vectorized = p.dim % 8 == 0 && p.a_stride % 8 == 0 && p.out_stride % 8 == 0 && b_stride_ok &&
                          aligned16(p.a) && aligned16(p.b) && aligned16(p.out);
  ElementwisePlan plan;
  if (!plan_elementwise(p.dim, vectorized, &plan)) return Status::Unsupported;
  const BinaryArgs a{p.a, p.a_stride, p.b, p.b_stride, p.rows_per_batch, p.out, p.out_stride,
                     p.rows, int(p.dim), p.broadcast, p.op};
  const auto cs = static_cast<cudaStream_t>(stream);
  return act_type_dispatch(p.a_type, [&](auto at) {
    using AT = typename decltype(at)::type;
    return act_type_dispatch(p.out_type, [&](auto ot) {
      using OT = typename decltype(ot)::type;
      if (b_is_vector) return launch_binary<AT, float, OT>(a, plan, cs);
      return launch_binary<AT, AT, OT>(a, plan, cs);
    });
  });
}

}  // namespace td::kernels
