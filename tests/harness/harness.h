// Shared test helpers: fresh random inputs (seed printed, overridable with
// TURBODIFF_TEST_SEED), poisoned outputs, accuracy metrics against a reference,
// GPU skipping, and running the CLI.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/tensor.h"

namespace td::test {

// A generator seeded freshly for every test (from std::random_device), unless
// TURBODIFF_TEST_SEED is set. The seed is recorded as a test property so a failure can be replayed.
std::mt19937_64& rng();
uint64_t current_seed();

std::vector<float> randn(size_t n, float mean = 0.f, float stddev = 1.f);
std::vector<float> randu(size_t n, float lo, float hi);
// Host tensor of the given dtype filled with N(mean, stddev) values (rounded to the dtype).
Tensor randn_tensor(const Shape& shape, DType dtype, float stddev = 1.f, float mean = 0.f);

// The poison written into outputs before a kernel runs: NaN for floating
// types, 0x5A bytes for integer ones. An element the kernel forgot stays NaN.
void poison(void* data, size_t nbytes, DType dtype);
void poison(Tensor& t);  // host or device

struct Accuracy {
  double rel_l2 = 0;     // ||out - ref|| / ||ref||
  double cosine = 0;     // <out, ref> / (|out| |ref|)
  double rel_l1 = 0;     // sum|out - ref| / sum|ref|
  double max_abs = 0;    // max |out - ref|
  size_t nonfinite = 0;  // elements of out that are NaN or inf (poison left behind)
  size_t n = 0;
  std::string str() const;
};
Accuracy compare(const std::vector<double>& out, const std::vector<double>& ref);
Accuracy compare(const Tensor& out, const Tensor& ref);  // any dtype, host or device

// Asserts rel_l2 <= max_rel_l2, cosine >= min_cosine and no non-finite element.
#define TD_EXPECT_CLOSE(acc, max_rel_l2, min_cosine)                                            \
  do {                                                                                          \
    const ::td::test::Accuracy _a = (acc);                                                      \
    EXPECT_EQ(_a.nonfinite, 0u) << "non-finite outputs (unwritten?): " << _a.str();             \
    EXPECT_LE(_a.rel_l2, (max_rel_l2)) << _a.str();                                             \
    EXPECT_GE(_a.cosine, (min_cosine)) << _a.str();                                             \
  } while (0)

bool gpu_available();
// Skips the current test with the reason when no CUDA GPU can be used.
#define TD_REQUIRE_GPU()                                                                        \
  do {                                                                                          \
    if (!::td::test::gpu_available())                                                           \
      GTEST_SKIP() << "no CUDA GPU: " << ::td::cuda::unavailable_reason();                      \
  } while (0)

// Runs the built `turbodiff` binary with args (a shell-quoted string); captures stdout+stderr.
struct CliResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
CliResult run_cli(const std::string& args);
std::string cli_path();
std::string source_dir();
// A fresh temporary directory removed at process exit.
std::string temp_dir();

// The message of the td::Error that f throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace td::test
