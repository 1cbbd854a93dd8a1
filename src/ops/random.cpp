#include "ops/random.h"

#include "core/cuda_runtime.h"
#include "kernels/random/philox_fill.h"
#include "ops/common.h"

namespace td::ops {

void random_fill_(Tensor& t, uint64_t seed, uint64_t stream, float lo, float hi) {
  static const char* op = "random_fill";
  TD_CHECK(t.defined() && t.is_contiguous(), Shape, op, ": needs a contiguous tensor, got ",
           t.defined() ? t.desc() : std::string("undefined"));
  kernels::RandomFill f;
  f.seed = seed;
  f.stream = stream;
  f.n = t.numel();
  f.out_type = t.dtype() == DType::I8 ? kernels::ElemType::I8 : elem_type(t.dtype(), op, "t");
  f.lo = lo;
  f.hi = hi;
  f.out = t.raw_data();
  kernels::Status s;
#if TURBODIFF_HAVE_CUDA
  if (t.device().is_cuda())
    s = kernels::random_fill_cuda(f, cuda::current_stream());
  else
#endif
    s = kernels::random_fill_cpu(f);
  check_status(s, op, t.desc());
}

}  // namespace td::ops
