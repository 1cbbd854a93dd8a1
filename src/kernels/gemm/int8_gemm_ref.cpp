// CPU references of the W8A8 GEMMs (int8_gemm.h) and the argument checks
// every implementation shares. The int8 products are summed exactly in 64-bit
// integers; the scaling, promotion and epilogue run in float or double.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/gemm/int8_gemm.h"

namespace td::kernels {
namespace {

constexpr int64_t kScaleBlock = 128;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Exact sum_k a[k] * w[k] over n elements.
int64_t dot_i8(const int8_t* a, const int8_t* w, int64_t n) {
  int32_t acc = 0;  // n <= 128 per call from the block path; the post-scale path chunks below
  for (int64_t k = 0; k < n; ++k) acc += int32_t(a[k]) * int32_t(w[k]);
  return acc;
}

int64_t dot_i8_long(const int8_t* a, const int8_t* w, int64_t n) {
  // Chunks of 4096 products stay far below 2^31 in int32 (4096 * 2^14 = 2^26),
  // which lets the compiler vectorize the inner loop.
  int64_t acc = 0;
  for (int64_t k0 = 0; k0 < n; k0 += 4096) acc += dot_i8(a + k0, w + k0, std::min<int64_t>(4096, n - k0));
  return acc;
}

// PyTorch's gelu(approximate="tanh"), 0.5 x (1 + tanh(u)), evaluated as the
// identical x / (1 + exp(-2u)), which keeps its relative accuracy where
// 1 + tanh(u) cancels (u << 0); the CUDA kernels use the same form.
template <typename T>
T gelu_tanh(T x) {
  const T u = T(0.7978845608028654) * (x + T(0.044715) * x * x * x);  // sqrt(2 / pi) (x + 0.044715 x^3)
  return x / (T(1) + std::exp(T(-2) * u));
}

// The epilogue after the scaled product y (shared by both schemes).
template <typename T>
void finish_row(const Int8GemmOperands& op, int64_t m, const T* y) {
  const Int8GemmEpilogue& e = op.epilogue;
  const int64_t b = e.gate ? m / e.rows_per_batch : 0;
  for (int64_t n = 0; n < op.N; ++n) {
    T v = y[n];
    if (e.bias) v += T(e.bias[n]);
    if (e.activation == GemmActivation::GeluTanh) v = gelu_tanh(v);
    if (e.residual) {
      const T g = e.gate ? T(e.gate[b * e.ld_gate + n]) : T(1);
      v = T(bf16_to_f32(e.residual[m * e.ld_residual + n])) + g * v;
    }
    if (op.out_type == ElemType::F32)
      static_cast<float*>(op.out)[m * op.ldo + n] = float(v);
    else
      static_cast<uint16_t*>(op.out)[m * op.ldo + n] = f32_to_bf16(float(v));
  }
}

Status check_operands(const Int8GemmOperands& op) {
  if (op.M < 0 || op.N < 0 || op.K < 0) return Status::InvalidArgument;
  if (op.out_type != ElemType::BF16 && op.out_type != ElemType::F32) return Status::InvalidArgument;
  if (op.M == 0 || op.N == 0) return Status::Ok;  // nothing to write
  if (!op.out || op.ldo < op.N) return Status::InvalidArgument;
  if (op.K > 0 && (!op.a || !op.w || op.lda < op.K || op.ldw < op.K)) return Status::InvalidArgument;
  const Int8GemmEpilogue& e = op.epilogue;
  if (e.activation != GemmActivation::None && e.activation != GemmActivation::GeluTanh) return Status::InvalidArgument;
  if (e.residual && e.ld_residual < op.N) return Status::InvalidArgument;
  if (e.gate && (!e.residual || e.rows_per_batch < 1 || e.ld_gate < op.N)) return Status::InvalidArgument;
  // out may alias residual only exactly (in place), and only for a bf16 out
  if (e.residual && static_cast<const void*>(e.residual) == op.out &&
      (e.ld_residual != op.ldo || op.out_type != ElemType::BF16))
    return Status::InvalidArgument;
  return Status::Ok;
}

bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

}  // namespace

Status int8_gemm_post_scale_check(const Int8GemmPostScaleArgs& args) {
  if (Status s = check_operands(args.op); s != Status::Ok) return s;
  if (args.op.M == 0 || args.op.N == 0) return Status::Ok;
  if (!args.a_scale || !args.w_scale) return Status::InvalidArgument;
  return Status::Ok;
}

Status int8_gemm_block_scaled_check(const Int8GemmBlockScaledArgs& args) {
  if (Status s = check_operands(args.op); s != Status::Ok) return s;
  const Int8GemmOperands& op = args.op;
  if (op.M == 0 || op.N == 0) return Status::Ok;
  if (!args.a_scale || !args.w_scale) return Status::InvalidArgument;
  const int64_t kblocks = ceil_div(op.K, kScaleBlock);
  if (args.ld_w_scale < kblocks) return Status::InvalidArgument;
  switch (args.a_scale_kind) {
    case ActScale::Token128:
      if (args.ld_a_scale < op.M) return Status::InvalidArgument;
      break;
    case ActScale::Block128:
      if (args.ld_a_scale < kblocks) return Status::InvalidArgument;
      break;
    default: return Status::InvalidArgument;
  }
  return Status::Ok;
}

const char* int8_gemm_cuda_unsupported_reason(const Int8GemmOperands& op, const void* a_scale, const void* w_scale) {
  if (op.out_type != ElemType::BF16) return "the CUDA kernels write bf16 only";
  if (op.K < 16 || op.K % 16 != 0) return "K must be a positive multiple of 16";
  if (op.K > 131072) return "K > 131072 could overflow the int32 accumulators";
  if (op.N % 8 != 0) return "N must be a multiple of 8";
  if (op.lda % 16 != 0 || op.ldw % 16 != 0) return "lda and ldw must be multiples of 16";
  if (op.ldo % 8 != 0) return "ldo must be a multiple of 8";
  if (!aligned(op.a, 16) || !aligned(op.w, 16) || !aligned(op.out, 16)) return "a, w and out must be 16-byte aligned";
  if (!aligned(a_scale, 16) || !aligned(w_scale, 16)) return "the scales must be 16-byte aligned";
  const Int8GemmEpilogue& e = op.epilogue;
  if (!aligned(e.bias, 16)) return "bias must be 16-byte aligned";
  if (e.residual && (!aligned(e.residual, 16) || e.ld_residual % 8 != 0))
    return "residual must be 16-byte aligned with ld_residual a multiple of 8";
  if (e.gate && (!aligned(e.gate, 16) || e.ld_gate % 4 != 0))
    return "gate must be 16-byte aligned with ld_gate a multiple of 4";
  return "";
}

Status int8_gemm_cuda_supported(const Int8GemmOperands& op, const void* a_scale, const void* w_scale) {
  return *int8_gemm_cuda_unsupported_reason(op, a_scale, w_scale) == '\0' ? Status::Ok : Status::Unsupported;
}

namespace {

template <typename T>
void post_scale_rows(const Int8GemmPostScaleArgs& args, int64_t m0, int64_t m1) {
  const Int8GemmOperands& op = args.op;
  std::vector<T> y(static_cast<size_t>(op.N));
  for (int64_t m = m0; m < m1; ++m) {
    const int8_t* a_row = op.a + m * op.lda;
    for (int64_t n = 0; n < op.N; ++n) {
      const int64_t acc = op.K > 0 ? dot_i8_long(a_row, op.w + n * op.ldw, op.K) : 0;
      y[size_t(n)] = T(acc) * T(args.a_scale[m]) * T(args.w_scale[n]);
    }
    finish_row(op, m, y.data());
  }
}

template <typename T>
void block_scaled_rows(const Int8GemmBlockScaledArgs& args, int64_t m0, int64_t m1) {
  const Int8GemmOperands& op = args.op;
  const int64_t kblocks = ceil_div(op.K, kScaleBlock);
  std::vector<T> y(static_cast<size_t>(op.N));
  std::vector<T> sa(static_cast<size_t>(kblocks));
  for (int64_t m = m0; m < m1; ++m) {
    for (int64_t kb = 0; kb < kblocks; ++kb)
      sa[size_t(kb)] = T(args.a_scale_kind == ActScale::Token128
                             ? args.a_scale[kb * args.ld_a_scale + m]
                             : args.a_scale[(m / kScaleBlock) * args.ld_a_scale + kb]);
    const int8_t* a_row = op.a + m * op.lda;
    for (int64_t n = 0; n < op.N; ++n) {
      const int8_t* w_row = op.w + n * op.ldw;
      const float* sw = args.w_scale + (n / kScaleBlock) * args.ld_w_scale;
      T acc = T(0);
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        const int64_t k0 = kb * kScaleBlock;
        const int64_t part = dot_i8(a_row + k0, w_row + k0, std::min(kScaleBlock, op.K - k0));
        // the promotion the GPU kernels do: one product of the two scales,
        // then a multiply-add of the exact partial sum into the accumulator
        acc += T(part) * (sa[size_t(kb)] * T(sw[kb]));
      }
      y[size_t(n)] = acc;
    }
    finish_row(op, m, y.data());
  }
}

bool resolve_rows(int64_t M, int64_t& m_begin, int64_t& m_end) {
  if (m_end < 0) m_end = M;
  return m_begin >= 0 && m_begin <= m_end && m_end <= M;
}

}  // namespace

