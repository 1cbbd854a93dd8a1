// The CUDA elementwise kernels (src/kernels/elementwise/*.cu) against their
// fp32 CPU references on the same fresh random inputs: every activation type
// and type pair, awkward sizes (rows 1, 37, 333; widths on the vector and the
// scalar path, rows split into several column tiles), Wan's full shapes,
// in-place use, and poisoned outputs whose row padding must survive.
//
// Tolerances: add/mul are one fp32 operation on both sides, so outputs are
// bit-identical. The activations differ by the GPU's exp/divide (__expf,
// __fdividef: ~1e-6 relative at |x| ~ 10, less near 0) against the CPU's
// tanhf/expf, and by the tanh form's cancellation on the CPU where GELU is
// below ~1e-4 (absolute error ~1e-7). So: every element within 1 ulp of the
// output type + 4e-6 * (1 + |ref|); rel_l2 <= 2e-6 (fp32), 2e-4 (fp16),
// 1e-3 (bf16), cosine >= 0.99999.
#include <cuda_runtime_api.h>

#include <cmath>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "harness/device_buffer.h"
#include "kernels/elementwise/activation.h"
#include "kernels/elementwise/broadcast_binary.h"
#include "kernels/norm/norm_host.h"

namespace td::kernels {
namespace {

using namespace test_rows;

constexpr ElemType kActTypes[] = {ElemType::F32, ElemType::F16, ElemType::BF16};
constexpr int64_t kRowCounts[] = {1, 37, 333};
constexpr int64_t kDims[] = {64, 77, 96, 1000, 1536, 5120, 13824};  // 13824: Wan-14B's FFN width, 2 column tiles


// exact: add/mul must match bit for bit (the same single fp32 operation and rounding).
void expect_matches_cpu(const Rows& gpu, const Rows& cpu, const std::string& what, bool exact = false) {
  SCOPED_TRACE(what);
  const std::vector<double> got = gpu.values(), ref = cpu.values();
  ASSERT_EQ(got.size(), ref.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = exact ? 0.0 : ulp(gpu.type, ref[i]) + 4e-6 * (1.0 + std::fabs(ref[i]));
    if (!(std::fabs(got[i] - ref[i]) <= tol)) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << "first bad element " << first << " (row " << first / size_t(gpu.dim) << ", col "
                     << first % size_t(gpu.dim) << "): gpu " << got[first] << " vs cpu " << ref[first]
                     << " seed=" << test::current_seed();
  const double max_rel_l2 = gpu.type == ElemType::F32 ? 2e-6 : gpu.type == ElemType::F16 ? 2e-4 : 1e-3;
  TD_EXPECT_CLOSE(test::compare(got, ref), max_rel_l2, 0.99999);
  EXPECT_EQ(gpu.padding_written(), 0u) << "row padding overwritten";
}

const char* act_name(Activation a) { return a == Activation::GeluTanh ? "gelu_tanh" : "silu"; }

void check_activation(Activation act, ElemType xt, ElemType yt, int64_t rows, int64_t dim, int64_t x_pad = 0,
                      int64_t y_pad = 0, int64_t x_offset = 0, bool in_place = false) {
  if (in_place) yt = xt, y_pad = x_pad;
  const int64_t xs = dim + x_pad, ys = dim + y_pad;
  const Rows x = random_rows(xt, rows, dim, xs, 0.f, 3.f, x_offset);
  Rows ref(yt, rows, dim, ys);
  ASSERT_EQ(activation_cpu(act, x.data(), xt, xs, ref.data(), yt, ys, rows, dim), Status::Ok);
  DeviceBuffer dx(x);
  Rows out(yt, rows, dim, ys);
  if (in_place) out = x;
  DeviceBuffer dy(out);
  const DeviceBuffer& dst = in_place ? dx : dy;
  ASSERT_EQ(activation_cuda(act, dx.at(x), xt, xs, dst.at(out), yt, ys, rows, dim, nullptr), Status::Ok);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dst.download(out);
  expect_matches_cpu(out, ref,
                     std::string(act_name(act)) + " " + type_name(xt) + "->" + type_name(yt) + " " +
                         std::to_string(rows) + "x" + std::to_string(dim) + (in_place ? " in place" : "") +
                         (x_offset ? " misaligned" : ""));
}

struct BinaryCase {
  BinaryOp op;
  Broadcast broadcast;
};
constexpr BinaryCase kBinaryCases[] = {{BinaryOp::Add, Broadcast::Full},      {BinaryOp::Mul, Broadcast::Full},
                                       {BinaryOp::Add, Broadcast::Vector},    {BinaryOp::Mul, Broadcast::Vector},
                                       {BinaryOp::Add, Broadcast::PerSample}, {BinaryOp::Mul, Broadcast::PerSample}};

std::string binary_name(const BinaryCase& c) {
  const char* b = c.broadcast == Broadcast::Full ? "full" : c.broadcast == Broadcast::Vector ? "vector" : "per_sample";
  return std::string(c.op == BinaryOp::Add ? "add_" : "mul_") + b;
}

void check_binary(const BinaryCase& c, ElemType at, ElemType ot, int64_t rows, int64_t dim, int64_t pad = 0,
                  bool in_place = false, int64_t a_offset = 0) {
  if (in_place) ot = at;
  const int64_t rows_per_batch = std::max<int64_t>(1, (rows + 2) / 3);
  const int64_t batch = (rows + rows_per_batch - 1) / rows_per_batch;
  const int64_t as = dim + pad, bs = dim + 2 * pad, os = in_place ? as : dim + 3 * pad;
  const Rows a = random_rows(at, rows, dim, as, 0.f, 1.f, a_offset);
  const Rows b_full = random_rows(at, rows, dim, bs, 0.f, 1.f);
  const int64_t vec_stride = dim + 4;
  const std::vector<float> b_vec = test::randn(size_t(batch * vec_stride), 1.f, 0.5f);
  Rows ref(ot, rows, dim, os);

  BroadcastBinaryParams p;
  p.op = c.op;
  p.broadcast = c.broadcast;
  p.a_type = at;
  p.a_stride = as;
  p.b_stride = c.broadcast == Broadcast::Full ? bs : vec_stride;
  p.rows_per_batch = rows_per_batch;
  p.out_type = ot;
  p.out_stride = os;
  p.rows = rows;
  p.dim = dim;
  p.a = a.data();
  p.b = c.broadcast == Broadcast::Full ? b_full.data() : static_cast<const void*>(b_vec.data());
  p.out = ref.data();
  ASSERT_EQ(broadcast_binary_cpu(p), Status::Ok);

  DeviceBuffer da(a), db_full(b_full), db_vec(b_vec);
  Rows out(ot, rows, dim, os);
  if (in_place) out = a;
  DeviceBuffer dout(out);
  const DeviceBuffer& dst = in_place ? da : dout;
  p.a = da.at(a);
  p.b = c.broadcast == Broadcast::Full ? db_full.at(b_full) : static_cast<const void*>(db_vec.f32());
  p.out = dst.at(out);
  ASSERT_EQ(broadcast_binary_cuda(p, nullptr), Status::Ok);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dst.download(out);
  expect_matches_cpu(out, ref,
                     binary_name(c) + " " + type_name(at) + "->" + type_name(ot) + " " + std::to_string(rows) + "x" +
                         std::to_string(dim) + (in_place ? " in place" : "") + (a_offset ? " misaligned" : ""),
                     /*exact=*/true);
}

TEST(ActivationGpu, MatchesCpuEveryTypeAndSize) {
  TD_REQUIRE_GPU();
  for (Activation act : {Activation::GeluTanh, Activation::Silu})
    for (ElemType t : kActTypes)
      for (int64_t rows : kRowCounts)
        for (int64_t dim : kDims) check_activation(act, t, t, rows, dim);
}

TEST(ActivationGpu, MixedTypesStridesMisalignmentInPlace) {
  TD_REQUIRE_GPU();
  for (Activation act : {Activation::GeluTanh, Activation::Silu}) {
    for (ElemType xt : kActTypes)
      for (ElemType yt : kActTypes) {
        check_activation(act, xt, yt, 37, 1000, 8, 24);
        check_activation(act, xt, yt, 37, 77, 3, 0);
      }
    for (ElemType t : kActTypes) {
      check_activation(act, t, t, 333, 5120, 16, 0, 0, /*in_place=*/true);
      check_activation(act, t, t, 37, 1536, 0, 0, /*x_offset=*/1);
    }
  }
}

TEST(ActivationGpu, WanShapes) {
  TD_REQUIRE_GPU();
  check_activation(Activation::GeluTanh, ElemType::BF16, ElemType::BF16, 4099, 8960);   // 1.3B FFN hidden
  check_activation(Activation::GeluTanh, ElemType::BF16, ElemType::BF16, 1031, 13824);  // 14B FFN hidden
  check_activation(Activation::Silu, ElemType::F32, ElemType::F32, 1, 1536 * 6);       // time projection input
  check_activation(Activation::Silu, ElemType::BF16, ElemType::BF16, 7, 1 << 20);        // many column tiles
}

TEST(BroadcastBinaryGpu, MatchesCpuEveryTypeAndSize) {
  TD_REQUIRE_GPU();
  for (const BinaryCase& c : kBinaryCases)
    for (ElemType t : kActTypes)
      for (int64_t rows : kRowCounts)
        for (int64_t dim : kDims) check_binary(c, t, t, rows, dim);
}

TEST(BroadcastBinaryGpu, MixedTypesStridesMisalignmentInPlace) {
  TD_REQUIRE_GPU();
  for (const BinaryCase& c : kBinaryCases) {
    for (ElemType at : kActTypes)
      for (ElemType ot : kActTypes) {
        check_binary(c, at, ot, 37, 96, 8);
        check_binary(c, at, ot, 37, 77, 1);
      }
    for (ElemType t : kActTypes) {
      check_binary(c, t, t, 333, 1536, 16, /*in_place=*/true);
      check_binary(c, t, t, 37, 1000, 0, false, /*a_offset=*/1);
    }
  }
}

TEST(BroadcastBinaryGpu, WanShapes) {
  TD_REQUIRE_GPU();
  // The full 32760-row shape once per op (indexing at size); the broadcast
  // kinds at a tenth of the rows: the host-side reference dominates this
  // test's time, and device time is scarce.
  for (const BinaryCase& c : kBinaryCases) {
    const bool full = c.broadcast == Broadcast::Full;
    check_binary(c, ElemType::BF16, ElemType::BF16, full ? 32760 : 3277, 1536);
    check_binary(c, ElemType::BF16, ElemType::BF16, 1031, 5120, 0, /*in_place=*/true);
  }
}

}  // namespace
}  // namespace td::kernels
