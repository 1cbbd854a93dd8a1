// The CUDA INT8 quantizers against their CPU references (which
// tests/cpu/test_quant_ref.cpp checks against fp64), on fresh random inputs:
// every input type, awkward shapes (rows 1, 37, 130, 333, 1000; cols 64, 200,
// 1000, 1001, 1536, 4096, 5120, 8960), padded and odd row strides, the
// vectorized and the element-wise paths (odd strides, a misaligned base),
// poisoned device outputs and padding, the hand-made tie / saturation / zero
// cases, and Wan-sized problems (32760 x 1536, 1000 x 5120).
//
// Bars:
//  * standalone quantizers: codes and scales bit-identical to the CPU
//    reference. Both sides evaluate the same IEEE operations (max of exact
//    values, correctly rounded 128/amax or 127/amax, one rounded product,
//    round-half-even with saturation), so there is no tie the two could
//    resolve differently: not one differing code is tolerated.
//  * fused LayerNorm-modulate-quantize: the GPU computes y in fp32 with tree
//    reductions and fused multiply-adds, the reference sequentially with fp64
//    sums, so y differs by a few ulp (<= ~1e-6 relative) and so do the scales
//    (bar 2e-5 relative); a code may then move by +-1 where y * inv lies
//    within ~128 * 1e-6 of a rounding tie: at most 1e-3 of the codes (+4) may
//    differ, never by more than 1. Dequantized GPU output stays within half a
//    step (a full step for TurboDiffusion's saturating 127) plus 1e-5 (1 + |y|)
//    of the reference's fp32 y.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/dtype.h"
#include "harness/harness.h"
#include "kernels/quant/layernorm_modulate_quant.h"
#include "kernels/quant/quant_block128.h"
#include "kernels/quant/quant_per_row.h"
#include "kernels/quant/quant_token128.h"

#if TURBODIFF_HAVE_CUDA