Status int8_gemm_post_scale_ref(const Int8GemmPostScaleArgs& args, RefPrecision precision, int64_t m_begin,
                                int64_t m_end) {
  if (Status s = int8_gemm_post_scale_check(args); s != Status::Ok) return s;
  if (!resolve_rows(args.op.M, m_begin, m_end)) return Status::InvalidArgument;
  if (args.op.N == 0 || m_begin == m_end) return Status::Ok;
  td::parallel_for(m_end - m_begin, 4, [&](int64_t r0, int64_t r1) {
    if (precision == RefPrecision::F64)
      post_scale_rows<double>(args, m_begin + r0, m_begin + r1);
    else
      post_scale_rows<float>(args, m_begin + r0, m_begin + r1);
  });
  return Status::Ok;
}

Status int8_gemm_block_scaled_ref(const Int8GemmBlockScaledArgs& args, RefPrecision precision, int64_t m_begin,
                                  int64_t m_end) {
  if (Status s = int8_gemm_block_scaled_check(args); s != Status::Ok) return s;
  if (!resolve_rows(args.op.M, m_begin, m_end)) return Status::InvalidArgument;
  if (args.op.N == 0 || m_begin == m_end) return Status::Ok;
  td::parallel_for(m_end - m_begin, 4, [&](int64_t r0, int64_t r1) {
    if (precision == RefPrecision::F64)
      block_scaled_rows<double>(args, m_begin + r0, m_begin + r1);
    else
      block_scaled_rows<float>(args, m_begin + r0, m_begin + r1);
  });
  return Status::Ok;
}

}  // namespace td::kernels
