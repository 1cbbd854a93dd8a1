#include "ops/int8_linear.h"

#include <map>
#include <mutex>

#include "core/cuda_runtime.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "kernels/gemm/int8_gemm.h"
#include "kernels/quant/quant_block128.h"
#include "kernels/quant/quant_common.h"
#include "kernels/quant/quant_per_row.h"
#include "kernels/quant/quant_token128.h"
#include "ops/common.h"
#include "ops/elementwise.h"
#include "ops/linear.h"

namespace td::ops {

#if TURBODIFF_HAVE_CUDA
// int8_linear_cuda.cu: w = q * scale on the device, written as bf16/f32/f16.
kernels::Status dequantize_int8_weight_cuda(const int8_t* q, int64_t n, int64_t k, const float* scale,
                                            bool per_channel, void* out, kernels::ElemType out_type, void* stream);
#endif

namespace {

constexpr const char* kOp = "int8_linear";

bool float_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Quantized activation: codes [M, K] (ld K) and scales in the layout the GEMM reads.
using QuantAct = QuantizedActivation;

// Fills a.codes / a.scale / a.ld_scale (a.act set by the caller).
// Codes and scales of M x K in act's layout, allocated (not written).
void allocate_act(int64_t M, int64_t K, Device device, Int8ActScheme act, QuantAct& a) {
  const int64_t kb = kernels::quant_groups(K);
  a.codes = Tensor::empty({M, K}, DType::I8, device);
  switch (act) {
    case Int8ActScheme::PerToken:
      a.scale = Tensor::empty({M}, DType::F32, device);
      a.ld_scale = 1;
      break;
    case Int8ActScheme::Token128:
      // K-block-major; each K block's scale row padded to 4 floats (16 bytes) for the TMA-fed kernel.
      a.ld_scale = round_up(std::max<int64_t>(M, 1), 4);
      a.scale = Tensor::empty({kb, a.ld_scale}, DType::F32, device);
      break;
    case Int8ActScheme::Block128:
      a.ld_scale = kb;
      a.scale = Tensor::empty({kernels::quant_groups(M), kb}, DType::F32, device);
      break;
  }
}

void quantize_act_into(const Rows& r, DType x_dtype, Device device, Int8ActScheme act, QuantAct& a) {
  const int64_t M = r.rows, K = r.dim;
  allocate_act(M, K, device, act, a);
  const kernels::ElemType xt = elem_type(x_dtype, kOp, "x");
  int8_t* q = a.codes.data<int8_t>();
  float* s = a.scale.data<float>();
  kernels::Status st = kernels::Status::Ok;
  if (device.is_cpu()) {
    switch (act) {
      case Int8ActScheme::PerToken: st = kernels::quantize_per_row_cpu(xt, r.ptr, M, K, r.stride, q, K, s); break;
      case Int8ActScheme::Token128:
        st = kernels::quantize_token128_cpu(xt, r.ptr, M, K, r.stride, q, K, s, a.ld_scale);
        break;
      case Int8ActScheme::Block128: st = kernels::quantize_block128_cpu(xt, r.ptr, M, K, r.stride, q, K, s); break;
    }
  } else {
#if TURBODIFF_HAVE_CUDA
    void* stream = cuda::current_stream();
    switch (act) {
      case Int8ActScheme::PerToken:
        st = kernels::quantize_per_row_cuda(xt, r.ptr, M, K, r.stride, q, K, s, stream);
        break;
      case Int8ActScheme::Token128:
        st = kernels::quantize_token128_cuda(xt, r.ptr, M, K, r.stride, q, K, s, a.ld_scale, stream);
        break;
      case Int8ActScheme::Block128:
        st = kernels::quantize_block128_cuda(xt, r.ptr, M, K, r.stride, q, K, s, stream);
        break;
    }
#else
    fail(ErrorKind::Unsupported, kOp, ": a CUDA tensor in a build without CUDA");
#endif
  }
  check_status(st, kOp, cat("quantizing the activation [", M, ", ", K, "] (", int8_act_scheme_name(act), ")"));
}

kernels::Int8GemmOperands operands(const QuantAct& a, const Int8LinearWeight& w, const Tensor& bias, bool gelu,
                                   Tensor& y, int64_t M) {
  kernels::Int8GemmOperands op;
  op.M = M;
  op.N = w.out_features();
  op.K = w.in_features();
  op.a = a.codes.data<int8_t>();
  op.lda = op.K;
  op.w = w.q.data<int8_t>();
  op.ldw = op.K;
  op.out = y.raw_data();
  op.ldo = op.N;
  op.out_type = y.dtype() == DType::F32 ? kernels::ElemType::F32 : kernels::ElemType::BF16;
  if (bias.defined()) op.epilogue.bias = bias.data<float>();
  op.epilogue.activation = gelu ? kernels::GemmActivation::GeluTanh : kernels::GemmActivation::None;
  return op;
}

kernels::Int8GemmPostScaleArgs post_args(const kernels::Int8GemmOperands& op, const QuantAct& a,
                                         const Int8LinearWeight& w) {
  kernels::Int8GemmPostScaleArgs p;
  p.op = op;
  p.a_scale = a.scale.data<float>();
  p.w_scale = w.scale.data<float>();
  return p;
}

kernels::Int8GemmBlockScaledArgs block_args(const kernels::Int8GemmOperands& op, const QuantAct& a,
                                            const Int8LinearWeight& w, Int8ActScheme act) {
  kernels::Int8GemmBlockScaledArgs p;
  p.op = op;
  p.a_scale = a.scale.data<float>();
  p.a_scale_kind = act == Int8ActScheme::Token128 ? kernels::ActScale::Token128 : kernels::ActScale::Block128;
  p.ld_a_scale = a.ld_scale;
  p.w_scale = w.scale.data<float>();
  p.ld_w_scale = kernels::quant_groups(op.K);
  return p;
}

#if TURBODIFF_HAVE_CUDA
// The cuBLAS BF16 path: the weight dequantized on the fly into a transient
// [N, K] tensor of x's dtype (no persistent second copy of the weight).
Tensor fallback_linear(const Tensor& x, const Int8LinearWeight& w, const Tensor& bias, DType out_dtype, bool gelu) {
  const Tensor wf = dequantize_int8_weight(w, x.dtype());
  if (!gelu) return linear(x, wf, bias, out_dtype);
  return gelu_tanh(linear(x, wf, bias, DType::F32), out_dtype);
}

bool is_sm90(int device) {
  static std::mutex mu;
  static std::map<int, bool> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  const cuda::DeviceInfo info = cuda::device_info(device);
  return cache[device] = info.cc_major == 9 && info.cc_minor == 0;
}

// Expected fallbacks (small M: Wan's text-context k/v projections) log at
// info; a shape or device the INT8 kernels cannot take logs a warning.
void log_fallback(const std::string& reason, const std::string& key, LogLevel level = LogLevel::Warn) {
  log_once(level, cat("int8_linear fallback: ", key), cat(kOp, ": cuBLAS BF16 instead of the INT8 GEMM: ", reason));
}
#endif

}  // namespace

const char* int8_act_scheme_name(Int8ActScheme s) {
  switch (s) {
    case Int8ActScheme::PerToken: return "per-token";
    case Int8ActScheme::Token128: return "token128";
    case Int8ActScheme::Block128: return "block128";
  }
  return "?";
}

void check_int8_weight(const Int8LinearWeight& w, const char* what) {
  TD_CHECK(w.q.defined() && w.q.dtype() == DType::I8 && w.q.dim() == 2 && w.q.is_contiguous(), Shape, what,
           ": INT8 weight must be a contiguous i8 [N, K], got ", w.q.defined() ? w.q.desc() : std::string("nothing"));
  const int64_t N = w.q.size(0), K = w.q.size(1);
  const Shape expected = w.scheme == Int8WeightScheme::PerChannel
                             ? Shape{N}
                             : Shape{kernels::quant_groups(N), kernels::quant_groups(K)};
  TD_CHECK(w.scale.defined() && w.scale.dtype() == DType::F32 && w.scale.shape() == expected &&
               w.scale.is_contiguous(),
           Shape, what, ": INT8 weight scale must be a contiguous f32", shape_str(expected), " (",
           w.scheme == Int8WeightScheme::PerChannel ? "one per output channel" : "one per 128x128 block",
           ") for weight ", w.q.desc(), ", got ", w.scale.defined() ? w.scale.desc() : std::string("nothing"));
  TD_CHECK(w.q.device() == w.scale.device(), Usage, what, ": INT8 weight ", w.q.desc(), " and scale ",
           w.scale.desc(), " are on different devices");
}

Tensor dequantize_int8_weight(const Int8LinearWeight& w, DType dtype) {
  check_int8_weight(w, "dequantize_int8_weight");
  TD_CHECK(float_dtype(dtype), DType, "dequantize_int8_weight: target dtype ", dtype_name(dtype),
           " is not f32, bf16 or f16");
  const int64_t N = w.q.size(0), K = w.q.size(1);
  const bool per_channel = w.scheme == Int8WeightScheme::PerChannel;
  if (w.q.device().is_cuda()) {
#if TURBODIFF_HAVE_CUDA
    Tensor out = Tensor::empty({N, K}, dtype, w.q.device());
    cuda::set_device(w.q.device().index);
    check_status(dequantize_int8_weight_cuda(w.q.data<int8_t>(), N, K, w.scale.data<float>(), per_channel,
                                             out.raw_data(), elem_type(dtype, "dequantize_int8_weight", "output"),
                                             cuda::current_stream()),
                 "dequantize_int8_weight", w.q.desc());
    return out;
#else
    fail(ErrorKind::Unsupported, "dequantize_int8_weight: a CUDA tensor in a build without CUDA");
#endif
  }
  Tensor f = Tensor::empty({N, K}, DType::F32);
  kernels::Status st = per_channel ? kernels::dequantize_per_row_cpu(w.q.data<int8_t>(), N, K, K,
                                                                       w.scale.data<float>(), f.data<float>(), K)
                                   : kernels::dequantize_block128_cpu(w.q.data<int8_t>(), N, K, K,
                                                                      w.scale.data<float>(), f.data<float>(), K);
  check_status(st, "dequantize_int8_weight", w.q.desc());
  return dtype == DType::F32 ? f : f.to(dtype);
}

namespace {

// The checks of a call, before any work: x, the weight, the scheme pairing,
// the bias, the output dtype. Returns x as rows.
Rows check_call(const Tensor& x, const Int8LinearWeight& w, const Tensor& bias, Int8ActScheme act,
                DType out_dtype) {
  check_int8_weight(w, kOp);
  check_same_device(kOp, {{"x", &x}, {"weight", &w.q}, {"bias", &bias}});
  TD_CHECK(x.defined() && float_dtype(x.dtype()), DType, kOp, ": x must be f32, bf16 or f16, got ",
           x.defined() ? x.desc() : std::string("nothing"));
  const bool per_channel = w.scheme == Int8WeightScheme::PerChannel;
  TD_CHECK(per_channel == (act == Int8ActScheme::PerToken), Usage, kOp, ": activation scheme ",
           int8_act_scheme_name(act), " does not fit a ", per_channel ? "per-channel" : "128x128-block",
           " weight ", w.q.desc(), " (per-channel weights take per-token activations; block weights token128 or "
           "block128)");
  const Rows r = as_rows(x, kOp, "x");
  const int64_t N = w.out_features(), K = w.in_features();
  TD_CHECK(r.dim == K, Shape, kOp, ": x ", x.desc(), " has ", r.dim, " input features but the INT8 weight ",
           w.q.desc(), " expects ", K);
  if (bias.defined())
    TD_CHECK(bias.dim() == 1 && bias.numel() == N && bias.is_contiguous() && bias.dtype() == DType::F32, Shape, kOp,
             ": bias ", bias.desc(), " must be a contiguous f32 vector of ", N, " values (weight ", w.q.desc(), ")");
  TD_CHECK(float_dtype(out_dtype), DType, kOp, ": output dtype ", dtype_name(out_dtype), " is not f32, bf16 or f16");
  return r;
}

// Whether the INT8 kernels may take x on CUDA (else the cuBLAS fallback):
// enough rows and a 16-bit activation.
bool cuda_int8_rows(const Rows& r, DType x_dtype) {
  return r.rows >= kInt8LinearMinRowsCuda && x_dtype != DType::F32;
}

// The call after check_call, on `a` (codes present wherever the INT8 path runs).
Tensor run_int8_linear(const QuantAct& a, const Rows& r, const Int8LinearWeight& w, const Tensor& bias,
                       DType out_dtype, bool gelu) {
  const Tensor& x = a.x;
  const Int8ActScheme act = a.act;
  const bool per_channel = w.scheme == Int8WeightScheme::PerChannel;
  const int64_t N = w.out_features();
  Shape out_shape = x.shape();
  out_shape.back() = N;
  const int64_t M = r.rows;
  const std::string ctx = cat(x.desc(), " x int8", shape_str(w.q.shape()), " (", int8_act_scheme_name(act), ")");
  // The cuBLAS fallback multiplies x itself: an activation that exists only
  // quantized (residual_gate_norm_quantized, x not written) cannot take it.
  auto fallback = [&](auto&&... args) {
    TD_CHECK(a.x_written, Internal, kOp, ": ", ctx,
             ": this call needs the cuBLAS fallback, but the activation exists only as INT8 codes (a fused "
             "norm + quantize); the caller must not fuse for it");
    return fallback_linear(args...);
  };

  if (x.device().is_cpu()) {
    // The CPU reference GEMM writes f32 or bf16; f16 is converted from f32.
    const DType gemm_out = out_dtype == DType::BF16 ? DType::BF16 : DType::F32;
    Tensor y = Tensor::empty(out_shape, gemm_out);
    if (M == 0 || N == 0) return out_dtype == gemm_out ? y : y.to(out_dtype);
    TD_CHECK(a.codes.defined(), Internal, kOp, ": ", ctx, ": the activation was not quantized");
    const kernels::Int8GemmOperands op = operands(a, w, bias, gelu, y, M);
    const kernels::Status st = per_channel
                                   ? kernels::int8_gemm_post_scale_ref(post_args(op, a, w))
                                   : kernels::int8_gemm_block_scaled_ref(block_args(op, a, w, act));
    check_status(st, kOp, ctx);
    return out_dtype == gemm_out ? y : y.to(out_dtype);
  }

#if TURBODIFF_HAVE_CUDA
  const int device = x.device().index;
  cuda::set_device(device);
  if (M < kInt8LinearMinRowsCuda) {
    log_fallback(cat("M = ", M, " rows < kInt8LinearMinRowsCuda = ", kInt8LinearMinRowsCuda,
                     " (small GEMMs measured slower in INT8 than cuBLAS BF16 on the H200)"),
                 "small M", LogLevel::Info);
    return fallback(x, w, bias, out_dtype, gelu);
  }
  if (out_dtype != DType::BF16 || x.dtype() == DType::F32) {
    log_fallback(cat("x ", dtype_name(x.dtype()), " -> ", dtype_name(out_dtype),
                     ": the INT8 kernels take 16-bit activations and write bf16"),
                 cat("dtype ", dtype_name(x.dtype()), dtype_name(out_dtype)));
    return fallback(x, w, bias, out_dtype, gelu);
  }
  Tensor y = Tensor::empty(out_shape, DType::BF16, x.device());
  if (N == 0) return y;
  TD_CHECK(a.codes.defined(), Internal, kOp, ": ", ctx, ": the activation was not quantized");
  const kernels::Int8GemmOperands op = operands(a, w, bias, gelu, y, M);
  if (kernels::int8_gemm_cuda_supported(op, a.scale.raw_data(), w.scale.raw_data()) != kernels::Status::Ok) {
    const std::string why = kernels::int8_gemm_cuda_unsupported_reason(op, a.scale.raw_data(), w.scale.raw_data());
    log_fallback(cat(why, " (first seen: ", ctx, ")"), why);
    return fallback(x, w, bias, out_dtype, gelu);
  }
  void* stream = cuda::current_stream();
  kernels::Status st = kernels::Status::Unsupported;
#if TURBODIFF_HAVE_SM90
  if (is_sm90(device))
    st = per_channel ? kernels::int8_gemm_post_scale_sm90(post_args(op, a, w), stream)
                     : kernels::int8_gemm_block_scaled_sm90(block_args(op, a, w, act), stream);
  if (st == kernels::Status::Unsupported && is_sm90(device))
    log_once(LogLevel::Info, "int8_linear sm90 unsupported",
             cat(kOp, ": the sm_90a kernel declined ", ctx, "; using the portable mma.sync kernel"));
#endif
  if (st == kernels::Status::Unsupported)
    st = per_channel ? kernels::int8_gemm_post_scale_mma(post_args(op, a, w), stream)
                     : kernels::int8_gemm_block_scaled_mma(block_args(op, a, w, act), stream);
  if (st == kernels::Status::Unsupported) {
    log_fallback(cat("no INT8 kernel of this build runs on device ", device, " (first seen: ", ctx, ")"),
                 "no kernel");
    return fallback(x, w, bias, out_dtype, gelu);
  }
  check_status(st, kOp, ctx);
  return y;
#else
  (void)gelu;
  fail(ErrorKind::Unsupported, kOp, ": ", x.desc(), " is a CUDA tensor but this build has no CUDA");
#endif
}

}  // namespace

QuantizedActivation quantize_activation(const Tensor& x, Int8ActScheme act) {
  TD_CHECK(x.defined() && float_dtype(x.dtype()), DType, "quantize_activation: x must be f32, bf16 or f16, got ",
           x.defined() ? x.desc() : std::string("nothing"));
  QuantizedActivation a;
  a.x = x;
  a.act = act;
  const Rows r = as_rows(x, "quantize_activation", "x");
  if (r.rows == 0) return a;
  if (x.device().is_cuda()) {
#if TURBODIFF_HAVE_CUDA
    if (!cuda_int8_rows(r, x.dtype())) return a;  // every int8_linear on it takes the fallback
    cuda::set_device(x.device().index);
#else
    fail(ErrorKind::Unsupported, "quantize_activation: ", x.desc(), " is a CUDA tensor but this build has no CUDA");
#endif
  }
  quantize_act_into(r, x.dtype(), x.device(), act, a);
  return a;
}

QuantizedActivation quantized_activation_buffers(const Tensor& x, Int8ActScheme act) {
  QuantizedActivation a;
  a.x = x;
  a.act = act;
  const Rows r = as_rows(x, "quantized_activation_buffers", "x");
  const bool int8_path = x.device().is_cpu() ? r.rows > 0 : cuda_int8_rows(r, x.dtype());
  if (int8_path) allocate_act(r.rows, r.dim, x.device(), act, a);
  return a;
}

Tensor int8_linear(const Tensor& x, const Int8LinearWeight& w, const Tensor& bias, Int8ActScheme act,
                   std::optional<DType> out_dtype_opt, bool gelu) {
  const DType out_dtype = out_dtype_opt.value_or(x.defined() ? x.dtype() : DType::F32);
  const Rows r = check_call(x, w, bias, act, out_dtype);
  // Quantize only where an INT8 kernel will read the codes.
  QuantizedActivation a;
  a.x = x;
  a.act = act;
  const bool int8_path =
      x.device().is_cpu() ? (r.rows > 0 && w.out_features() > 0)
                          : cuda_int8_rows(r, x.dtype()) && out_dtype == DType::BF16 && w.out_features() > 0;
  if (int8_path) quantize_act_into(r, x.dtype(), x.device(), act, a);
  return run_int8_linear(a, r, w, bias, out_dtype, gelu);
}

Tensor int8_linear(const QuantizedActivation& a, const Int8LinearWeight& w, const Tensor& bias,
                   std::optional<DType> out_dtype_opt, bool gelu) {
  const DType out_dtype = out_dtype_opt.value_or(a.x.defined() ? a.x.dtype() : DType::F32);
  const Rows r = check_call(a.x, w, bias, a.act, out_dtype);
  if (a.codes.defined())
    TD_CHECK(a.codes.dtype() == DType::I8 && a.codes.dim() == 2 && a.codes.size(0) == r.rows &&
                 a.codes.size(1) == r.dim && a.codes.device() == a.x.device() && a.scale.defined(),
             Usage, kOp, ": the quantized activation ", a.codes.desc(), " does not belong to x ", a.x.desc());
  return run_int8_linear(a, r, w, bias, out_dtype, gelu);
}

}  // namespace td::ops
