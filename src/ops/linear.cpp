#include "ops/linear.h"

#include <map>
#include <mutex>
#include <tuple>

#include "core/cuda_runtime.h"
#include "kernels/gemm_f32/gemm_f32.h"
#include "ops/common.h"
#include "ops/elementwise.h"

#if TURBODIFF_HAVE_CUDA
#include <cublasLt.h>
#endif

namespace td::ops {
namespace {

constexpr const char* kOp = "linear";

bool float_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

struct Checked {
  Rows x;
  int64_t n = 0, k = 0, ldw = 0;
  Shape out_shape;
};

Checked check_args(const Tensor& x, const Tensor& weight, const Tensor& bias, DType out_dtype) {
  check_same_device(kOp, {{"x", &x}, {"weight", &weight}, {"bias", &bias}});
  TD_CHECK(weight.defined() && weight.dim() == 2, Shape, kOp, ": weight must be 2-D [out, in], got ",
           weight.defined() ? weight.desc() : std::string("undefined"));
  TD_CHECK(weight.size(1) == 1 || weight.strides()[1] == 1, Shape, kOp, ": weight ", weight.desc(),
           " must be contiguous along its input dimension");
  Checked c;
  c.x = as_rows(x, kOp, "x");
  c.n = weight.size(0);
  c.k = weight.size(1);
  TD_CHECK(c.k >= 1, Shape, kOp, ": weight ", weight.desc(), " has no input features");
  c.ldw = c.n <= 1 ? c.k : weight.strides()[0];
  TD_CHECK(c.ldw >= c.k, Shape, kOp, ": weight ", weight.desc(), " rows overlap (row stride ", c.ldw, ")");
  TD_CHECK(c.x.dim == c.k, Shape, kOp, ": x ", x.desc(), " has ", c.x.dim, " input features but weight ",
           weight.desc(), " expects ", c.k);
  TD_CHECK(float_dtype(x.dtype()), DType, kOp, ": x ", x.desc(), " must be f32, bf16 or f16");
  TD_CHECK(float_dtype(weight.dtype()), DType, kOp, ": weight ", weight.desc(), " must be f32, bf16 or f16");
  TD_CHECK(float_dtype(out_dtype), DType, kOp, ": output dtype ", dtype_name(out_dtype), " is not f32, bf16 or f16");
  if (bias.defined()) {
    TD_CHECK(bias.dim() == 1 && bias.numel() == c.n && bias.is_contiguous(), Shape, kOp, ": bias ", bias.desc(),
             " must be a contiguous vector of ", c.n, " values (weight ", weight.desc(), ")");
    TD_CHECK(bias.dtype() == DType::F32 || bias.dtype() == out_dtype, DType, kOp, ": bias ", bias.desc(),
             " must be f32 or the output dtype ", dtype_name(out_dtype));
  }
  c.out_shape = x.shape();
  c.out_shape.back() = c.n;
  return c;
}

void linear_cpu(const Checked& c, const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y) {
  kernels::GemmF32Params p;
  p.m = c.x.rows;
  p.n = c.n;
  p.k = c.k;
  p.a = c.x.ptr;
  p.a_type = elem_type(x.dtype(), kOp, "x");
  p.lda = c.x.stride;
  p.w = weight.raw_data();
  p.w_type = elem_type(weight.dtype(), kOp, "weight");
  p.ldw = c.ldw;
  if (bias.defined()) {
    p.bias = bias.raw_data();
    p.bias_type = elem_type(bias.dtype(), kOp, "bias");
  }
  p.c = y.raw_data();
  p.c_type = elem_type(y.dtype(), kOp, "y");
  p.ldc = c.n;
  check_status(kernels::gemm_f32_cpu(p), kOp, cat(x.desc(), " x ", weight.desc()));
}

#if TURBODIFF_HAVE_CUDA

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: fail(ErrorKind::DType, kOp, ": no cuBLASLt type for ", dtype_name(t));
  }
}

void lt_check(cublasStatus_t s, const char* what, const std::string& ctx) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  fail(s == CUBLAS_STATUS_ALLOC_FAILED ? ErrorKind::OutOfMemory : ErrorKind::Cuda, kOp, ": ", what, " failed: ",
       cublasLtGetStatusName(s), " (", cublasLtGetStatusString(s), ") for ", ctx);
}

// cuBLASLt picks kernels by the pointers' alignment: a plan is only reused for
// pointers at least as aligned as the ones it was chosen for.
int alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && a % uintptr_t(al) != 0) al /= 2;
  return al;
}

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