namespace td::kernels {
namespace {

constexpr ElemType kActTypes[] = {ElemType::F32, ElemType::F16, ElemType::BF16};
constexpr uint8_t kCodePoison = 0x5a;

DType dtype_of(ElemType t) { return t == ElemType::F32 ? DType::F32 : t == ElemType::F16 ? DType::F16 : DType::BF16; }
const char* type_name(ElemType t) { return t == ElemType::F32 ? "f32" : t == ElemType::F16 ? "f16" : "bf16"; }
size_t elem_bytes(ElemType t) { return t == ElemType::F32 ? 4 : 2; }

// Device memory freed on scope exit; `offset` bytes of slack in front let a
// test hand the kernel a misaligned base.
struct DeviceBuf {
  void* base = nullptr;
  size_t bytes = 0, offset = 0;
  DeviceBuf(size_t n, size_t off = 0) : bytes(n), offset(off) { base = cuda::device_alloc(std::max<size_t>(n + off, 1), 0); }
  ~DeviceBuf() { cuda::device_free(base, 0); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  void* ptr() const { return static_cast<char*>(base) + offset; }
  void upload(const void* host) { cuda::memcpy_sync(ptr(), host, bytes, true); }
  void download(void* host) const { cuda::memcpy_sync(host, ptr(), bytes, false); }
};

struct Input {
  ElemType type;
  int64_t rows, cols, ld;
  std::vector<unsigned char> bytes;
};
Input make_input(ElemType t, int64_t rows, int64_t cols, int64_t ld, double mean = 0, double stddev = 1,
                 bool awkward = false) {
  Input in{t, rows, cols, ld, std::vector<unsigned char>(size_t(std::max<int64_t>(rows * ld, 1)) * elem_bytes(t))};
  test::poison(in.bytes.data(), in.bytes.size(), dtype_of(t));
  const std::vector<float> v = test::randn(size_t(rows * cols));
  const std::vector<float> u = test::randu(size_t(rows), 0.f, 1.f);
  for (int64_t r = 0; r < rows; ++r) {
    const double row_scale = awkward ? std::exp2(12.0 * u[size_t(r)] - 6.0) : 1.0;
    for (int64_t c = 0; c < cols; ++c) {
      double x = mean + stddev * v[size_t(r * cols + c)] * row_scale;
      if (awkward && r % 7 == 3 && (c / 128) % 3 == 1) x = 0;  // zero 1x128 groups
      store_from_f64(in.bytes.data(), dtype_of(t), size_t(r * ld + c), x);
    }
  }
  return in;
}

enum class Fmt { Block128, Token128, PerRow };
const char* fmt_name(Fmt f) { return f == Fmt::Block128 ? "block128" : f == Fmt::Token128 ? "token128" : "per_row"; }

size_t scale_count(Fmt f, int64_t rows, int64_t cols, int64_t ld_scales) {
  return f == Fmt::Block128   ? size_t(quant_groups(rows) * quant_groups(cols))
         : f == Fmt::Token128 ? size_t(quant_groups(cols) * ld_scales)
                              : size_t(rows);
}

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> scales;
};

Status run_cpu(Fmt f, const Input& in, int64_t ld_q, int64_t ld_s, Quantized& out) {
  switch (f) {
    case Fmt::Block128:
      return quantize_block128_cpu(in.type, in.bytes.data(), in.rows, in.cols, in.ld, out.q.data(), ld_q,
                                   out.scales.data());
    case Fmt::Token128:
      return quantize_token128_cpu(in.type, in.bytes.data(), in.rows, in.cols, in.ld, out.q.data(), ld_q,
                                   out.scales.data(), ld_s);
    default:
      return quantize_per_row_cpu(in.type, in.bytes.data(), in.rows, in.cols, in.ld, out.q.data(), ld_q,
                                  out.scales.data());
  }
}

// The token128 kernel variant run_gpu uses (the tests of every variant set it).
Token128QuantKernel g_token128_kernel = Token128QuantKernel::Items4;

// Runs the CUDA quantizer on `in` (uploaded at a base misaligned by `misalign`
// bytes) into poisoned device buffers and downloads the result.
Quantized run_gpu(Fmt f, const Input& in, int64_t ld_q, int64_t ld_s, size_t misalign = 0) {
  DeviceBuf x(in.bytes.size(), misalign);
  x.upload(in.bytes.data());
  Quantized out{std::vector<int8_t>(size_t(std::max<int64_t>(in.rows * ld_q, 1))),
                std::vector<float>(std::max<size_t>(scale_count(f, in.rows, in.cols, ld_s), 1))};
  test::poison(out.q.data(), out.q.size(), DType::I8);
  test::poison(out.scales.data(), out.scales.size() * 4, DType::F32);
  DeviceBuf q(out.q.size()), s(out.scales.size() * 4);
  q.upload(out.q.data());
  s.upload(out.scales.data());
  cuda::Stream stream(0);
  Status st = Status::Ok;
  switch (f) {
    case Fmt::Block128:
      st = quantize_block128_cuda(in.type, x.ptr(), in.rows, in.cols, in.ld, static_cast<int8_t*>(q.ptr()), ld_q,
                                  static_cast<float*>(s.ptr()), stream.native());
      break;
    case Fmt::Token128:
      st = quantize_token128_cuda(in.type, x.ptr(), in.rows, in.cols, in.ld, static_cast<int8_t*>(q.ptr()), ld_q,
                                  static_cast<float*>(s.ptr()), ld_s, stream.native(), g_token128_kernel);
      break;
    case Fmt::PerRow:
      st = quantize_per_row_cuda(in.type, x.ptr(), in.rows, in.cols, in.ld, static_cast<int8_t*>(q.ptr()), ld_q,
                                 static_cast<float*>(s.ptr()), stream.native());
      break;
  }
  EXPECT_EQ(st, Status::Ok);
  stream.synchronize();
  q.download(out.q.data());
  s.download(out.scales.data());
  return out;
}

// Bit-identical codes and scales (NaN == NaN for never-written padding).
void expect_identical(const Quantized& gpu, const Quantized& cpu, const std::string& what) {
  size_t differing = 0, first = 0;
  for (size_t i = 0; i < cpu.q.size(); ++i)
    if (gpu.q[i] != cpu.q[i] && differing++ == 0) first = i;
  EXPECT_EQ(differing, 0u) << what << ": " << differing << " of " << cpu.q.size() << " code bytes differ, first at "
                           << first << " (gpu " << int(gpu.q[first]) << ", cpu " << int(cpu.q[first]) << ")";
  size_t scale_diff = 0;
  for (size_t i = 0; i < cpu.scales.size(); ++i) {
    const bool both_nan = std::isnan(gpu.scales[i]) && std::isnan(cpu.scales[i]);
    if (!both_nan && gpu.scales[i] != cpu.scales[i] && scale_diff++ < 3)
      ADD_FAILURE() << what << ": scale " << i << " gpu " << gpu.scales[i] << " cpu " << cpu.scales[i];
  }
  EXPECT_EQ(scale_diff, 0u) << what;
}

void compare_standalone(Fmt f, const Input& in, int64_t ld_q, int64_t ld_s, size_t misalign, const std::string& what) {
  Quantized cpu{std::vector<int8_t>(size_t(std::max<int64_t>(in.rows * ld_q, 1))),
                std::vector<float>(std::max<size_t>(scale_count(f, in.rows, in.cols, ld_s), 1))};
  test::poison(cpu.q.data(), cpu.q.size(), DType::I8);
  test::poison(cpu.scales.data(), cpu.scales.size() * 4, DType::F32);
  ASSERT_EQ(run_cpu(f, in, ld_q, ld_s, cpu), Status::Ok) << what;
  const Quantized gpu = run_gpu(f, in, ld_q, ld_s, misalign);
  expect_identical(gpu, cpu, what);
  // Padding of q rows stays poisoned on the GPU too (the CPU side is checked in the CPU tests).
  for (int64_t r = 0; r < in.rows; ++r)
    for (int64_t c = in.cols; c < ld_q; ++c)
      ASSERT_EQ(uint8_t(gpu.q[size_t(r * ld_q + c)]), kCodePoison) << what << " q padding written";
}

struct Shape {
  int64_t rows, cols;
};
constexpr Shape kShapes[] = {{1, 8960}, {37, 1536}, {333, 5120}, {1000, 200}, {130, 4096},
                             {257, 1000}, {37, 64}, {3, 1001}, {129, 129}};

void check_standalone(Fmt f) {
  TD_REQUIRE_GPU();
  for (ElemType t : kActTypes) {
    for (const Shape& s : kShapes) {
      for (bool awkward : {false, true}) {
        const std::string what = std::string(fmt_name(f)) + " " + type_name(t) + " " + std::to_string(s.rows) + "x" +
                                 std::to_string(s.cols) + (awkward ? " awkward" : "");
        // Vector path (strides multiples of 8) where the shape allows it...
        const Input in = make_input(t, s.rows, s.cols, s.cols + 8 + (s.cols % 8 ? 8 - s.cols % 8 : 0), 0, 1, awkward);
        compare_standalone(f, in, in.cols + 16 + (s.cols % 8 ? 8 - s.cols % 8 : 0), s.rows + 4, 0, what + " vec");
        // ...and the element-wise path: odd strides and a base one element off 16-byte alignment.
        const Input odd = make_input(t, s.rows, s.cols, s.cols + 3, 0, 1, awkward);
        compare_standalone(f, odd, s.cols + 5, s.rows + 1, elem_bytes(t), what + " scalar");
      }
    }
  }
}

TEST(QuantGpu, Block128BitIdenticalToReference) { check_standalone(Fmt::Block128); }
TEST(QuantGpu, Token128BitIdenticalToReference) { check_standalone(Fmt::Token128); }
TEST(QuantGpu, PerRowBitIdenticalToReference) { check_standalone(Fmt::PerRow); }
// The Items8Idx32 token128 variant: the same shapes and paths, and Wan 1.3B's.
TEST(QuantGpu, Token128Items8BitIdenticalToReference) {
  TD_REQUIRE_GPU();
  g_token128_kernel = Token128QuantKernel::Items8Idx32;
  check_standalone(Fmt::Token128);
  const Input wan13 = make_input(ElemType::BF16, 32760, 1536, 1536);
  compare_standalone(Fmt::Token128, wan13, 1536, 32760, 0, "token128 items8 bf16 32760x1536");
  g_token128_kernel = Token128QuantKernel::Items4;
}
// The Items4Idx32 token128 variant, likewise.
TEST(QuantGpu, Token128Items4Idx32BitIdenticalToReference) {
  TD_REQUIRE_GPU();
  g_token128_kernel = Token128QuantKernel::Items4Idx32;
  check_standalone(Fmt::Token128);
  const Input wan13 = make_input(ElemType::BF16, 32760, 1536, 1536);
  compare_standalone(Fmt::Token128, wan13, 1536, 32760, 0, "token128 items4 idx32 bf16 32760x1536");
  g_token128_kernel = Token128QuantKernel::Items4;
}

// The Items4Idx32Lane token128 variant (one division pair per lane, PRMT
// packing): the same shapes and paths, Wan 1.3B's and a 14B-wide slice;
// bit-identical like the default.
TEST(QuantGpu, Token128Items4Idx32LaneBitIdenticalToReference) {
  TD_REQUIRE_GPU();
  g_token128_kernel = Token128QuantKernel::Items4Idx32Lane;
  check_standalone(Fmt::Token128);
  const Input wan13 = make_input(ElemType::BF16, 32760, 1536, 1536);
  compare_standalone(Fmt::Token128, wan13, 1536, 32760, 0, "token128 items4 idx32 lane bf16 32760x1536");
  const Input wan14 = make_input(ElemType::BF16, 1001, 5120, 5120, 0, 1, true);
  compare_standalone(Fmt::Token128, wan14, 5120, 1001, 0, "token128 items4 idx32 lane bf16 1001x5120");
  g_token128_kernel = Token128QuantKernel::Items4;
}

// The RowSlabs token128 variant (a warp per slab of 32 x 4..6 packs of a
// row): the same shapes (8960 = 7 slabs of 5, 1001 / 1000 / 200 / 129:
// partial groups and slabs, 64: one partial slab) and the element-wise path
// (odd strides, misaligned base: Items4Idx32 runs), Wan 1.3B's rows (one
// slab of 6 per row) and 14B's (4 slabs of 5); bit-identical like the default.
TEST(QuantGpu, Token128RowSlabsBitIdenticalToReference) {
  TD_REQUIRE_GPU();
  g_token128_kernel = Token128QuantKernel::RowSlabs;
  check_standalone(Fmt::Token128);
  const Input wan13 = make_input(ElemType::BF16, 32760, 1536, 1536);
  compare_standalone(Fmt::Token128, wan13, 1536, 32760, 0, "token128 row slabs bf16 32760x1536");
  const Input wan14 = make_input(ElemType::BF16, 1001, 5120, 5120, 0, 1, true);
  compare_standalone(Fmt::Token128, wan14, 5120, 1001, 0, "token128 row slabs bf16 1001x5120");
  const Input wide = make_input(ElemType::F32, 77, 4096, 4096 + 8, 0, 1, true);
  compare_standalone(Fmt::Token128, wide, 4096 + 16, 80, 0, "token128 row slabs f32 77x4096");
  g_token128_kernel = Token128QuantKernel::Items4;
}

TEST(QuantGpu, WanSizedBitIdenticalToReference) {
  TD_REQUIRE_GPU();
  const Input wan13 = make_input(ElemType::BF16, 32760, 1536, 1536);
  const Input wan14 = make_input(ElemType::BF16, 1000, 5120, 5120, 0, 1, true);
  for (Fmt f : {Fmt::Block128, Fmt::Token128, Fmt::PerRow}) {
    compare_standalone(f, wan13, 1536, 32760, 0, std::string(fmt_name(f)) + " bf16 32760x1536");
    compare_standalone(f, wan14, 5120, 1000, 0, std::string(fmt_name(f)) + " bf16 1000x5120");
  }
}

TEST(QuantGpu, TiesSaturationAndZeroGroups) {
  TD_REQUIRE_GPU();
  // The hand-made cases of the CPU tests, whose exact codes are asserted there.
  const int64_t cols = 260;
  Input in{ElemType::F32, 2, cols, cols, std::vector<unsigned char>(size_t(2 * cols) * 4, 0)};
  float* x = reinterpret_cast<float*>(in.bytes.data());
  const float row0[] = {2.5f, 3.5f, -2.5f, -3.5f, 0.5f, 1.5f, -0.5f, 127.5f, -128.f, 127.49f, 126.5f, 100.25f};
  std::copy(std::begin(row0), std::end(row0), x);
  x[cols + 5] = 64.f;
  x[256] = std::ldexp(1.f, -110);  // a ragged group below the zero threshold (row 0, cols 256..259)
  for (Fmt f : {Fmt::Block128, Fmt::Token128, Fmt::PerRow}) compare_standalone(f, in, cols, 2, 0, fmt_name(f));
  const Quantized g = run_gpu(Fmt::Block128, in, cols, 0);
  const int want0[] = {2, 4, -2, -4, 0, 2, 0, 127, -128, 127, 126, 100};
  for (size_t i = 0; i < std::size(want0); ++i) EXPECT_EQ(g.q[i], want0[i]) << "x = " << row0[i];
  EXPECT_EQ(g.scales[0], 1.0f);
  EXPECT_EQ(g.scales[2], 1e-8f / 128.f);  // the all-zero ragged block (cols 256..259)
}

TEST(QuantGpu, EmptyAndBadArguments) {
  TD_REQUIRE_GPU();
  cuda::Stream s(0);
  EXPECT_EQ(quantize_block128_cuda(ElemType::BF16, nullptr, 0, 128, 128, nullptr, 128, nullptr, s.native()), Status::Ok);
  EXPECT_EQ(quantize_token128_cuda(ElemType::BF16, nullptr, 4, 0, 0, nullptr, 0, nullptr, 4, s.native()), Status::Ok);
  DeviceBuf x(4096), q(4096), sc(64);
  EXPECT_EQ(quantize_block128_cuda(ElemType::I8, x.ptr(), 2, 64, 64, static_cast<int8_t*>(q.ptr()), 64,
                                   static_cast<float*>(sc.ptr()), s.native()),
            Status::InvalidArgument);
  EXPECT_EQ(quantize_token128_cuda(ElemType::F16, x.ptr(), 4, 64, 64, static_cast<int8_t*>(q.ptr()), 64,
                                   static_cast<float*>(sc.ptr()), 3, s.native()),
            Status::InvalidArgument);  // ld_scales < rows
  EXPECT_EQ(quantize_per_row_cuda(ElemType::F32, x.ptr(), 2, 64, 32, static_cast<int8_t*>(q.ptr()), 64,
                                  static_cast<float*>(sc.ptr()), s.native()),
            Status::InvalidArgument);  // ld_x < cols
}

// ---- fused LayerNorm + modulation + quantization ---------------------------------------

constexpr float kEps = 1e-6f;

struct LnCase {
  int64_t rows, dim, rows_per_batch;
};
constexpr LnCase kLnCases[] = {{1, 1536, 1},   {37, 64, 37},    {333, 1000, 111}, {130, 5120, 65},
                               {129, 200, 43}, {300, 4096, 300}, {1000, 5120, 500}};

struct LnProblem {
  Input x;
  std::vector<float> e0;  // [batches, 6, dim]: shift = e0[:, 0], scale = e0[:, 1]
  int64_t ld_mod, rows_per_batch;
  const float* shift() const { return e0.data(); }
  const float* scale() const { return e0.data() + ld_mod / 6; }
};
LnProblem make_ln_problem(ElemType t, int64_t rows, int64_t dim, int64_t rows_per_batch) {
  LnProblem p{make_input(t, rows, dim, dim + 8, 3.0, 2.0), {}, 6 * dim, rows_per_batch};
  p.e0 = test::randn(size_t((rows + rows_per_batch - 1) / rows_per_batch * p.ld_mod), 0.f, 0.4f);
  return p;
}

// Runs the fused kernel (block128: through `path`) and compares it with the
// reference. *ran says whether it ran: a block128 path that reports
// Unsupported is accepted (nothing checked) only when `unsupported_ok`.
// Block128 through RowStats or Auto gets a poisoned workspace (so Auto runs
// RowStats), or `shared_work` when given (reused across calls).
void check_ln(Fmt f, const LnProblem& p, const std::string& what, LnQuantBlockPath path = LnQuantBlockPath::Auto,
              bool unsupported_ok = false, bool* ran = nullptr,
              LnQuantTokenRows token_rows = LnQuantTokenRows::One, DeviceBuf* shared_work = nullptr) {
  if (ran) *ran = false;
  std::unique_ptr<DeviceBuf> own_work;
  DeviceBuf* work = nullptr;
  if (f == Fmt::Block128 && (path == LnQuantBlockPath::RowStats || path == LnQuantBlockPath::Auto)) {
    if (shared_work) {
      work = shared_work;
    } else {
      own_work = std::make_unique<DeviceBuf>(layernorm_modulate_quant_block128_workspace_bytes(p.x.rows));
      std::vector<unsigned char> junk(own_work->bytes);
      test::poison(junk.data(), junk.size(), DType::F32);
      own_work->upload(junk.data());
      work = own_work.get();
    }
  }
  const Input& in = p.x;
  const int64_t rows = in.rows, dim = in.cols, ld_q = dim + 16, ld_s = f == Fmt::Token128 ? rows + 4 : 0;
  const size_t nscales = scale_count(f, rows, dim, ld_s);
  // Reference: y (fp32) and the fused reference's codes.
  std::vector<float> y(size_t(rows * dim));
  ASSERT_EQ(layernorm_modulate_f32_cpu(in.type, in.bytes.data(), rows, dim, in.ld, p.shift(), p.scale(), p.ld_mod,
                                       p.rows_per_batch, kEps, y.data(), dim),
            Status::Ok);
  Quantized cpu{std::vector<int8_t>(size_t(rows * ld_q)), std::vector<float>(nscales)};
  test::poison(cpu.q.data(), cpu.q.size(), DType::I8);
  test::poison(cpu.scales.data(), cpu.scales.size() * 4, DType::F32);
  const Status cst =
      f == Fmt::Token128
          ? layernorm_modulate_quant_token128_cpu(in.type, in.bytes.data(), rows, dim, in.ld, p.shift(), p.scale(),
                                                  p.ld_mod, p.rows_per_batch, kEps, cpu.q.data(), ld_q,
                                                  cpu.scales.data(), ld_s)
          : layernorm_modulate_quant_block128_cpu(in.type, in.bytes.data(), rows, dim, in.ld, p.shift(), p.scale(),
                                                  p.ld_mod, p.rows_per_batch, kEps, cpu.q.data(), ld_q,
                                                  cpu.scales.data());
  ASSERT_EQ(cst, Status::Ok) << what;

  DeviceBuf x(in.bytes.size()), mod(p.e0.size() * 4), q(cpu.q.size()), s(nscales * 4);
  x.upload(in.bytes.data());
  mod.upload(p.e0.data());
  Quantized gpu{std::vector<int8_t>(cpu.q.size()), std::vector<float>(nscales)};
  test::poison(gpu.q.data(), gpu.q.size(), DType::I8);
  test::poison(gpu.scales.data(), gpu.scales.size() * 4, DType::F32);
  q.upload(gpu.q.data());
  s.upload(gpu.scales.data());
  const float* shift_d = static_cast<const float*>(mod.ptr());
  const float* scale_d = shift_d + p.ld_mod / 6;
  cuda::Stream stream(0);
  const Status gst =
      f == Fmt::Token128
          ? layernorm_modulate_quant_token128_cuda(in.type, x.ptr(), rows, dim, in.ld, shift_d, scale_d, p.ld_mod,
                                                   p.rows_per_batch, kEps, static_cast<int8_t*>(q.ptr()), ld_q,
                                                   static_cast<float*>(s.ptr()), ld_s, stream.native(), token_rows)
          : layernorm_modulate_quant_block128_cuda(in.type, x.ptr(), rows, dim, in.ld, shift_d, scale_d, p.ld_mod,
                                                   p.rows_per_batch, kEps, static_cast<int8_t*>(q.ptr()), ld_q,
                                                   static_cast<float*>(s.ptr()), path, stream.native(),
                                                   work ? work->ptr() : nullptr, work ? work->bytes : 0);
  if (gst == Status::Unsupported && unsupported_ok) return;
  ASSERT_EQ(gst, Status::Ok) << what;
  if (ran) *ran = true;
  stream.synchronize();
  q.download(gpu.q.data());
  s.download(gpu.scales.data());

  // Scales: close to the reference's; padding entries untouched.
  for (size_t i = 0; i < nscales; ++i) {
    const float a = gpu.scales[i], b = cpu.scales[i];
    if (std::isnan(b)) {
      ASSERT_TRUE(std::isnan(a)) << what << " scale padding " << i << " written";
      continue;
    }
    ASSERT_LE(std::fabs(a - b), 2e-5 * std::fabs(b)) << what << " scale " << i << ": gpu " << a << " cpu " << b;
  }
  // Codes: +-1 near ties only; dequantized within the step bound of y.
  size_t moved = 0, n = 0;
  const int64_t groups = quant_groups(dim);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < ld_q; ++c) {
      const int8_t a = gpu.q[size_t(r * ld_q + c)], b = cpu.q[size_t(r * ld_q + c)];
      if (c >= dim) {
        ASSERT_EQ(uint8_t(a), kCodePoison) << what << " q padding written at (" << r << ", " << c << ")";
        continue;
      }
      ++n;
      ASSERT_LE(std::abs(int(a) - int(b)), 1) << what << " code (" << r << ", " << c << ")";
      moved += a != b;
      const float scale = f == Fmt::Token128 ? gpu.scales[size_t((c / 128) * ld_s + r)]
                                             : gpu.scales[size_t((r / 128) * groups + c / 128)];
      const double yv = y[size_t(r * dim + c)], deq = double(a) * scale;
      const double step = f == Fmt::Block128 && a == 127 ? scale : 0.5 * scale;
      ASSERT_LE(std::fabs(deq - yv), step * (1 + 1e-5) + 1e-5 * (1 + std::fabs(yv)))
          << what << " dequantized (" << r << ", " << c << ")";
    }
  }
  EXPECT_LE(double(moved), 1e-3 * double(n) + 4) << what << ": " << moved << " of " << n << " codes moved by 1";
}

