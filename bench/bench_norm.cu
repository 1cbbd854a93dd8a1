// Benchmark of the norm and elementwise kernels at Wan's shapes (1.3B 480p:
// 32760 x 1536; 14B 720p: 75600 x 5120), bf16 activations. For each op: the
// median time (CUDA events, after warm-up), the bytes the op must move (each
// input read once, each output written once; the fp32 parameter vectors are
// negligible and not counted), the achieved bandwidth, its fraction of the
// device-copy bandwidth measured in the same run, and the time predicted at
// 4.0 TB/s. Prints one JSON object; bench/torch_norm.py prints the same keys
// for PyTorch on the same GPU.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "kernels/elementwise/activation.h"
#include "kernels/elementwise/broadcast_binary.h"
#include "kernels/norm/adaln_modulate.h"
#include "kernels/norm/layer_norm.h"
#include "kernels/norm/residual_gate_norm.h"
#include "kernels/norm/rms_norm.h"

namespace {

using td::bench::Timing;
using td::kernels::ElemType;
using td::kernels::Status;

void require_ok(Status s, const char* what) {
  if (s != Status::Ok) {
    std::fprintf(stderr, "bench_norm: %s returned '%s'\n", what, td::kernels::status_str(s));
    std::exit(1);
  }
}

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  TD_BENCH_CUDA(cudaMalloc(&p, bytes));
  return p;
}

struct Shape {
  int64_t rows, dim;
};