struct LtDevice {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

struct PlanKey {
  int device;
  int64_t m, n, k, lda, ldw;
  int in_type, out_type, bias_type;  // bias_type -1: no fused bias
  int align_x, align_w, align_y, align_bias;  // bias: part of the key, cuBLASLt has no preference for it
  auto tie() const {
    return std::tie(device, m, n, k, lda, ldw, in_type, out_type, bias_type, align_x, align_w, align_y, align_bias);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// Handles, workspaces and plans live for the process (one per device / shape).
std::mutex g_lt_mu;
std::map<int, LtDevice> g_lt_devices;
std::map<PlanKey, Plan> g_plans;

LtDevice& lt_device(int device) {
  auto it = g_lt_devices.find(device);
  if (it != g_lt_devices.end()) return it->second;
  LtDevice d;
  lt_check(cublasLtCreate(&d.handle), "cublasLtCreate", cat("device ", device));
  d.workspace = cuda::device_alloc(kWorkspaceBytes, device);
  return g_lt_devices.emplace(device, d).first->second;
}

const Plan& lt_plan(const PlanKey& key, cublasLtHandle_t handle, const std::string& ctx) {
  auto it = g_plans.find(key);
  if (it != g_plans.end()) return it->second;
  Plan p;
  const auto in_t = cudaDataType_t(key.in_type), out_t = cudaDataType_t(key.out_type);
  lt_check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate", ctx);
  // Column-major view: y^T [N, M] = op(W^T as [K, N]) . x^T [K, M], i.e. transa = T.
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA", ctx);
  lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB", ctx);
  if (key.bias_type >= 0) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bt = key.bias_type;
    lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "set EPILOGUE",
             ctx);
    lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt),
             "set BIAS_DATA_TYPE", ctx);
  }
  lt_check(cublasLtMatrixLayoutCreate(&p.w, in_t, uint64_t(key.k), uint64_t(key.n), key.ldw), "layout W", ctx);
  lt_check(cublasLtMatrixLayoutCreate(&p.x, in_t, uint64_t(key.k), uint64_t(key.m), key.lda), "layout x", ctx);
  lt_check(cublasLtMatrixLayoutCreate(&p.y, out_t, uint64_t(key.n), uint64_t(key.m), key.n), "layout y", ctx);

  cublasLtMatmulPreference_t pref = nullptr;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", ctx);
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t aw = uint32_t(key.align_w), ax = uint32_t(key.align_x), ay = uint32_t(key.align_y);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof aw);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax, sizeof ax);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay, sizeof ay);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay, sizeof ay);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.w, p.x, p.y, p.y, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0)
    fail(ErrorKind::Unsupported, kOp, ": cuBLASLt has no algorithm for ", ctx, " (",
         hs == CUBLAS_STATUS_SUCCESS ? "no heuristic result" : cublasLtGetStatusName(hs), ")");
  p.algo = result.algo;
  return g_plans.emplace(key, p).first->second;
}

void linear_cuda(const Checked& c, const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y) {
  TD_CHECK(x.dtype() == weight.dtype(), DType, kOp, ": on CUDA x and weight must have the same dtype, got ", x.desc(),
           " and ", weight.desc());
  const std::string ctx = cat(x.desc(), " x ", weight.desc(), " -> ", dtype_name(y.dtype()));
  if (c.x.rows == 0 || c.n == 0) return;
  const bool fuse_bias = bias.defined() && bias.dtype() == y.dtype();
  const int device = x.device().index;
  cuda::set_device(device);
  std::lock_guard<std::mutex> lock(g_lt_mu);
  LtDevice& d = lt_device(device);
  PlanKey key{device,
              c.x.rows,
              c.n,
              c.k,
              c.x.stride,
              c.ldw,
              int(cuda_type(x.dtype())),
              int(cuda_type(y.dtype())),
              fuse_bias ? int(cuda_type(bias.dtype())) : -1,
              alignment_of(c.x.ptr),
              alignment_of(weight.raw_data()),
              alignment_of(y.raw_data()),
              fuse_bias ? alignment_of(bias.raw_data()) : 0};
  const Plan& p = lt_plan(key, d.handle, ctx);
  if (fuse_bias) {
    const void* bp = bias.raw_data();
    lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp),
             "set BIAS_POINTER", ctx);
  }
  const float alpha = 1.f, beta = 0.f;
  lt_check(cublasLtMatmul(d.handle, p.desc, &alpha, weight.raw_data(), p.w, c.x.ptr, p.x, &beta, y.raw_data(), p.y,
                          y.raw_data(), p.y, &p.algo, d.workspace, kWorkspaceBytes,
                          static_cast<cudaStream_t>(cuda::current_stream())),
           "cublasLtMatmul", ctx);
  if (bias.defined() && !fuse_bias) add_(y, bias);
}

#endif  // TURBODIFF_HAVE_CUDA

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, std::optional<DType> out_dtype) {
  const DType ot = out_dtype.value_or(x.defined() ? x.dtype() : DType::F32);
  TD_CHECK(x.defined(), Internal, kOp, ": x is undefined");
  const Checked c = check_args(x, weight, bias, ot);
  Tensor y = Tensor::empty(c.out_shape, ot, x.device());
#if TURBODIFF_HAVE_CUDA
  if (x.device().is_cuda()) {
    linear_cuda(c, x, weight, bias, y);
    return y;
  }
#endif
  linear_cpu(c, x, weight, bias, y);
  return y;
}

}  // namespace td::ops