void check_ln_fmt(Fmt f, LnQuantBlockPath path = LnQuantBlockPath::Auto,
                  LnQuantTokenRows token_rows = LnQuantTokenRows::One) {
  TD_REQUIRE_GPU();
  const std::string name = std::string("ln_modulate_quant ") + fmt_name(f) +
                           (f == Fmt::Token128 ? (token_rows == LnQuantTokenRows::WarpRows    ? " warp rows"
                                                  : token_rows == LnQuantTokenRows::WarpRowsLean ? " warp rows lean"
                                                  : token_rows == LnQuantTokenRows::PairRows     ? " pair rows"
                                                  : token_rows == LnQuantTokenRows::PairRowsReload ? " pair rows reload"
                                                  : token_rows == LnQuantTokenRows::Columns        ? " columns"
                                                                                              : "")
                            : path == LnQuantBlockPath::Cluster       ? " cluster"
                            : path == LnQuantBlockPath::Portable      ? " portable"
                            : path == LnQuantBlockPath::RowStats      ? " row stats"
                                                                      : " auto");
  // The cluster path needs sm_90 and two buffers of 8 rows x dim of x (16
  // CTAs of 8 rows, or 8 of 16 rows) in shared memory: it must run up to
  // dim 6400 for 16-bit inputs, 3200 for fp32.
  const auto info = cuda::device_info(0);
  auto cluster_fits = [&](ElemType t, int64_t dim) {
    return info.cc_major >= 9 && 16 * dim * int64_t(elem_bytes(t)) <= 200 * 1024;
  };
  for (ElemType t : kActTypes)
    for (const LnCase& lc : kLnCases) {
      const LnProblem p = make_ln_problem(t, lc.rows, lc.dim, lc.rows_per_batch);
      const bool may_refuse = path == LnQuantBlockPath::Cluster && !cluster_fits(t, lc.dim);
      bool ran = false;
      check_ln(f, p, name + " " + type_name(t) + " " + std::to_string(lc.rows) + "x" + std::to_string(lc.dim), path,
               may_refuse, &ran, token_rows);
      if (path == LnQuantBlockPath::Cluster && cluster_fits(t, lc.dim))
        EXPECT_TRUE(ran) << name << ": the cluster path refused a shape it should run";
    }
  // Wan 1.3B 480p, one sample: 32760 tokens x 1536.
  const LnProblem wan = make_ln_problem(ElemType::BF16, 32760, 1536, 32760);
  check_ln(f, wan, name + " bf16 32760x1536", path, path == LnQuantBlockPath::Cluster && info.cc_major < 9, nullptr,
           token_rows);
}

