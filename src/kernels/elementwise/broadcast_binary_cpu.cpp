// fp32 CPU reference of broadcast_binary (see broadcast_binary.h): one loop
// per row, the broadcast operand indexed as the contract says. Each element is
// read before it is written, so in-place use is safe.
#include <algorithm>

#include "core/thread_pool.h"
#include "kernels/elementwise/broadcast_binary.h"
#include "kernels/norm/norm_host.h"

namespace td::kernels {

Status broadcast_binary_check(const BroadcastBinaryParams& p) {
  if (p.op != BinaryOp::Add && p.op != BinaryOp::Mul) return Status::InvalidArgument;
  if (!valid_shape(p.rows, p.dim)) return Status::InvalidArgument;
  if (!valid_rows_operand(p.a, p.a_type, p.a_stride, p.rows, p.dim) ||
      !valid_rows_operand(p.out, p.out_type, p.out_stride, p.rows, p.dim))
    return Status::InvalidArgument;
  if (!alias_ok(p.a, p.a_type, p.a_stride, p.out, p.out_type, p.out_stride)) return Status::InvalidArgument;
  switch (p.broadcast) {
    case Broadcast::Full:
      if (!valid_rows_operand(p.b, p.a_type, p.b_stride, p.rows, p.dim)) return Status::InvalidArgument;
      if (!alias_ok(p.b, p.a_type, p.b_stride, p.out, p.out_type, p.out_stride)) return Status::InvalidArgument;
      return Status::Ok;
    case Broadcast::Vector:
      if (p.rows > 0 && p.b == nullptr) return Status::InvalidArgument;
      break;
    case Broadcast::PerSample:
      if (p.rows > 0 && p.b == nullptr) return Status::InvalidArgument;
      if (p.rows_per_batch < 1 || (p.b_stride != 0 && p.b_stride < p.dim)) return Status::InvalidArgument;
      break;
    default: return Status::InvalidArgument;
  }
  // An fp32 vector operand must not be the output's memory.
  if (p.rows > 0 && (p.b == p.out || p.b == p.a)) return Status::InvalidArgument;
  return Status::Ok;
}

Status broadcast_binary_cpu(const BroadcastBinaryParams& p) {
  if (Status s = broadcast_binary_check(p); s != Status::Ok) return s;
  const auto* bvec = static_cast<const float*>(p.b);
  parallel_for(p.rows, std::max<int64_t>(1, 65536 / p.dim), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t i = 0; i < p.dim; ++i) {
        const float a = load_act(p.a, p.a_type, r * p.a_stride + i);
        float b;
        switch (p.broadcast) {
          case Broadcast::Full: b = load_act(p.b, p.a_type, r * p.b_stride + i); break;
          case Broadcast::Vector: b = bvec[i]; break;
          default: b = bvec[(r / p.rows_per_batch) * p.b_stride + i]; break;
        }
        store_act(p.out, p.out_type, r * p.out_stride + i, p.op == BinaryOp::Add ? a + b : a * b);
      }
    }
  });
  return Status::Ok;
}

}  // namespace td::kernels
