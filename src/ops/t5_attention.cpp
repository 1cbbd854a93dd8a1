#include "ops/t5_attention.h"

#include <algorithm>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "kernels/t5_attention/t5_attention.h"
#include "ops/common.h"

namespace td::ops {
namespace {
constexpr const char* kOp = "t5_attention";
}

Tensor t5_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias_table,
                    const std::vector<int32_t>& rel_bucket, const Tensor& key_mask, std::optional<DType> out_dtype) {
  TD_CHECK(q.defined() && q.dim() == 4, Shape, kOp, ": q must be [B, L, H, D], got ",
           q.defined() ? q.desc() : std::string("undefined"));
  TD_CHECK(k.shape() == q.shape() && v.shape() == q.shape(), Shape, kOp, ": q, k, v must share one shape, got ",
           q.desc(), ", ", k.desc(), ", ", v.desc());
  TD_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), DType, kOp, ": q, k, v must share one dtype, got ",
           q.desc(), ", ", k.desc(), ", ", v.desc());
  TD_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), Shape, kOp,
           ": q, k, v must be contiguous, got ", q.desc(), ", ", k.desc(), ", ", v.desc());
  check_same_device(kOp, {{"q", &q}, {"k", &k}, {"v", &v}, {"bias_table", &bias_table}});
  const int64_t B = q.size(0), L = q.size(1), H = q.size(2), D = q.size(3);
  TD_CHECK(bias_table.dim() == 2 && bias_table.size(1) == H && bias_table.dtype() == DType::F32 &&
               bias_table.is_contiguous(),
           Shape, kOp, ": bias_table must be contiguous f32 [num_buckets, ", H, "], got ", bias_table.desc());
  TD_CHECK(int64_t(rel_bucket.size()) == 2 * L - 1, Shape, kOp, ": rel_bucket has ", rel_bucket.size(),
           " entries, expected 2L - 1 = ", 2 * L - 1);
  for (size_t r = 0; r < rel_bucket.size(); ++r)
    TD_CHECK(rel_bucket[r] >= 0 && rel_bucket[r] < bias_table.size(0), Usage, kOp, ": rel_bucket[", r, "] = ",
             rel_bucket[r], " is outside the table's ", bias_table.size(0), " buckets");
  TD_CHECK(key_mask.device().is_cpu() && key_mask.dtype() == DType::I64 && key_mask.shape() == Shape({B, L}), Shape,
           kOp, ": key_mask must be host i64 [", B, ", ", L, "], got ", key_mask.desc());
  const Tensor mask64 = key_mask.contiguous();
  Tensor mask32 = Tensor::empty({B, L}, DType::I32);
  for (int64_t b = 0; b < B; ++b) {
    bool any = false;
    for (int64_t j = 0; j < L; ++j) {
      const bool on = mask64.data<int64_t>()[b * L + j] != 0;
      mask32.data<int32_t>()[b * L + j] = on ? 1 : 0;
      any |= on;
    }
    TD_CHECK(any, Usage, kOp, ": sample ", b, " of the batch has no unmasked token (key_mask row all zero)");
  }
  Tensor buckets = Tensor::empty({2 * L - 1}, DType::I32);
  std::copy(rel_bucket.begin(), rel_bucket.end(), buckets.data<int32_t>());
  const DType ot = out_dtype.value_or(q.dtype());

  kernels::T5AttentionArgs a{};
  a.batch = B;
  a.len = L;
  a.heads = H;
  a.head_dim = D;
  a.num_buckets = bias_table.size(0);
  a.bias_table = bias_table.data<float>();
  if (q.device().is_cuda()) {
#if TURBODIFF_HAVE_CUDA
    const Tensor mask_d = mask32.to(q.device()), buckets_d = buckets.to(q.device());
    Tensor out = Tensor::empty(q.shape(), ot, q.device());
    a.q = q.raw_data();
    a.k = k.raw_data();
    a.v = v.raw_data();
    a.qkv_type = elem_type(q.dtype(), kOp, "q");
    a.rel_bucket = buckets_d.data<int32_t>();
    a.key_mask = mask_d.data<int32_t>();
    a.out = out.raw_data();
    a.out_type = elem_type(ot, kOp, "output");
    check_status(kernels::t5_attention_cuda(a, cuda::current_stream()), kOp, q.desc());
    return out;
#else
    fail(ErrorKind::Unsupported, kOp, ": ", q.desc(), " is a CUDA tensor but this build has no CUDA");
#endif
  }
  // Host: the fp32 reference on fp32 copies.
  const Tensor qf = q.to(DType::F32), kf = k.to(DType::F32), vf = v.to(DType::F32);
  Tensor out = Tensor::empty(q.shape(), DType::F32);
  a.q = qf.raw_data();
  a.k = kf.raw_data();
  a.v = vf.raw_data();
  a.qkv_type = kernels::ElemType::F32;
  a.rel_bucket = buckets.data<int32_t>();
  a.key_mask = mask32.data<int32_t>();
  a.out = out.raw_data();
  a.out_type = kernels::ElemType::F32;
  check_status(kernels::t5_attention_cpu(a), kOp, q.desc());
  return ot == DType::F32 ? out : out.to(ot);
}

}  // namespace td::ops