TEST(LnModulateQuantGpu, Token128AgainstReference) { check_ln_fmt(Fmt::Token128); }

// Each case, in every activation type, through token128 variant v against
// the reference; `name` labels the failures.
void check_ln_token128_cases(const std::string& name, LnQuantTokenRows v, std::initializer_list<LnCase> cases) {
  for (ElemType t : kActTypes)
    for (const LnCase& lc : cases) {
      const LnProblem p = make_ln_problem(t, lc.rows, lc.dim, lc.rows_per_batch);
      check_ln(Fmt::Token128, p,
               "ln_modulate_quant token128 " + name + " " + type_name(t) + " " + std::to_string(lc.rows) + "x" +
                   std::to_string(lc.dim) + " per batch " + std::to_string(lc.rows_per_batch),
               LnQuantBlockPath::Auto, false, nullptr, v);
    }
}

// The warp-per-row token128 variant (LnQuantTokenRows::WarpRows): the cases
// above (plans of 1 warp at 64, 200, 1000; 2 at 1536; 4 at 4096; 5 at 5120:
// rows that fill every slot and rows that do not; samples changing inside a
// CTA's 4 rows; row counts not multiples of 4), plus 3072 (3 warps), a
// 2-row sample over many CTAs, and rows it does not take (6144: a 6-warp
// plan; fp32 3072/4096/5120: the raw row exceeds 80 registers; 8960), which
// run the one-row kernel. Same bars as the default; bit-identity with the
// default is checked by the next test.
// WarpRowsLean (72 registers) takes the same cases: it runs at 1536 in
// 16-bit types (1001 x 1536 and 32760 x 1536: several rows per warp; 1 and
// 3 x 1536: fewer rows than warps), WarpRows elsewhere.
TEST(LnModulateQuantGpu, Token128WarpRowsAgainstReference) {
  TD_REQUIRE_GPU();  // (check_ln_fmt's own skip returns from it only)
  for (LnQuantTokenRows v : {LnQuantTokenRows::WarpRows, LnQuantTokenRows::WarpRowsLean}) {
    check_ln_fmt(Fmt::Token128, LnQuantBlockPath::Auto, v);
    check_ln_token128_cases(v == LnQuantTokenRows::WarpRowsLean ? "warp rows lean" : "warp rows", v,
                            {{77, 6144, 20}, {45, 3072, 45}, {1001, 1536, 2}, {19, 8960, 7}, {5, 5120, 3}, {3, 1536, 1}});
  }
}

