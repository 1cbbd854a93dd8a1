// The fp32 CPU references of the elementwise kernels
// (src/kernels/elementwise/*_cpu.cpp) against fp64 evaluations of their
// formulas, on fresh random inputs of awkward sizes, every activation type,
// poisoned outputs and row padding, in-place use and bad arguments.
//
// Tolerances: one fp32 evaluation rounded once to the output type, so each
// element is within half an ulp of the output type plus fp32 error
// (2e-6 * (1 + |exact|): tanh/exp are accurate to a few fp32 ulps, and the
// tanh form of GELU loses relative accuracy only where GELU is ~1e-4 or less);
// whole tensors: rel_l2 <= the unit roundoff (3.9e-3 bf16, 4.9e-4 fp16), 1e-6 fp32.
#include <cmath>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "harness/kernel_rows.h"
#include "kernels/elementwise/activation.h"
#include "kernels/elementwise/broadcast_binary.h"
#include "kernels/norm/norm_host.h"

namespace td::kernels {
namespace {

using namespace test_rows;

constexpr ElemType kActTypes[] = {ElemType::F32, ElemType::F16, ElemType::BF16};
constexpr int64_t kRowCounts[] = {1, 37, 333};
constexpr int64_t kDims[] = {64, 77, 96, 1000, 1536, 5120};


void expect_matches_exact(const Rows& out, const std::vector<double>& exact, const std::string& what) {
  const std::vector<double> got = out.values();
  ASSERT_EQ(got.size(), exact.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = 0.5 * ulp(out.type, exact[i]) + 2e-6 * (1.0 + std::fabs(exact[i]));
    if (!(std::fabs(got[i] - exact[i]) <= tol)) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": first bad element " << first << ": " << got[first] << " vs exact " << exact[first]
                     << " seed=" << test::current_seed();
  const double max_rel_l2 = out.type == ElemType::F32 ? 1e-6 : out.type == ElemType::F16 ? 4.9e-4 : 3.9e-3;
  const double min_cos = out.type == ElemType::BF16 ? 0.99999 : 0.999999;
  SCOPED_TRACE(what);
  TD_EXPECT_CLOSE(test::compare(got, exact), max_rel_l2, min_cos);
  EXPECT_EQ(out.padding_written(), 0u) << what << ": row padding overwritten";
}

double gelu_tanh_exact(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}
double silu_exact(double x) { return x / (1.0 + std::exp(-x)); }

std::vector<double> activation_exact(Activation act, const Rows& x) {
  std::vector<double> out;
  for (double v : x.values()) out.push_back(act == Activation::GeluTanh ? gelu_tanh_exact(v) : silu_exact(v));
  return out;
}

const char* act_name(Activation a) { return a == Activation::GeluTanh ? "gelu_tanh" : "silu"; }

// ---- activations -------------------------------------------------------------------

TEST(ActivationRef, MatchesFp64EveryTypeAndSize) {
  for (Activation act : {Activation::GeluTanh, Activation::Silu})
    for (ElemType t : kActTypes)
      for (int64_t rows : kRowCounts)
        for (int64_t dim : kDims) {
          const Rows x = random_rows(t, rows, dim, dim, 0.f, 3.f);  // reaches the saturated tails
          Rows y(t, rows, dim, dim);
          ASSERT_EQ(activation_cpu(act, x.data(), t, dim, y.data(), t, dim, rows, dim), Status::Ok);
          expect_matches_exact(y, activation_exact(act, x),
                               std::string(act_name(act)) + " " + type_name(t) + " " + std::to_string(rows) + "x" +
                                   std::to_string(dim));
        }
}

TEST(ActivationRef, MixedTypesStridedAndInPlace) {
  const int64_t rows = 37, dim = 1000;
  for (Activation act : {Activation::GeluTanh, Activation::Silu}) {
    for (ElemType xt : kActTypes)
      for (ElemType yt : kActTypes) {
        const Rows x = random_rows(xt, rows, dim, dim + 24, 0.f, 2.f);
        Rows y(yt, rows, dim, dim + 8);
        ASSERT_EQ(activation_cpu(act, x.data(), xt, dim + 24, y.data(), yt, dim + 8, rows, dim), Status::Ok);
        expect_matches_exact(y, activation_exact(act, x),
                             std::string(act_name(act)) + " strided " + type_name(xt) + "->" + type_name(yt));
      }
    for (ElemType t : kActTypes) {
      Rows x = random_rows(t, rows, dim, dim + 24, 0.f, 2.f);
      const std::vector<double> exact = activation_exact(act, x);
      ASSERT_EQ(activation_cpu(act, x.data(), t, dim + 24, x.data(), t, dim + 24, rows, dim), Status::Ok);
      expect_matches_exact(x, exact, std::string(act_name(act)) + " in place " + type_name(t));
    }
  }
  // the limits: GELU(x) -> x and SiLU(x) -> x for large x, both -> 0 for very negative x
  std::vector<float> v = {30.f, -30.f, 0.f, -100.f};
  std::vector<float> out(v.size());
  ASSERT_EQ(activation_cpu(Activation::GeluTanh, v.data(), ElemType::F32, 4, out.data(), ElemType::F32, 4, 1, 4),
            Status::Ok);
  EXPECT_EQ(out[0], 30.f);
  EXPECT_EQ(out[1], 0.f);
  EXPECT_EQ(out[2], 0.f);
  EXPECT_EQ(out[3], 0.f);
  ASSERT_EQ(activation_cpu(Activation::Silu, v.data(), ElemType::F32, 4, out.data(), ElemType::F32, 4, 1, 4),
            Status::Ok);
  EXPECT_EQ(out[0], 30.f);
  EXPECT_NEAR(out[1], -30.0 * std::exp(-30.0), 1e-15);
  EXPECT_EQ(out[3], 0.f);
}

// ---- broadcast_binary ---------------------------------------------------------------

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

// Runs one broadcast_binary_cpu call on fresh inputs and checks it against fp64.
void check_binary(const BinaryCase& c, ElemType at, ElemType ot, int64_t rows, int64_t dim, int64_t pad, bool in_place) {
  const int64_t rows_per_batch = std::max<int64_t>(1, (rows + 2) / 3);
  const int64_t batch = (rows + rows_per_batch - 1) / rows_per_batch;
  Rows a = random_rows(at, rows, dim, dim + pad, 0.f, 1.f);
  const Rows b_full = random_rows(at, rows, dim, dim + 2 * pad, 0.f, 1.f);
  const int64_t vec_stride = dim + 4;  // per-sample rows, with a gap
  const std::vector<float> b_vec = test::randn(size_t(batch * vec_stride), 1.f, 0.5f);
  Rows out(ot, rows, dim, dim + 3 * pad);

  BroadcastBinaryParams p;
  p.op = c.op;
  p.broadcast = c.broadcast;
  p.a = a.data();
  p.a_type = at;
  p.a_stride = dim + pad;
  p.b = c.broadcast == Broadcast::Full ? b_full.data() : static_cast<const void*>(b_vec.data());
  p.b_stride = c.broadcast == Broadcast::Full ? dim + 2 * pad : vec_stride;
  p.rows_per_batch = rows_per_batch;
  p.out = in_place ? a.data() : out.data();
  p.out_type = in_place ? at : ot;
  p.out_stride = in_place ? dim + pad : dim + 3 * pad;
  p.rows = rows;
  p.dim = dim;

  std::vector<double> exact;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i) {
      const double bv = c.broadcast == Broadcast::Full     ? b_full.at(r, i)
                        : c.broadcast == Broadcast::Vector ? double(b_vec[size_t(i)])
                                                           : double(b_vec[size_t((r / rows_per_batch) * vec_stride + i)]);
      exact.push_back(c.op == BinaryOp::Add ? a.at(r, i) + bv : a.at(r, i) * bv);
    }
  ASSERT_EQ(broadcast_binary_cpu(p), Status::Ok);
  expect_matches_exact(in_place ? a : out, exact,
                       binary_name(c) + " " + type_name(at) + "->" + type_name(in_place ? at : ot) + " " +
                           std::to_string(rows) + "x" + std::to_string(dim) + (in_place ? " in place" : ""));
}

TEST(BroadcastBinaryRef, MatchesFp64EveryTypeAndSize) {
  for (const BinaryCase& c : kBinaryCases)
    for (ElemType t : kActTypes)
      for (int64_t rows : kRowCounts)
        for (int64_t dim : kDims) check_binary(c, t, t, rows, dim, 0, false);
}

TEST(BroadcastBinaryRef, MixedTypesStridedAndInPlace) {
  for (const BinaryCase& c : kBinaryCases) {
    for (ElemType at : kActTypes)
      for (ElemType ot : kActTypes) check_binary(c, at, ot, 37, 96, 8, false);
    for (ElemType t : kActTypes) check_binary(c, t, t, 37, 1000, 16, true);
  }
}

TEST(ElementwiseRef, RejectsBadArguments) {
  std::vector<float> x(256), y(256);
  const auto F = ElemType::F32;
  EXPECT_EQ(activation_cpu(Activation::Silu, nullptr, F, 64, y.data(), F, 64, 4, 64), Status::InvalidArgument);
  EXPECT_EQ(activation_cpu(Activation::Silu, x.data(), F, 32, y.data(), F, 64, 4, 64), Status::InvalidArgument);
  EXPECT_EQ(activation_cpu(Activation::Silu, x.data(), F, 64, y.data(), ElemType::I8, 64, 4, 64),
            Status::InvalidArgument);
  EXPECT_EQ(activation_cpu(Activation(7), x.data(), F, 64, y.data(), F, 64, 4, 64), Status::InvalidArgument);
  EXPECT_EQ(activation_cpu(Activation::Silu, x.data(), F, 64, x.data(), ElemType::BF16, 64, 4, 64),
            Status::InvalidArgument);
  EXPECT_EQ(activation_cpu(Activation::Silu, nullptr, F, 0, nullptr, F, 0, 0, 64), Status::Ok);

  BroadcastBinaryParams p;
  p.a = x.data();
  p.a_type = F;
  p.a_stride = 64;
  p.b = y.data();
  p.b_stride = 64;
  p.out = y.data();
  p.out_type = F;
  p.out_stride = 64;
  p.rows = 4;
  p.dim = 64;
  EXPECT_EQ(broadcast_binary_check(p), Status::Ok);  // out == b (Full, same type and stride): in place
  p.broadcast = Broadcast::Vector;
  EXPECT_EQ(broadcast_binary_cpu(p), Status::InvalidArgument);  // the fp32 vector is the output
  p.out = x.data();
  p.b = nullptr;
  EXPECT_EQ(broadcast_binary_cpu(p), Status::InvalidArgument);
  p.broadcast = Broadcast::PerSample;
  p.b = y.data();
  p.rows_per_batch = 0;
  EXPECT_EQ(broadcast_binary_cpu(p), Status::InvalidArgument);
  p.rows_per_batch = 2;
  p.b_stride = 10;  // rows of b overlap
  EXPECT_EQ(broadcast_binary_cpu(p), Status::InvalidArgument);
  p.broadcast = Broadcast(9);
  EXPECT_EQ(broadcast_binary_cpu(p), Status::InvalidArgument);
}

}  // namespace
}  // namespace td::kernels
