// The CUDA norm kernels (src/kernels/norm/*.cu) against their fp32 CPU
// references on the same fresh random inputs: every activation type, awkward
// row counts (1, 37, 333, rows not a multiple of any block's rows), widths on
// every launch plan (sub-warp, one warp, several warps per row; the scalar
// path for dim % 8 != 0, odd strides and misaligned pointers), Wan's full
// shapes, in-place use, and poisoned outputs whose row padding must survive.
//
// Tolerances: GPU and CPU compute the same fp32 formula; they differ by fp32
// rounding (sum order, rsqrtf's 2 ulp, FMA contraction), a few 1e-7
// relative. Rounded to a 16-bit output the two then agree except where that
// difference straddles a rounding boundary (about 1 element in 10^4), where
// they are one ulp apart. So every element must be within 1 ulp of the
// output type + 4e-6 * (1 + |ref|), and over a tensor rel_l2 <= 2e-6 (fp32),
// 2e-4 (fp16), 1e-3 (bf16; 1 ulp on every element would be ~3e-3), cosine
// >= 0.99999. The per-element bound is what catches a single wrong chunk in
// a 50M-element tensor, which rel_l2 alone would not.
#include <cuda_runtime_api.h>

#include <cmath>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "harness/device_buffer.h"
#include "kernels/norm/adaln_modulate.h"
#include "kernels/norm/layer_norm.h"
#include "kernels/norm/norm_host.h"
#include "kernels/norm/residual_gate_norm.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/quant/quant_token128.h"