// WarpRows sums the statistics in the default's order (the default's plan's
// per-thread partials), so its codes and scales are the default's bit for
// bit, padding untouched (both outputs poisoned alike).
Quantized run_ln_token128_gpu(const LnProblem& p, LnQuantTokenRows v) {
  const Input& in = p.x;
  const int64_t rows = in.rows, dim = in.cols, ld_q = dim + 16, ld_s = rows + 4;
  const size_t nscales = scale_count(Fmt::Token128, rows, dim, ld_s);
  Quantized out{std::vector<int8_t>(size_t(rows * ld_q)), std::vector<float>(nscales)};
  test::poison(out.q.data(), out.q.size(), DType::I8);
  test::poison(out.scales.data(), out.scales.size() * 4, DType::F32);
  DeviceBuf x(in.bytes.size()), mod(p.e0.size() * 4), q(out.q.size()), s(nscales * 4);
  x.upload(in.bytes.data());
  mod.upload(p.e0.data());
  q.upload(out.q.data());
  s.upload(out.scales.data());
  const float* shift_d = static_cast<const float*>(mod.ptr());
  cuda::Stream stream(0);
  EXPECT_EQ(layernorm_modulate_quant_token128_cuda(in.type, x.ptr(), rows, dim, in.ld, shift_d, shift_d + p.ld_mod / 6,
                                                   p.ld_mod, p.rows_per_batch, kEps, static_cast<int8_t*>(q.ptr()),
                                                   ld_q, static_cast<float*>(s.ptr()), ld_s, stream.native(), v),
            Status::Ok);
  stream.synchronize();
  q.download(out.q.data());
  s.download(out.scales.data());
  return out;
}

