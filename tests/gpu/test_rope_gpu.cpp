// The CUDA fused q/k RMSNorm + Wan 3-D RoPE against its CPU reference (which
// tests/cpu/test_rope_ref.cpp checks against a direct complex fp64 rope_apply),
// on fresh random inputs: head_dim 64, 80, 96 and 128 (80 and 96 put an axis
// boundary inside an 8-element pack), awkward grids and head counts, batch > 1,
// both output layouts, bf16 / fp16 / fp32 inputs with same-type or fp32
// outputs, padded input strides, poisoned outputs, and Wan 1.3B 480p
// (21 x 30 x 52 tokens, 12 heads x 128). Every case runs every kernel variant
// (QkRopeKernel::GlobalTables and ::SharedAngles) against the same reference.
//
// Bars: the GPU sums x^2 in a tree and uses fused multiply-adds, so before
// the final rounding it differs from the reference by a few fp32 ulp
// (~1e-6 relative). fp32 outputs: every element within 1e-5 (1 + |ref|).
// 16-bit outputs: both sides round once, so an element differs by at most one
// unit in the last place of the output type (2^-7 |ref| for bf16, 2^-10 for
// fp16) where the fp32 values straddle a rounding boundary, and the tensors'
// relative L2 difference stays below 2e-3 (bf16) / 3e-4 (fp16).
#include <cmath>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/dtype.h"
#include "harness/harness.h"
#include "kernels/rope/qk_norm_rope.h"
#include "kernels/rope/rope_tables.h"

#if TURBODIFF_HAVE_CUDA