nlohmann::json bench_shape(Shape shape, cudaStream_t stream) {
  const int64_t rows = shape.rows, dim = shape.dim;
  const size_t n = size_t(rows * dim);
  const double copy_gbps = td::bench::copy_bandwidth_gbps(n * 4, stream);  // an fp32-sized tensor, well past L2

  // Inputs rotate among `sets` copies when one set would fit in L2 (not at these shapes).
  const int sets = td::bench::rotation_count(n * 2 * 2);
  const size_t nsets = static_cast<size_t>(sets);
  std::vector<void*> x(nsets), y(nsets), x32(nsets);
  for (int i = 0; i < sets; ++i) {
    x[size_t(i)] = device_alloc(n * 2);
    y[size_t(i)] = device_alloc(n * 2);
    x32[size_t(i)] = device_alloc(n * 4);
    td::bench::fill_random_bf16(x[size_t(i)], n, 1.f, 11u + unsigned(i), stream);
    td::bench::fill_random_bf16(y[size_t(i)], n, 1.f, 23u + unsigned(i), stream);
    td::bench::fill_random_f32(x32[size_t(i)], n, 1.f, 37u + unsigned(i), stream);
  }
  void* out = device_alloc(n * 2);
  void* x_out = device_alloc(n * 2);
  void* x_out32 = device_alloc(n * 4);
  // fp32 parameters: weight, bias [dim]; Wan's e0 [6, dim] (one sample: rows_per_batch = rows)
  auto* params = static_cast<float*>(device_alloc(size_t(8 * dim) * 4));
  td::bench::fill_random_f32(params, size_t(8 * dim), 0.5f, 51u, stream);
  const float* weight = params;
  const float* bias = params + dim;
  const float* e0 = params + 2 * dim;
  const float* shift_msa = e0;
  const float* scale_msa = e0 + dim;
  const float* gate_msa = e0 + 2 * dim;
  const int64_t mod_stride = 6 * dim;
  const float eps = 1e-6f;
  auto X = [&](int i) { return x[size_t(i % sets)]; };
  auto Y = [&](int i) { return y[size_t(i % sets)]; };
  auto X32 = [&](int i) { return x32[size_t(i % sets)]; };
  const auto BF = ElemType::BF16;

  nlohmann::json ops;
  auto record = [&](const char* name, double bytes, const std::function<Status(int)>& fn) {
    require_ok(fn(0), name);
    TD_BENCH_CUDA(cudaStreamSynchronize(stream));
    const Timing t = td::bench::time_cuda([&](int i) { fn(i); }, stream);
    const double gbps = bytes / (t.median_ms * 1e-3) / 1e9;
    ops[name] = {{"ms", t.median_ms},
                 {"min_ms", t.min_ms},
                 {"bytes", bytes},
                 {"TBps", gbps / 1e3},
                 {"frac_of_copy", gbps / copy_gbps},
                 {"frac_of_copy_same_traffic", gbps / td::bench::copy_bandwidth_same_traffic_gbps(bytes, stream)},
                 {"predicted_ms_at_4TBps", bytes / 4e12 * 1e3}};
  };
  const double E = double(n);

  // The defaults (rms_norm: the row engine; layer_norm, adaln_modulate: Lean)
  // and the other kernel of each op (norm_variant.h), same run.
  record("rms_norm", 4 * E, [&](int i) {
    return td::kernels::rms_norm_cuda(X(i), BF, dim, out, BF, dim, weight, rows, dim, eps, stream);
  });
  record("layer_norm", 4 * E, [&](int i) {
    return td::kernels::layer_norm_cuda(X(i), BF, dim, out, BF, dim, weight, bias, rows, dim, eps, stream);
  });
  record("adaln_modulate", 4 * E, [&](int i) {
    return td::kernels::adaln_modulate_cuda(X(i), BF, dim, out, BF, dim, scale_msa, shift_msa, mod_stride, rows,
                                            rows, dim, eps, stream);
  });
  record("rms_norm_lean", 4 * E, [&](int i) {
    return td::kernels::rms_norm_cuda(X(i), BF, dim, out, BF, dim, weight, rows, dim, eps, stream,
                                      td::kernels::NormRowsKernel::Lean);
  });
  record("layer_norm_rows", 4 * E, [&](int i) {
    return td::kernels::layer_norm_cuda(X(i), BF, dim, out, BF, dim, weight, bias, rows, dim, eps, stream,
                                        td::kernels::NormRowsKernel::Rows);
  });
  record("adaln_modulate_one", 4 * E, [&](int i) {
    return td::kernels::adaln_modulate_cuda(X(i), BF, dim, out, BF, dim, scale_msa, shift_msa, mod_stride, rows,
                                            rows, dim, eps, stream, td::kernels::AdaLnRows::One);
  });
  // x += gate * y; out = LN(x) * (1 + scale) + shift (the FFN -> next block's norm1 step)
  auto rgn = [&](int i, bool f32_residual) {
    td::kernels::ResidualGateNormParams p;
    p.x = f32_residual ? X32(i) : X(i);
    p.x_out = f32_residual ? x_out32 : x_out;
    p.x_stride = p.x_out_stride = dim;
    p.residual_type = f32_residual ? ElemType::F32 : BF;
    p.y = Y(i);
    p.y_type = BF;
    p.y_stride = dim;
    p.out = out;
    p.out_type = BF;
    p.out_stride = dim;
    p.gate = gate_msa;
    p.scale = scale_msa;
    p.shift = shift_msa;
    p.mod_stride = mod_stride;
    p.rows_per_batch = rows;
    p.rows = rows;
    p.dim = dim;
    p.eps = eps;
    return td::kernels::residual_gate_norm_cuda(p, stream);
  };
  record("residual_gate_norm_bf16", 8 * E, [&](int i) { return rgn(i, false); });
  record("residual_gate_norm_f32res", 12 * E, [&](int i) { return rgn(i, true); });
  record("gelu_tanh", 4 * E, [&](int i) {
    return td::kernels::activation_cuda(td::kernels::Activation::GeluTanh, X(i), BF, dim, out, BF, dim, rows, dim,
                                        stream);
  });
  record("silu", 4 * E, [&](int i) {
    return td::kernels::activation_cuda(td::kernels::Activation::Silu, X(i), BF, dim, out, BF, dim, rows, dim, stream);
  });
  auto binary = [&](int i, td::kernels::BinaryOp op, td::kernels::Broadcast bc) {
    td::kernels::BroadcastBinaryParams p;
    p.op = op;
    p.broadcast = bc;
    p.a = X(i);
    p.a_type = BF;
    p.a_stride = dim;
    p.b = bc == td::kernels::Broadcast::Full ? Y(i) : static_cast<const void*>(scale_msa);
    p.b_stride = bc == td::kernels::Broadcast::Full ? dim : mod_stride;
    p.rows_per_batch = rows;
    p.out = out;
    p.out_type = BF;
    p.out_stride = dim;
    p.rows = rows;
    p.dim = dim;
    return td::kernels::broadcast_binary_cuda(p, stream);
  };
  record("add_full", 6 * E,
         [&](int i) { return binary(i, td::kernels::BinaryOp::Add, td::kernels::Broadcast::Full); });
  record("add_vector", 4 * E,
         [&](int i) { return binary(i, td::kernels::BinaryOp::Add, td::kernels::Broadcast::Vector); });
  record("mul_per_sample", 4 * E,
         [&](int i) { return binary(i, td::kernels::BinaryOp::Mul, td::kernels::Broadcast::PerSample); });

  for (int i = 0; i < sets; ++i) {
    cudaFree(x[size_t(i)]);
    cudaFree(y[size_t(i)]);
    cudaFree(x32[size_t(i)]);
  }
  cudaFree(out);
  cudaFree(x_out);
  cudaFree(x_out32);
  cudaFree(params);
  return {{"copy_TBps", copy_gbps / 1e3},
          {"copy_same_traffic_TBps", td::bench::copy_bandwidth_same_traffic_gbps(4.0 * E, stream) / 1e3},
          {"input_sets", sets},
          {"ops", ops}};
}

}  // namespace

int main() {
  cudaStream_t stream;
  TD_BENCH_CUDA(cudaStreamCreate(&stream));
  nlohmann::json result;
  result["bench"] = "norm";
  result["impl"] = "turbodiff";
  result["device"] = td::bench::device_json();
  result["activations"] = "bf16";
  for (const Shape s : {Shape{32760, 1536}, Shape{75600, 5120}})
    result["shapes"][std::to_string(s.rows) + "x" + std::to_string(s.dim)] = bench_shape(s, stream);
  TD_BENCH_CUDA(cudaStreamDestroy(stream));
  std::printf("%s\n", result.dump(1).c_str());
  return 0;
}