TEST(LnModulateQuantGpu, Token128WarpRowsBitIdenticalToOne) {
  TD_REQUIRE_GPU();
  constexpr LnCase kCases[] = {{37, 64, 37},    {129, 200, 43},  {333, 1000, 111}, {1001, 1536, 2},  {3, 1536, 1},
                               {45, 3072, 45},  {300, 4096, 300}, {130, 5120, 65},  {1000, 5120, 500}, {77, 6144, 20}};
  for (LnQuantTokenRows v : {LnQuantTokenRows::WarpRows, LnQuantTokenRows::WarpRowsLean}) {
    const std::string name = v == LnQuantTokenRows::WarpRows ? "warp rows" : "warp rows lean";
    for (ElemType t : kActTypes)
      for (const LnCase& lc : kCases) {
        const LnProblem p = make_ln_problem(t, lc.rows, lc.dim, lc.rows_per_batch);
        const std::string what = name + " vs one " + type_name(t) + " " + std::to_string(lc.rows) + "x" +
                                 std::to_string(lc.dim);
        const Quantized one = run_ln_token128_gpu(p, LnQuantTokenRows::One);
        const Quantized warp = run_ln_token128_gpu(p, v);
        ASSERT_EQ(std::memcmp(one.q.data(), warp.q.data(), one.q.size()), 0) << what << ": codes differ";
        ASSERT_EQ(std::memcmp(one.scales.data(), warp.scales.data(), one.scales.size() * 4), 0)
            << what << ": scales differ";
      }
    for (const LnCase& lc : {LnCase{32760, 1536, 32760}, LnCase{2 * 3000, 5120, 3000}}) {
      const LnProblem wan = make_ln_problem(ElemType::BF16, lc.rows, lc.dim, lc.rows_per_batch);
      const std::string what = name + " vs one bf16 " + std::to_string(lc.rows) + "x" + std::to_string(lc.dim);
      const Quantized one = run_ln_token128_gpu(wan, LnQuantTokenRows::One);
      const Quantized warp = run_ln_token128_gpu(wan, v);
      ASSERT_EQ(std::memcmp(one.q.data(), warp.q.data(), one.q.size()), 0) << what << ": codes differ";
      ASSERT_EQ(std::memcmp(one.scales.data(), warp.scales.data(), one.scales.size() * 4), 0)
          << what << ": scales differ";
    }
  }
}
// The two-rows-per-team token128 variant (LnQuantTokenRows::PairRows): the
// cases above (it runs 16-bit rows of a multiple of 512 columns: 1536 (one
// warp per CTA), 4096 (2 warps x 4 blocks), 5120 (5 x 2); 64, 200,
// 1000 and fp32 run the one-row kernel), plus pairs that cross a sample
// boundary (odd rows_per_batch: the second row's parameters are loaded on
// their own), odd row counts (a team with one row), rows fewer than a CTA's
// teams, every team size / blocks per warp it takes (512: 1 block; 2048: 4;
// 3072: 2 warps x 3; 4608: 3 x 3; 6144: 4 x 3; 8192: 4 x 4) and rows it does
// not take (8960, 1000). Same bars as the default (the statistics are summed
// in another order: not bit-identical).
// PairRowsReload (x blocks loaded again for y) takes the same cases, and
// must give PairRows' codes and scales bit for bit (same arithmetic).
TEST(LnModulateQuantGpu, Token128PairRowsAgainstReference) {
  TD_REQUIRE_GPU();  // (check_ln_fmt's own skip returns from it only)
  for (LnQuantTokenRows v : {LnQuantTokenRows::PairRows, LnQuantTokenRows::PairRowsReload}) {
    const std::string name = v == LnQuantTokenRows::PairRows ? "pair rows" : "pair rows reload";
    check_ln_fmt(Fmt::Token128, LnQuantBlockPath::Auto, v);
    check_ln_token128_cases(name, v,
                            {{333, 1536, 111}, {131, 5120, 13}, {1001, 1536, 2}, {3, 1536, 1}, {1, 1536, 1},
                             {7, 512, 3}, {9, 2048, 5}, {45, 3072, 45}, {5, 4608, 5}, {77, 6144, 20}, {6, 8192, 3},
                             {19, 8960, 7}, {37, 1000, 7}, {17, 4096, 17}});
    // Wan 14B 720p rows, two samples (the pair kernel's multi-warp teams at scale).
    const LnProblem wan = make_ln_problem(ElemType::BF16, 2 * 1500 + 1, 5120, 1500);
    check_ln(Fmt::Token128, wan, "ln_modulate_quant token128 " + name + " bf16 3001x5120", LnQuantBlockPath::Auto,
             false, nullptr, v);
  }
  for (const LnCase& lc : {LnCase{333, 1536, 111}, LnCase{131, 5120, 13}, LnCase{45, 3072, 45}, LnCase{5, 4608, 5}}) {
    const LnProblem p = make_ln_problem(ElemType::BF16, lc.rows, lc.dim, lc.rows_per_batch);
    const std::string what = "pair rows reload vs pair rows bf16 " + std::to_string(lc.rows) + "x" + std::to_string(lc.dim);
    const Quantized pairs = run_ln_token128_gpu(p, LnQuantTokenRows::PairRows);
    const Quantized reload = run_ln_token128_gpu(p, LnQuantTokenRows::PairRowsReload);
    ASSERT_EQ(std::memcmp(pairs.q.data(), reload.q.data(), pairs.q.size()), 0) << what << ": codes differ";
    ASSERT_EQ(std::memcmp(pairs.scales.data(), reload.scales.data(), pairs.scales.size() * 4), 0)
        << what << ": scales differ";
  }
}
// The column-owner kernel (LnQuantTokenRows::Columns): the common cases
// (rows it does not take run the one-row kernel), then widths it takes
// (256..5120 in steps the thread count allows) with row counts that leave
// partial row blocks, samples changing inside a row block, single rows, and
// every configuration of its ring (TURBODIFF_LNQ_COLUMNS_CFG), each against
// the reference.
TEST(LnModulateQuantGpu, Token128ColumnsAgainstReference) {
  TD_REQUIRE_GPU();  // (check_ln_fmt's own skip returns from it only)
  check_ln_fmt(Fmt::Token128, LnQuantBlockPath::Auto, LnQuantTokenRows::Columns);
  const char* configs[] = {nullptr, "4,2,2", "2,4,2", "8,1,2", "4,1,3"};
  for (const char* cfg : configs) {
    if (cfg)
      setenv("TURBODIFF_LNQ_COLUMNS_CFG", cfg, 1);
    else
      unsetenv("TURBODIFF_LNQ_COLUMNS_CFG");
    const std::string name = std::string("columns cfg ") + (cfg ? cfg : "default");
    check_ln_token128_cases(name, LnQuantTokenRows::Columns,
                            {{333, 1536, 111}, {131, 5120, 13}, {1001, 1536, 2}, {3, 1536, 1}, {1, 1536, 1},
                             {7, 512, 3}, {9, 2048, 5}, {45, 3072, 45}, {5, 4608, 5}, {37, 256, 7}, {17, 4096, 17},
                             {2, 5120, 1}, {6, 8192, 3}, {19, 1000, 7}});
    // Wan 14B 720p rows, two samples, and Wan 1.3B 480p rows.
    check_ln(Fmt::Token128, make_ln_problem(ElemType::BF16, 2 * 1500 + 1, 5120, 1500),
             "ln_modulate_quant token128 " + name + " bf16 3001x5120", LnQuantBlockPath::Auto, false, nullptr,
             LnQuantTokenRows::Columns);
    check_ln(Fmt::Token128, make_ln_problem(ElemType::BF16, 32760, 1536, 32760),
             "ln_modulate_quant token128 " + name + " bf16 32760x1536", LnQuantBlockPath::Auto, false, nullptr,
             LnQuantTokenRows::Columns);
  }
  unsetenv("TURBODIFF_LNQ_COLUMNS_CFG");
}