namespace td::kernels {
namespace {

constexpr double kTheta = 10000.0;
constexpr float kEps = 1e-6f;

DType dtype_of(ElemType t) { return t == ElemType::F32 ? DType::F32 : t == ElemType::F16 ? DType::F16 : DType::BF16; }
const char* type_name(ElemType t) { return t == ElemType::F32 ? "f32" : t == ElemType::F16 ? "f16" : "bf16"; }
size_t elem_bytes(ElemType t) { return t == ElemType::F32 ? 4 : 2; }

struct DeviceBuf {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuf(size_t n) : bytes(n) { ptr = cuda::device_alloc(std::max<size_t>(n, 1), 0); }
  ~DeviceBuf() { cuda::device_free(ptr, 0); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  void upload(const void* host) { cuda::memcpy_sync(ptr, host, bytes, true); }
  void download(void* host) const { cuda::memcpy_sync(host, ptr, bytes, false); }
};

struct RopeCase {
  int64_t batch, frames, height, width;
  int heads, head_dim;
};

std::vector<unsigned char> random_rows(ElemType t, int64_t rows, int64_t dim, int64_t ld) {
  std::vector<unsigned char> b(size_t(rows * ld) * elem_bytes(t));
  test::poison(b.data(), b.size(), dtype_of(t));
  const std::vector<float> v = test::randn(size_t(rows * dim), 0.f, 3.f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dim; ++c) store_from_f64(b.data(), dtype_of(t), size_t(r * ld + c), v[size_t(r * dim + c)]);
  return b;
}

void check_case(const RopeCase& rc, ElemType in_type, ElemType out_type, RopeOutLayout layout) {
  const int64_t L = rc.frames * rc.height * rc.width, rows = rc.batch * L, dim = int64_t(rc.heads) * rc.head_dim;
  const int64_t ld_q = dim + 8, ld_k = dim + 24;
  const std::string what = std::string(type_name(in_type)) + "->" + type_name(out_type) +
                           (layout == RopeOutLayout::BLHD ? " BLHD " : " BHLD ") + std::to_string(rc.batch) + "x(" +
                           std::to_string(rc.frames) + "x" + std::to_string(rc.height) + "x" +
                           std::to_string(rc.width) + ") heads " + std::to_string(rc.heads) + " x " +
                           std::to_string(rc.head_dim);
  const std::vector<unsigned char> q = random_rows(in_type, rows, dim, ld_q), k = random_rows(in_type, rows, dim, ld_k);
  const std::vector<float> wq = test::randn(size_t(dim), 1.f, 0.2f), wk = test::randn(size_t(dim), 1.f, 0.2f);
  const RopeTableLayout tl = rope_table_layout(rc.head_dim, rc.frames, rc.height, rc.width);
  std::vector<float> tables(size_t(tl.total));
  ASSERT_EQ(rope_tables_cpu(rc.head_dim, rc.frames, rc.height, rc.width, kTheta, tables.data()), Status::Ok);

  const size_t out_bytes = size_t(rows * dim) * elem_bytes(out_type);
  std::vector<unsigned char> q_ref(out_bytes), k_ref(out_bytes), q_gpu(out_bytes), k_gpu(out_bytes);
  ASSERT_EQ(qk_norm_rope_cpu(in_type, q.data(), ld_q, k.data(), ld_k, wq.data(), wk.data(), rc.batch, rc.frames,
                             rc.height, rc.width, rc.heads, rc.head_dim, kEps, tables.data(), layout, out_type,
                             q_ref.data(), k_ref.data()),
            Status::Ok);

  DeviceBuf dq(q.size()), dk(k.size()), dwq(wq.size() * 4), dwk(wk.size() * 4), dt(tables.size() * 4),
      dqo(out_bytes), dko(out_bytes);
  dq.upload(q.data()), dk.upload(k.data()), dwq.upload(wq.data()), dwk.upload(wk.data()), dt.upload(tables.data());
  // Every kernel variant against the same reference, outputs poisoned before each.
  for (QkRopeKernel kernel :
       {QkRopeKernel::GlobalTables, QkRopeKernel::SharedAngles, QkRopeKernel::SharedAnglesWarpRows}) {
    const std::string kwhat = what + (kernel == QkRopeKernel::GlobalTables   ? " [GlobalTables]"
                                      : kernel == QkRopeKernel::SharedAngles ? " [SharedAngles]"
                                                                             : " [SharedAnglesWarpRows]");
    test::poison(q_gpu.data(), q_gpu.size(), dtype_of(out_type));
    test::poison(k_gpu.data(), k_gpu.size(), dtype_of(out_type));
    dqo.upload(q_gpu.data()), dko.upload(k_gpu.data());
    cuda::Stream s(0);
    ASSERT_EQ(qk_norm_rope_cuda(in_type, dq.ptr, ld_q, dk.ptr, ld_k, static_cast<const float*>(dwq.ptr),
                                static_cast<const float*>(dwk.ptr), rc.batch, rc.frames, rc.height, rc.width, rc.heads,
                                rc.head_dim, kEps, static_cast<const float*>(dt.ptr), layout, out_type, dqo.ptr,
                                dko.ptr, s.native(), kernel),
              Status::Ok)
        << kwhat;
    s.synchronize();
    dqo.download(q_gpu.data()), dko.download(k_gpu.data());

    const double ulp_rel = out_type == ElemType::BF16 ? 0x1p-7 : out_type == ElemType::F16 ? 0x1p-10 : 0.0;
    const double max_rel_l2 = out_type == ElemType::BF16 ? 2e-3 : out_type == ElemType::F16 ? 3e-4 : 1e-5;
    for (int which = 0; which < 2; ++which) {
      const std::vector<unsigned char>& got_b = which ? k_gpu : q_gpu;
      const std::vector<unsigned char>& ref_b = which ? k_ref : q_ref;
      std::vector<double> got(size_t(rows * dim)), ref(got.size());
      for (size_t i = 0; i < got.size(); ++i) {
        got[i] = load_as_f64(got_b.data(), dtype_of(out_type), i);
        ref[i] = load_as_f64(ref_b.data(), dtype_of(out_type), i);
        ASSERT_LE(std::fabs(got[i] - ref[i]), ulp_rel * std::fabs(ref[i]) + 1e-5 * (1 + std::fabs(ref[i])))
            << kwhat << (which ? " k" : " q") << " element " << i << ": gpu " << got[i] << " cpu " << ref[i];
      }
      TD_EXPECT_CLOSE(test::compare(got, ref), max_rel_l2, 1 - max_rel_l2);
    }
  }
}

TEST(QkNormRopeGpu, AgainstReferenceAwkwardShapes) {
  TD_REQUIRE_GPU();
  const RopeCase cases[] = {{2, 3, 5, 7, 3, 128}, {1, 2, 3, 4, 5, 64}, {3, 1, 1, 9, 2, 64},
                            {1, 2, 2, 3, 4, 80},  {2, 1, 2, 2, 1, 96}, {1, 3, 4, 5, 40, 128}};
  for (const RopeCase& rc : cases)
    for (RopeOutLayout layout : {RopeOutLayout::BLHD, RopeOutLayout::BHLD}) {
      check_case(rc, ElemType::BF16, ElemType::BF16, layout);
      check_case(rc, ElemType::BF16, ElemType::F32, layout);
      check_case(rc, ElemType::F16, ElemType::F16, layout);
      check_case(rc, ElemType::F32, ElemType::F32, layout);
    }
}

TEST(QkNormRopeGpu, Wan13B480p) {
  TD_REQUIRE_GPU();
  const RopeCase wan{1, 21, 30, 52, 12, 128};
  check_case(wan, ElemType::BF16, ElemType::BF16, RopeOutLayout::BHLD);
  check_case(wan, ElemType::BF16, ElemType::BF16, RopeOutLayout::BLHD);
}

TEST(QkNormRopeGpu, RejectsWhatItCannotVectorize) {
  TD_REQUIRE_GPU();
  DeviceBuf buf(1 << 20);
  const float* f = static_cast<const float*>(buf.ptr);
  cuda::Stream s(0);
  auto call = [&](int heads, int head_dim, int64_t ld, ElemType in, ElemType out) {
    return qk_norm_rope_cuda(in, buf.ptr, ld, buf.ptr, ld, f, f, 1, 1, 2, 2, heads, head_dim, kEps, f,
                             RopeOutLayout::BHLD, out, buf.ptr, buf.ptr, s.native());
  };
  EXPECT_EQ(call(4, 36, 144, ElemType::BF16, ElemType::BF16), Status::InvalidArgument);  // head_dim % 8
  EXPECT_EQ(call(2, 64, 132, ElemType::BF16, ElemType::BF16), Status::InvalidArgument);  // ld % 8
  EXPECT_EQ(call(2, 64, 128, ElemType::BF16, ElemType::F16), Status::InvalidArgument);   // bf16 -> fp16
  EXPECT_EQ(call(600, 64, 38400, ElemType::BF16, ElemType::BF16), Status::InvalidArgument);  // dim > 32768
  s.synchronize();
}

}  // namespace
}  // namespace td::kernels

#endif  // TURBODIFF_HAVE_CUDA