namespace td::kernels {
namespace {

using namespace test_rows;

constexpr ElemType kActTypes[] = {ElemType::F32, ElemType::F16, ElemType::BF16};
constexpr int64_t kRowCounts[] = {1, 37, 333};
// 64, 96: sub-warp rows; 77: scalar path; 1000: 16 threads x 8 chunks with idle slots;
// 1536: one warp x 6; 4096: 64 x 8; 5120: 160 x 4 (several warps, one row per block).
constexpr int64_t kDims[] = {64, 77, 96, 1000, 1536, 4096, 5120};
constexpr float kEps = 1e-6f;


// The GPU output against the CPU reference's, as the file comment says.
void expect_matches_cpu(const Rows& gpu, const Rows& cpu, const std::string& what) {
  SCOPED_TRACE(what);
  const std::vector<double> got = gpu.values(), ref = cpu.values();
  ASSERT_EQ(got.size(), ref.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = ulp(gpu.type, ref[i]) + 4e-6 * (1.0 + std::fabs(ref[i]));
    if (!(std::fabs(got[i] - ref[i]) <= tol)) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << "first bad element " << first << " (row " << first / size_t(gpu.dim) << ", col "
                     << first % size_t(gpu.dim) << "): gpu " << got[first] << " vs cpu " << ref[first]
                     << " seed=" << test::current_seed();
  const double max_rel_l2 = gpu.type == ElemType::F32 ? 2e-6 : gpu.type == ElemType::F16 ? 2e-4 : 1e-3;
  const double min_cos = gpu.type == ElemType::F32 ? 0.999999 : 0.99999;
  TD_EXPECT_CLOSE(test::compare(got, ref), max_rel_l2, min_cos);
  EXPECT_EQ(gpu.padding_written(), 0u) << "row padding overwritten";
}

std::string label(const char* op, ElemType xt, ElemType yt, int64_t rows, int64_t dim, const char* extra = "") {
  return std::string(op) + " " + type_name(xt) + "->" + type_name(yt) + " " + std::to_string(rows) + "x" +
         std::to_string(dim) + extra;
}

// ---- one call of each op, CPU and GPU on the same inputs ---------------------------------

struct Layout {
  int64_t x_pad = 0, y_pad = 0;  // row stride = dim + pad
  int64_t x_offset = 0;          // elements before x's first row (misaligned base)
  bool in_place = false;         // y == x
};

// The layer_norm / rms_norm kernel variant check_rms / check_layer run (the Lean tests set it).
NormRowsKernel g_norm_kernel = NormRowsKernel::Rows;

void check_rms(ElemType xt, ElemType yt, int64_t rows, int64_t dim, bool with_weight, Layout l = {}) {
  if (l.in_place) yt = xt, l.y_pad = l.x_pad;
  const int64_t xs = dim + l.x_pad, ys = dim + l.y_pad;
  const Rows x = random_rows(xt, rows, dim, xs, 0.f, 1.5f, l.x_offset);
  const std::vector<float> w = test::randn(size_t(dim), 1.f, 0.3f);
  const float* wp = with_weight ? w.data() : nullptr;
  Rows ref(yt, rows, dim, ys);
  ASSERT_EQ(rms_norm_cpu(x.data(), xt, xs, ref.data(), yt, ys, wp, rows, dim, kEps), Status::Ok);

  DeviceBuffer dx(x), dw(w);
  Rows out(yt, rows, dim, ys, l.in_place ? l.x_offset : 0);
  if (l.in_place) out = x;
  DeviceBuffer dy(out);  // poisoned (or x itself, in place)
  const DeviceBuffer& dst = l.in_place ? dx : dy;
  ASSERT_EQ(rms_norm_cuda(dx.at(x), xt, xs, dst.at(out), yt, ys, with_weight ? dw.f32() : nullptr,
                          rows, dim, kEps, nullptr, g_norm_kernel),
            Status::Ok);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dst.download(out);
  expect_matches_cpu(out, ref, label("rms_norm", xt, yt, rows, dim, l.in_place ? " in place" : ""));
}

struct AffineParams {
  bool weight = false, bias = false;
};

void check_layer(ElemType xt, ElemType yt, int64_t rows, int64_t dim, AffineParams a, Layout l = {}) {
  if (l.in_place) yt = xt, l.y_pad = l.x_pad;
  const int64_t xs = dim + l.x_pad, ys = dim + l.y_pad;
  const Rows x = random_rows(xt, rows, dim, xs, 3.f, 0.7f, l.x_offset);
  const std::vector<float> w = test::randn(size_t(dim), 1.f, 0.3f), b = test::randn(size_t(dim), 0.f, 0.5f);
  Rows ref(yt, rows, dim, ys);
  ASSERT_EQ(layer_norm_cpu(x.data(), xt, xs, ref.data(), yt, ys, a.weight ? w.data() : nullptr,
                           a.bias ? b.data() : nullptr, rows, dim, kEps),
            Status::Ok);
  DeviceBuffer dx(x), dw(w), db(b);
  Rows out(yt, rows, dim, ys);
  if (l.in_place) out = x;
  DeviceBuffer dy(out);
  const DeviceBuffer& dst = l.in_place ? dx : dy;
  ASSERT_EQ(layer_norm_cuda(dx.at(x), xt, xs, dst.at(out), yt, ys, a.weight ? dw.f32() : nullptr,
                            a.bias ? db.f32() : nullptr, rows, dim, kEps, nullptr, g_norm_kernel),
            Status::Ok);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dst.download(out);
  expect_matches_cpu(out, ref, label("layer_norm", xt, yt, rows, dim, l.in_place ? " in place" : ""));
}

// The adaln_modulate kernel variant check_adaln runs (the Lean tests set it).
AdaLnRows g_adaln_rows = AdaLnRows::One;

void check_adaln(ElemType xt, ElemType yt, int64_t rows, int64_t dim, int64_t rows_per_batch, Layout l = {}) {
  if (l.in_place) yt = xt, l.y_pad = l.x_pad;
  const int64_t xs = dim + l.x_pad, ys = dim + l.y_pad;
  const int64_t batch = (rows + rows_per_batch - 1) / rows_per_batch;
  // Wan's e0 layout [batch, 6, dim]: shift = row 0, scale = row 1
  const std::vector<float> e0 = test::randn(size_t(batch * 6 * dim), 0.f, 0.5f);
  const Rows x = random_rows(xt, rows, dim, xs, -0.5f, 2.f, l.x_offset);
  Rows ref(yt, rows, dim, ys);
  ASSERT_EQ(adaln_modulate_cpu(x.data(), xt, xs, ref.data(), yt, ys, e0.data() + dim, e0.data(), 6 * dim,
                               rows_per_batch, rows, dim, kEps),
            Status::Ok);
  DeviceBuffer dx(x), de0(e0);
  Rows out(yt, rows, dim, ys);
  if (l.in_place) out = x;
  DeviceBuffer dy(out);
  const DeviceBuffer& dst = l.in_place ? dx : dy;
  ASSERT_EQ(adaln_modulate_cuda(dx.at(x), xt, xs, dst.at(out), yt, ys, de0.f32() + dim, de0.f32(),
                                6 * dim, rows_per_batch, rows, dim, kEps, nullptr, g_adaln_rows),
            Status::Ok);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dst.download(out);
  expect_matches_cpu(out, ref, label("adaln_modulate", xt, yt, rows, dim, l.in_place ? " in place" : ""));
}

struct RgnCase {
  bool gate, affine, modulation;
};
// Wan's three uses, everything at once, and the plain add.
constexpr RgnCase kRgnCases[] = {{true, true, false}, {false, false, true}, {true, false, true},
                                 {true, true, true},  {false, false, false}};

void check_rgn(ElemType rt, ElemType yt, ElemType ot, int64_t rows, int64_t dim, RgnCase c, bool in_place,
               int64_t pad = 0, int64_t x_offset = 0) {
  const int64_t rows_per_batch = std::max<int64_t>(1, (rows + 1) / 2);
  const int64_t batch = (rows + rows_per_batch - 1) / rows_per_batch;
  const std::vector<float> e0 = test::randn(size_t(batch * 6 * dim), 0.f, 0.5f);
  const std::vector<float> w = test::randn(size_t(dim), 1.f, 0.3f), b = test::randn(size_t(dim), 0.f, 0.5f);
  const int64_t xs = dim + pad, ys = dim + 2 * pad, os = dim + 3 * pad;
  const Rows x = random_rows(rt, rows, dim, xs, 0.2f, 2.f, x_offset);
  const Rows y = random_rows(yt, rows, dim, ys, 0.f, 1.f);
  Rows ref_x(rt, rows, dim, xs), ref_out(ot, rows, dim, os);

  ResidualGateNormParams p;
  p.x_stride = p.x_out_stride = xs;
  p.residual_type = rt;
  p.y_type = yt;
  p.y_stride = ys;
  p.out_type = ot;
  p.out_stride = os;
  p.mod_stride = 6 * dim;
  p.rows_per_batch = rows_per_batch;
  p.rows = rows;
  p.dim = dim;
  p.eps = kEps;
  auto set_params = [&](const float* e0p, const float* wp, const float* bp) {
    p.gate = c.gate ? e0p + 2 * dim : nullptr;
    p.shift = c.modulation ? e0p + 3 * dim : nullptr;
    p.scale = c.modulation ? e0p + 4 * dim : nullptr;
    p.weight = c.affine ? wp : nullptr;
    p.bias = c.affine ? bp : nullptr;
  };
  set_params(e0.data(), w.data(), b.data());
  p.x = x.data();
  p.x_out = ref_x.data();
  p.y = y.data();
  p.out = ref_out.data();
  ASSERT_EQ(residual_gate_norm_cpu(p), Status::Ok);

  DeviceBuffer dx(x), dy(y), de0(e0), dw(w), db(b);
  Rows out_x(rt, rows, dim, xs, x_offset), out(ot, rows, dim, os);
  if (in_place) out_x = x;
  DeviceBuffer dx_out(out_x), dout(out);
  const DeviceBuffer& dst_x = in_place ? dx : dx_out;
  set_params(de0.f32(), dw.f32(), db.f32());
  p.x = dx.at(x);
  p.x_out = dst_x.at(out_x);
  p.y = dy.at(y);
  p.out = dout.at(out);
  ASSERT_EQ(residual_gate_norm_cuda(p, nullptr), Status::Ok);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dst_x.download(out_x);
  dout.download(out);
  const std::string what = std::string("residual_gate_norm res=") + type_name(rt) + " y=" + type_name(yt) +
                           " out=" + type_name(ot) + " " + std::to_string(rows) + "x" + std::to_string(dim) +
                           " gate=" + std::to_string(c.gate) + " affine=" + std::to_string(c.affine) +
                           " mod=" + std::to_string(c.modulation) + (in_place ? " in place" : "") +
                           (x_offset ? " misaligned" : "");
  // x_out: the same fp32 operations in the same order, rounded once: bit-identical
  EXPECT_EQ(out_x.values(), ref_x.values()) << what << ": x_out differs from the CPU's round(x + gate * y)";
  EXPECT_EQ(out_x.padding_written(), 0u) << what;
  expect_matches_cpu(out, ref_out, what);
}

// ---- rms_norm -----------------------------------------------------------------------

TEST(RmsNormGpu, MatchesCpuEveryTypeAndSize) {
  TD_REQUIRE_GPU();
  for (ElemType t : kActTypes)
    for (int64_t rows : kRowCounts)
      for (int64_t dim : kDims) check_rms(t, t, rows, dim, (rows + dim) % 2 == 0);
}

TEST(RmsNormGpu, MixedTypesStridesMisalignmentInPlace) {
  TD_REQUIRE_GPU();
  for (ElemType xt : kActTypes)
    for (ElemType yt : kActTypes) {
      check_rms(xt, yt, 37, 1000, true, {.x_pad = 8, .y_pad = 24});
      check_rms(xt, yt, 37, 77, true, {.x_pad = 3, .y_pad = 1});
    }
  for (ElemType t : kActTypes) {
    check_rms(t, t, 333, 1536, true, {.x_pad = 16, .in_place = true});
    check_rms(t, t, 37, 1536, true, {.x_offset = 1});  // misaligned base: scalar path at Wan's width
    check_rms(t, t, 37, 5120, true, {.x_pad = 4});     // stride not a multiple of 8: scalar path
  }
}

TEST(RmsNormGpu, WanShapesAndWideRows) {
  TD_REQUIRE_GPU();
  check_rms(ElemType::BF16, ElemType::BF16, 32760, 1536, true);
  check_rms(ElemType::BF16, ElemType::BF16, 1031, 5120, true);  // 1031 rows: prime, no tile divides it
  check_rms(ElemType::F32, ElemType::BF16, 4099, 5120, true);
  check_rms(ElemType::BF16, ElemType::BF16, 67, 16384, true);    // 256 threads x 8 chunks
  check_rms(ElemType::BF16, ElemType::F32, 19, 32768, false);    // the widest vector row: 512 threads x 8
  check_rms(ElemType::F16, ElemType::F16, 23, 8191, true);       // the widest scalar row: 512 x 16
}

TEST(RmsNormGpu, RejectsWhatItCannotDo) {
  TD_REQUIRE_GPU();
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 2 * 40000 * 2), cudaSuccess);
  // wider than one row's registers: Unsupported (the caller falls back)
  EXPECT_EQ(rms_norm_cuda(p, ElemType::BF16, 40000, p, ElemType::BF16, 40000, nullptr, 1, 40000, kEps, nullptr),
            Status::Unsupported);
  EXPECT_EQ(rms_norm_cuda(p, ElemType::BF16, 9001, p, ElemType::BF16, 9001, nullptr, 1, 9001, kEps, nullptr),
            Status::Unsupported);  // scalar path past 8192
  EXPECT_EQ(rms_norm_cuda(p, ElemType::I8, 64, p, ElemType::BF16, 64, nullptr, 1, 64, kEps, nullptr),
            Status::InvalidArgument);
  EXPECT_EQ(rms_norm_cuda(nullptr, ElemType::BF16, 64, p, ElemType::BF16, 64, nullptr, 1, 64, kEps, nullptr),
            Status::InvalidArgument);
  cudaFree(p);
}

// ---- layer_norm -----------------------------------------------------------------------

TEST(LayerNormGpu, MatchesCpuEveryTypeAndSize) {
  TD_REQUIRE_GPU();
  for (ElemType t : kActTypes)
    for (int64_t rows : kRowCounts)
      for (int64_t dim : kDims) {
        const int v = int((rows + dim) % 3);
        check_layer(t, t, rows, dim, {v >= 1, v >= 2});
      }
}

TEST(LayerNormGpu, MixedTypesStridesMisalignmentInPlace) {
  TD_REQUIRE_GPU();
  for (ElemType xt : kActTypes)
    for (ElemType yt : kActTypes) {
      check_layer(xt, yt, 37, 96, {true, true}, {.x_pad = 8, .y_pad = 8});
      check_layer(xt, yt, 37, 77, {true, false}, {.x_pad = 1, .y_pad = 0});
    }
  for (ElemType t : kActTypes) {
    check_layer(t, t, 333, 5120, {true, true}, {.in_place = true});
    check_layer(t, t, 37, 1536, {true, true}, {.x_offset = 3});
  }
}

TEST(LayerNormGpu, WanShapes) {
  TD_REQUIRE_GPU();
  check_layer(ElemType::BF16, ElemType::BF16, 32760, 1536, {true, true});
  check_layer(ElemType::F32, ElemType::BF16, 32760, 1536, {true, true});  // Wan's fp32 residual -> norm3
  check_layer(ElemType::BF16, ElemType::BF16, 2053, 5120, {true, true});
  check_layer(ElemType::BF16, ElemType::BF16, 77, 4096, {false, false});  // UMT5 width
}

// ---- adaln_modulate -----------------------------------------------------------------------

TEST(AdaLnModulateGpu, MatchesCpuEveryTypeSizeAndBatching) {
  TD_REQUIRE_GPU();
  for (ElemType t : kActTypes)
    for (int64_t rows : kRowCounts)
      for (int64_t dim : kDims) check_adaln(t, t, rows, dim, rows == 1 ? 1 : (rows + 2) / 3);
}

TEST(AdaLnModulateGpu, MixedTypesPerTokenStridesInPlace) {
  TD_REQUIRE_GPU();
  for (ElemType xt : kActTypes)
    for (ElemType yt : kActTypes) {
      check_adaln(xt, yt, 37, 1536, 1, {.x_pad = 8, .y_pad = 16});  // per-token modulation
      check_adaln(xt, yt, 37, 77, 10, {.x_pad = 5});
    }
  for (ElemType t : kActTypes) {
    check_adaln(t, t, 333, 5120, 111, {.in_place = true});
    check_adaln(t, t, 37, 1000, 37, {.x_offset = 1});
  }
}

TEST(AdaLnModulateGpu, WanShapes) {
  TD_REQUIRE_GPU();
  check_adaln(ElemType::BF16, ElemType::BF16, 32760, 1536, 32760);
  check_adaln(ElemType::BF16, ElemType::BF16, 2 * 16380, 1536, 16380);  // CFG batch of 2
  check_adaln(ElemType::F32, ElemType::BF16, 3001, 5120, 1501);
}

// ---- the Lean variants (norm_lean.cuh) ---------------------------------------------------------

// Every case of the default's tests with NormRowsKernel::Lean: every type,
// row counts 1 / 37 / 333 (CTAs with rows past the end), every launch plan
// (sub-warp rows, one warp, several warps with the one-barrier merge, 1000
// = 16 threads x 8 chunks with idle slots, the full-row instances at 1536
// and 5120), in place, the scalar fallback (offsets, odd strides), mixed
// types, Wan's shapes; the same tolerance as the default (file comment).
TEST(RmsNormGpu, LeanVariantMatchesCpu) {
  TD_REQUIRE_GPU();
  g_norm_kernel = NormRowsKernel::Lean;
  for (ElemType t : kActTypes) {
    for (int64_t rows : kRowCounts)
      for (int64_t dim : kDims) check_rms(t, t, rows, dim, (rows + dim) % 2 == 0);
    check_rms(t, t, 333, 1536, true, {.x_pad = 16, .in_place = true});
    check_rms(t, t, 37, 5120, true, {.in_place = true});
    check_rms(t, t, 37, 1536, true, {.x_offset = 1});
    check_rms(t, t, 37, 5120, true, {.x_pad = 4});
  }
  for (ElemType xt : kActTypes)
    for (ElemType yt : kActTypes) {
      check_rms(xt, yt, 37, 1000, true, {.x_pad = 8, .y_pad = 24});
      check_rms(xt, yt, 33, 1536, false, {.x_pad = 8, .y_pad = 16});
      check_rms(xt, yt, 3, 5120, true);
    }
  check_rms(ElemType::BF16, ElemType::BF16, 32760, 1536, true);
  check_rms(ElemType::BF16, ElemType::BF16, 1031, 5120, true);
  check_rms(ElemType::BF16, ElemType::BF16, 67, 16384, true);
  check_rms(ElemType::BF16, ElemType::F32, 19, 32768, false);
  g_norm_kernel = NormRowsKernel::Rows;
}

TEST(LayerNormGpu, LeanVariantMatchesCpu) {
  TD_REQUIRE_GPU();
  g_norm_kernel = NormRowsKernel::Lean;
  for (ElemType t : kActTypes) {
    for (int64_t rows : kRowCounts)
      for (int64_t dim : kDims) {
        const int v = int((rows + dim) % 3);
        check_layer(t, t, rows, dim, {v >= 1, v >= 2});
        check_layer(t, t, rows, dim, {v == 0, v == 1});
      }
    check_layer(t, t, 333, 1536, {true, true}, {.in_place = true});
    check_layer(t, t, 333, 5120, {true, true}, {.in_place = true});
    check_layer(t, t, 37, 1536, {true, true}, {.x_offset = 3});
  }
  for (ElemType xt : kActTypes)
    for (ElemType yt : kActTypes) {
      check_layer(xt, yt, 37, 96, {true, true}, {.x_pad = 8, .y_pad = 8});
      check_layer(xt, yt, 33, 1536, {true, false}, {.x_pad = 8, .y_pad = 16});
      check_layer(xt, yt, 5, 5120, {false, true}, {.y_pad = 8});
    }
  check_layer(ElemType::BF16, ElemType::BF16, 32760, 1536, {true, true});
  check_layer(ElemType::F32, ElemType::BF16, 32760, 1536, {true, true});
  check_layer(ElemType::BF16, ElemType::BF16, 2053, 5120, {true, true});
  check_layer(ElemType::BF16, ElemType::BF16, 77, 4096, {false, false});
  check_layer(ElemType::BF16, ElemType::BF16, 23, 6144, {true, true});  // 96 threads x 8: 3 warps, full slots
  check_layer(ElemType::BF16, ElemType::BF16, 23, 4104, {true, true});  // 96 x 6 with idle slots in the last warp
  g_norm_kernel = NormRowsKernel::Rows;
}

TEST(AdaLnModulateGpu, LeanVariantMatchesCpu) {
  TD_REQUIRE_GPU();
  g_adaln_rows = AdaLnRows::Lean;
  for (ElemType t : kActTypes)
    for (int64_t rows : kRowCounts)
      for (int64_t dim : kDims) check_adaln(t, t, rows, dim, rows == 1 ? 1 : (rows + 2) / 3);
  for (ElemType xt : kActTypes)
    for (ElemType yt : kActTypes) {
      check_adaln(xt, yt, 37, 1536, 1, {.x_pad = 8, .y_pad = 16});  // per-token modulation
      check_adaln(xt, yt, 37, 5120, 5, {.y_pad = 8});
      check_adaln(xt, yt, 37, 77, 10, {.x_pad = 5});
    }
  for (ElemType t : kActTypes) {
    check_adaln(t, t, 333, 5120, 111, {.in_place = true});
    check_adaln(t, t, 333, 1536, 100, {.in_place = true});
    check_adaln(t, t, 37, 1000, 37, {.x_offset = 1});
  }
  check_adaln(ElemType::BF16, ElemType::BF16, 32760, 1536, 32760);
  check_adaln(ElemType::BF16, ElemType::BF16, 2 * 16380, 1536, 16380);  // CFG batch of 2
  check_adaln(ElemType::F32, ElemType::BF16, 3001, 5120, 1501);
  check_adaln(ElemType::BF16, ElemType::BF16, 2053, 5120, 1000);
  g_adaln_rows = AdaLnRows::One;
}

// Lean keeps the row engine's arithmetic in the same order for RMS norm at
// every width and for LayerNorm / adaln rows of <= 32 threads (64, 96,
// 1000, 1536 wide): the outputs must be the same bits as the default's.
// Wider LayerNorm rows (4096, 5120: per-warp statistics merged) are left
// to the tolerance tests above.
enum class LeanCheckOp { Rms, Layer, AdaLn };

// `first` and `second`: the two variants compared (Rows or Lean; the adaln
// calls take the matching AdaLnRows).
void check_lean_bits(LeanCheckOp op, ElemType xt, ElemType yt, int64_t rows, int64_t dim,
                     NormRowsKernel first = NormRowsKernel::Rows, NormRowsKernel second = NormRowsKernel::Lean) {
  const Rows x = random_rows(xt, rows, dim, dim, op == LeanCheckOp::Rms ? 0.f : 2.f, 1.3f);
  const std::vector<float> w = test::randn(size_t(dim), 1.f, 0.3f), b = test::randn(size_t(dim), 0.f, 0.5f);
  const int64_t rows_per_batch = std::max<int64_t>(1, rows / 3);
  const int64_t batch = (rows + rows_per_batch - 1) / rows_per_batch;
  const std::vector<float> e0 = test::randn(size_t(batch * 6 * dim), 0.f, 0.5f);
  DeviceBuffer dx(x), dw(w), db(b), de0(e0);
  auto run = [&](NormRowsKernel k) {
    Rows out(yt, rows, dim, dim);
    DeviceBuffer dy(out);
    Status s = Status::Ok;
    const AdaLnRows ak = k == NormRowsKernel::Lean ? AdaLnRows::Lean : AdaLnRows::One;
    if (op == LeanCheckOp::Rms)
      s = rms_norm_cuda(dx.at(x), xt, dim, dy.at(out), yt, dim, dw.f32(), rows, dim, kEps, nullptr, k);
    else if (op == LeanCheckOp::Layer)
      s = layer_norm_cuda(dx.at(x), xt, dim, dy.at(out), yt, dim, dw.f32(), db.f32(), rows, dim, kEps, nullptr, k);
    else
      s = adaln_modulate_cuda(dx.at(x), xt, dim, dy.at(out), yt, dim, de0.f32() + dim, de0.f32(), 6 * dim,
                              rows_per_batch, rows, dim, kEps, nullptr, ak);
    EXPECT_EQ(s, Status::Ok);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dy.download(out);
    return out;
  };
  const Rows ref = run(first), got = run(second);
  const std::string what = label(op == LeanCheckOp::Rms ? "rms_norm" : op == LeanCheckOp::Layer ? "layer_norm" : "adaln",
                                 xt, yt, rows, dim);
  size_t nan = 0;
  for (double v : got.values()) nan += std::isnan(v);
  EXPECT_EQ(nan, 0u) << what << ": unwritten outputs";
  EXPECT_TRUE(got.bytes == ref.bytes) << what << ": variant " << int(second) << " differs from variant " << int(first);
}

TEST(NormLeanGpu, BitIdenticalToDefaultWhereSameOrder) {
  TD_REQUIRE_GPU();
  for (ElemType t : kActTypes) {
    for (int64_t dim : {64, 96, 1000, 1536, 4096, 5120}) check_lean_bits(LeanCheckOp::Rms, t, t, 333, dim);
    for (int64_t dim : {64, 96, 1000, 1536}) {
      check_lean_bits(LeanCheckOp::Layer, t, t, 333, dim);
      check_lean_bits(LeanCheckOp::AdaLn, t, t, 333, dim);
    }
  }
  check_lean_bits(LeanCheckOp::Layer, ElemType::F32, ElemType::BF16, 4099, 1536);
  check_lean_bits(LeanCheckOp::AdaLn, ElemType::BF16, ElemType::BF16, 32760, 1536);
}

// ---- residual_gate_norm -----------------------------------------------------------------------

TEST(ResidualGateNormGpu, MatchesCpuEverySizeAndCase) {
  TD_REQUIRE_GPU();
  int i = 0;
  for (ElemType rt : {ElemType::F32, ElemType::BF16})
    for (int64_t rows : kRowCounts)
      for (int64_t dim : kDims) {
        const RgnCase c = kRgnCases[size_t(i++) % 5];
        check_rgn(rt, ElemType::BF16, ElemType::BF16, rows, dim, c, /*in_place=*/i % 2 == 0);
      }
}

TEST(ResidualGateNormGpu, EveryTypeCombinationCaseAndLayout) {
  TD_REQUIRE_GPU();
  for (ElemType rt : {ElemType::F32, ElemType::BF16})
    for (ElemType yt : kActTypes)
      for (ElemType ot : kActTypes)
        for (const RgnCase& c : kRgnCases) {
          check_rgn(rt, yt, ot, 37, 1000, c, /*in_place=*/c.gate, /*pad=*/8);
          check_rgn(rt, yt, ot, 37, 77, c, /*in_place=*/!c.gate, /*pad=*/1);
        }
  check_rgn(ElemType::BF16, ElemType::BF16, ElemType::BF16, 37, 1536, kRgnCases[2], true, 0, /*x_offset=*/1);
}

TEST(ResidualGateNormGpu, WanShapes) {
  TD_REQUIRE_GPU();
  // Each case at the full 32760-row shape once (BF16 residual) and with the
  // fp32 residual at a tenth of the rows: the host reference dominates the
  // test's time, and device time is scarce.
  for (const RgnCase& c : {kRgnCases[0], kRgnCases[1], kRgnCases[2]}) {
    check_rgn(ElemType::BF16, ElemType::BF16, ElemType::BF16, 32760, 1536, c, true);
    check_rgn(ElemType::F32, ElemType::BF16, ElemType::BF16, 3277, 1536, c, true);
  }
  check_rgn(ElemType::BF16, ElemType::BF16, ElemType::BF16, 1031, 5120, kRgnCases[2], true);
  check_rgn(ElemType::F32, ElemType::BF16, ElemType::BF16, 1031, 5120, kRgnCases[2], false);
  check_rgn(ElemType::F32, ElemType::F32, ElemType::BF16, 513, 4096, kRgnCases[3], true);
}

// residual_gate_norm with the token128 output (Wan's W8A8 blocks: the norm's
// output only feeds INT8 linears) against the two ops it replaces on the same
// GPU, residual_gate_norm_cuda then quantize_token128_cuda: the new residual,
// the codes and the scales bit for bit, with out not written (null) and with
// out written too (then out equal as well); fp32 and bf16 residuals, Wan's
// widths and rows not a multiple of anything, every parameter case; from
// poisoned codes and scales; and Unsupported (nothing written) where the
// width has a partial group.
void check_rgn_quant(ElemType rt, int64_t rows, int64_t dim, RgnCase c) {
  const int64_t rows_per_batch = std::max<int64_t>(1, (rows + 1) / 2);
  const int64_t batch = (rows + rows_per_batch - 1) / rows_per_batch;
  const std::vector<float> e0 = test::randn(size_t(batch * 6 * dim), 0.f, 0.5f);
  const std::vector<float> w = test::randn(size_t(dim), 1.f, 0.3f), b = test::randn(size_t(dim), 0.f, 0.5f);
  const Rows x = random_rows(rt, rows, dim, dim, 0.2f, 2.f);
  const Rows y = random_rows(ElemType::BF16, rows, dim, dim, 0.f, 1.f);
  DeviceBuffer de0(e0), dw(w), db(b), dy(y);
  const int64_t kb = dim / 128, ld = rows + 3;
  const std::string what = std::string("residual_gate_norm quantized res=") + type_name(rt) + " " +
                           std::to_string(rows) + "x" + std::to_string(dim) + " gate=" + std::to_string(c.gate) +
                           " affine=" + std::to_string(c.affine) + " mod=" + std::to_string(c.modulation);
  ResidualGateNormParams p;
  p.residual_type = rt;
  p.y_type = ElemType::BF16;
  p.out_type = ElemType::BF16;
  p.x_stride = p.x_out_stride = p.y_stride = p.out_stride = dim;
  p.mod_stride = 6 * dim;
  p.rows_per_batch = rows_per_batch;
  p.rows = rows;
  p.dim = dim;
  p.eps = kEps;
  p.gate = c.gate ? de0.f32() + 2 * dim : nullptr;
  p.shift = c.modulation ? de0.f32() + 3 * dim : nullptr;
  p.scale = c.modulation ? de0.f32() + 4 * dim : nullptr;
  p.weight = c.affine ? dw.f32() : nullptr;
  p.bias = c.affine ? db.f32() : nullptr;
  p.y = dy.at(y);
  struct Result {
    std::vector<unsigned char> x_new, out;
    std::vector<int8_t> codes;
    std::vector<uint32_t> scales;
  };
  const std::vector<int8_t> poison_codes(size_t(rows * dim), int8_t(0x55));
  const std::vector<float> poison_scales(size_t(kb * ld), std::nanf(""));
  // mode 0: the two ops; 1: fused, out null; 2: fused, out written too
  auto run = [&](int mode) {
    Result r;
    DeviceBuffer dx(x), dout(nullptr, size_t(rows * dim) * 2), dcodes(poison_codes.data(), poison_codes.size()),
        dscales(poison_scales);
    ResidualGateNormParams q = p;
    q.x = q.x_out = dx.at(x);
    q.out = mode == 1 ? nullptr : dout.at(y);
    if (mode > 0) {
      q.codes = reinterpret_cast<int8_t*>(dcodes.f32());
      q.codes_stride = dim;
      q.code_scales = dscales.f32();
      q.ld_scales = ld;
    }
    EXPECT_EQ(residual_gate_norm_cuda(q, nullptr), Status::Ok) << what << " mode " << mode;
    if (mode == 0)
      EXPECT_EQ(quantize_token128_cuda(ElemType::BF16, q.out, rows, dim, dim,
                                       reinterpret_cast<int8_t*>(dcodes.f32()), dim,
                                       dscales.f32(), ld, nullptr),
                Status::Ok);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Rows xr = x;
    dx.download(xr);
    r.x_new = xr.bytes;
    r.out.resize(size_t(rows * dim) * 2);
    r.codes.resize(poison_codes.size());
    r.scales.resize(poison_scales.size());
    EXPECT_EQ(cudaMemcpy(r.out.data(), dout.at(y), r.out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(r.codes.data(), reinterpret_cast<int8_t*>(dcodes.f32()), r.codes.size(),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(cudaMemcpy(r.scales.data(), dscales.f32(), r.scales.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return r;
  };
  const Result two = run(0), fused = run(1), both = run(2);
  EXPECT_TRUE(fused.x_new == two.x_new) << what << ": the new residual differs";
  EXPECT_TRUE(fused.codes == two.codes) << what << ": the codes differ from the quantizer's";
  size_t scales_differ = 0;  // the padding rows r >= rows included: poisoned in both
  for (size_t i = 0; i < two.scales.size(); ++i) scales_differ += fused.scales[i] != two.scales[i];
  EXPECT_EQ(scales_differ, 0u) << what << ": the scales differ (or the padding of the scale rows was written)";
  EXPECT_TRUE(both.codes == two.codes && both.out == two.out && both.x_new == two.x_new) << what << ": with out";
}

TEST(ResidualGateNormGpu, QuantizedOutputEqualsTheNormThenTheQuantizerBitForBit) {
  TD_REQUIRE_GPU();
  int i = 0;
  for (ElemType rt : {ElemType::F32, ElemType::BF16}) {
    for (const RgnCase& c : kRgnCases) check_rgn_quant(rt, 77 + 2 * i++, 1536, c);
    check_rgn_quant(rt, 2049, 1536, kRgnCases[0]);
    check_rgn_quant(rt, 301, 5120, kRgnCases[2]);
    check_rgn_quant(rt, 130, 4096, kRgnCases[3]);
    check_rgn_quant(rt, 65, 2048, kRgnCases[1]);
  }
  // A width with a partial 128-column group (1000), or whose row plan puts a
  // group across fewer than 16 lanes (256: a chunk per lane of one warp):
  // Unsupported, x untouched (ops::residual_gate_norm_quantized then runs the
  // norm and the quantizer apart).
  for (const int64_t dim : {int64_t(1000), int64_t(256)}) {
    const Rows x = random_rows(ElemType::BF16, 5, dim, dim, 0.f, 1.f), y = random_rows(ElemType::BF16, 5, dim, dim, 0.f, 1.f);
    DeviceBuffer dx(x), dy(y), dc(nullptr, size_t(5 * dim)), ds(nullptr, size_t(8 * 5 * 4));
    ResidualGateNormParams p;
    p.x = p.x_out = dx.at(x);
    p.y = dy.at(y);
    p.x_stride = p.x_out_stride = p.y_stride = dim;
    p.rows = 5;
    p.dim = dim;
    p.rows_per_batch = 5;
    p.codes = reinterpret_cast<int8_t*>(dc.f32());
    p.codes_stride = dim;
    p.code_scales = ds.f32();
    p.ld_scales = 5;
    EXPECT_EQ(residual_gate_norm_cuda(p, nullptr), Status::Unsupported) << dim;
    Rows back = x;
    dx.download(back);
    EXPECT_TRUE(back.bytes == x.bytes) << dim << ": x was written by a call that returned Unsupported";
  }
}

}  // namespace
}  // namespace td::kernels