TEST(LnModulateQuantGpu, Block128AutoAgainstReference) { check_ln_fmt(Fmt::Block128, LnQuantBlockPath::Auto); }
TEST(LnModulateQuantGpu, Block128PortableAgainstReference) { check_ln_fmt(Fmt::Block128, LnQuantBlockPath::Portable); }
TEST(LnModulateQuantGpu, Block128RowStatsAgainstReference) {
  TD_REQUIRE_GPU();  // (check_ln_fmt's own skip returns from it only)
  check_ln_fmt(Fmt::Block128, LnQuantBlockPath::RowStats);
  // Every statistics-kernel width (packs per lane 2..20), ragged stripes,
  // samples changing inside a stripe, both 16-bit types and fp32.
  for (ElemType t : kActTypes)
    for (const LnCase& lc : {LnCase{300, 256, 300}, LnCase{129, 768, 64}, LnCase{257, 2048, 100},
                             LnCase{200, 2560, 200}, LnCase{131, 3072, 13}, LnCase{128, 3840, 128},
                             LnCase{255, 4608, 85}})
      check_ln(Fmt::Block128, make_ln_problem(t, lc.rows, lc.dim, lc.rows_per_batch),
               std::string("row stats ") + type_name(t) + " " + std::to_string(lc.rows) + "x" +
                   std::to_string(lc.dim),
               LnQuantBlockPath::RowStats);
  // Wan 14B 720p rows, two samples.
  check_ln(Fmt::Block128, make_ln_problem(ElemType::BF16, 2 * 1500 + 1, 5120, 1500), "row stats bf16 3001x5120",
           LnQuantBlockPath::RowStats);
}

// One workspace through shapes of different row counts, a second run of a
// problem giving the same bytes, and the refusals of an explicit RowStats.
TEST(LnModulateQuantGpu, Block128RowStatsWorkspace) {
  TD_REQUIRE_GPU();
  DeviceBuf work(layernorm_modulate_quant_block128_workspace_bytes(4000));
  for (const LnCase& lc : {LnCase{4000, 1536, 4000}, LnCase{129, 5120, 129}, LnCase{3999, 256, 1333}})
    check_ln(Fmt::Block128, make_ln_problem(ElemType::BF16, lc.rows, lc.dim, lc.rows_per_batch),
             "row stats shared workspace " + std::to_string(lc.rows) + "x" + std::to_string(lc.dim),
             LnQuantBlockPath::RowStats, false, nullptr, LnQuantTokenRows::One, &work);
  const LnProblem p = make_ln_problem(ElemType::BF16, 2500, 5120, 2500);
  DeviceBuf x(p.x.bytes.size()), mod(p.e0.size() * 4), q(size_t(2500 * 5120)), sc(size_t(20 * 40 * 4));
  x.upload(p.x.bytes.data());
  mod.upload(p.e0.data());
  const float* shift = static_cast<const float*>(mod.ptr());
  cuda::Stream stream(0);
  auto run = [&](int64_t rows, int64_t dim, LnQuantBlockPath path, void* w, size_t wb) {
    return layernorm_modulate_quant_block128_cuda(ElemType::BF16, x.ptr(), rows, dim, p.x.ld, shift, shift + 5120,
                                                  p.ld_mod, 2500, kEps, static_cast<int8_t*>(q.ptr()), dim,
                                                  static_cast<float*>(sc.ptr()), path, stream.native(), w, wb);
  };
  std::vector<int8_t> q1(q.bytes), q2(q.bytes);
  std::vector<float> s1(20 * 40), s2(20 * 40);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(run(2500, 5120, LnQuantBlockPath::RowStats, work.ptr(), work.bytes), Status::Ok);
    stream.synchronize();
    q.download(i == 0 ? q1.data() : q2.data());
    sc.download(i == 0 ? s1.data() : s2.data());
  }
  EXPECT_EQ(q1, q2);
  EXPECT_EQ(std::memcmp(s1.data(), s2.data(), s1.size() * 4), 0);
  EXPECT_EQ(run(2500, 5120, LnQuantBlockPath::RowStats, nullptr, 0), Status::InvalidArgument);  // no workspace
  EXPECT_EQ(run(2500, 5120, LnQuantBlockPath::RowStats, work.ptr(), 2499 * 8), Status::InvalidArgument);  // short
  EXPECT_EQ(run(2500, 5120, LnQuantBlockPath::RowStats, static_cast<char*>(work.ptr()) + 8, work.bytes - 8),
            Status::InvalidArgument);  // misaligned
  EXPECT_EQ(run(100, 5128, LnQuantBlockPath::RowStats, work.ptr(), work.bytes), Status::Unsupported);  // too wide
  // Auto with a short workspace runs the portable kernel instead.
  ASSERT_EQ(run(2500, 5120, LnQuantBlockPath::Auto, work.ptr(), 8), Status::Ok);
  stream.synchronize();
}

TEST(LnModulateQuantGpu, Block128ClusterAgainstReference) {
  // sm_90+ only; elsewhere the path must say Unsupported, which check_ln accepts.
  check_ln_fmt(Fmt::Block128, LnQuantBlockPath::Cluster);
}

// Both cluster configurations (TD_LNQ_CLUSTER_ROWS=16: 8 CTAs of 16 rows, 8:
// 16 CTAs of 8 rows; read per call) at every packs-per-thread width (1, 2, 4
// packs of 8 columns), ragged stripes (rows not a multiple of 8, 16 or 128,
// CTAs with no rows), dims not a multiple of 128, samples changing inside a
// CTA's rows (rows_per_batch 3, 7, 13), each dtype; must run wherever
// 16 x dim x bytes <= 200 KB on sm_90.
TEST(LnModulateQuantGpu, Block128ClusterConfigurations) {
  TD_REQUIRE_GPU();
  const auto info = cuda::device_info(0);
  for (const char* rows_cfg : {"16", "8"}) {
    setenv("TD_LNQ_CLUSTER_ROWS", rows_cfg, 1);
    for (ElemType t : kActTypes)
      for (const LnCase& lc : {LnCase{300, 256, 3}, LnCase{129, 768, 64}, LnCase{257, 2048, 100},
                               LnCase{200, 2560, 200}, LnCase{131, 3072, 13}, LnCase{9, 3200, 9},
                               LnCase{128, 3840, 128}, LnCase{255, 4608, 85}, LnCase{77, 6400, 7},
                               LnCase{140, 136, 140}}) {
        const bool fits = info.cc_major >= 9 && 16 * lc.dim * int64_t(elem_bytes(t)) <= 200 * 1024;
        bool ran = false;
        check_ln(Fmt::Block128, make_ln_problem(t, lc.rows, lc.dim, lc.rows_per_batch),
                 std::string("cluster R=") + rows_cfg + " " + type_name(t) + " " + std::to_string(lc.rows) + "x" +
                     std::to_string(lc.dim),
                 LnQuantBlockPath::Cluster, !fits, &ran);
        if (fits) {
          EXPECT_TRUE(ran) << "cluster R=" << rows_cfg << " refused " << lc.rows << "x" << lc.dim;
        }
      }
    // Wan 14B 720p rows, two samples (a stripe across the boundary).
    check_ln(Fmt::Block128, make_ln_problem(ElemType::BF16, 2 * 1500 + 1, 5120, 1500),
             std::string("cluster R=") + rows_cfg + " bf16 3001x5120", LnQuantBlockPath::Cluster, info.cc_major < 9);
  }
  unsetenv("TD_LNQ_CLUSTER_ROWS");
}

TEST(LnModulateQuantGpu, RejectsWhatItCannotVectorize) {
  TD_REQUIRE_GPU();
  cuda::Stream s(0);
  DeviceBuf x(1 << 18), mod(1 << 16), q(1 << 16), sc(1 << 12);
  const float* m = static_cast<const float*>(mod.ptr());
  auto token = [&](const void* xp, int64_t dim, int64_t ld) {
    return layernorm_modulate_quant_token128_cuda(ElemType::BF16, xp, 4, dim, ld, m, m, ld, 4, kEps,
                                                  static_cast<int8_t*>(q.ptr()), ld, static_cast<float*>(sc.ptr()), 4,
                                                  s.native());
  };
  EXPECT_EQ(token(x.ptr(), 1001, 1008), Status::InvalidArgument);  // dim % 8
  EXPECT_EQ(token(x.ptr(), 1000, 1004), Status::InvalidArgument);  // ld % 8
  EXPECT_EQ(token(static_cast<char*>(x.ptr()) + 2, 1000, 1000), Status::InvalidArgument);  // misaligned x
  EXPECT_EQ(token(x.ptr(), 40000, 40000), Status::InvalidArgument);  // dim > 32768
  EXPECT_EQ(token(x.ptr(), 1000, 1000), Status::Ok);
  EXPECT_EQ(layernorm_modulate_quant_block128_cuda(ElemType::I8, x.ptr(), 4, 64, 64, m, m, 64, 4, kEps,
                                                   static_cast<int8_t*>(q.ptr()), 64, static_cast<float*>(sc.ptr()),
                                                   LnQuantBlockPath::Auto, s.native()),
            Status::InvalidArgument);
  // fp32 rows of 8192: 16 (or 8) rows do not fit in shared memory, so the
  // cluster path declines and Auto falls back to the portable kernel.
  EXPECT_EQ(layernorm_modulate_quant_block128_cuda(ElemType::F32, x.ptr(), 4, 8192, 8192, m, m, 8192, 4, kEps,
                                                   static_cast<int8_t*>(q.ptr()), 8192, static_cast<float*>(sc.ptr()),
                                                   LnQuantBlockPath::Cluster, s.native()),
            Status::Unsupported);
  s.synchronize();
}

}  // namespace
}  // namespace td::kernels

#endif  // TURBODIFF_HAVE_CUDA
