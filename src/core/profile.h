// A small in-process profiler: time per op class (GEMM, attention, norm) of
// the code between enable() and collect(). Off by default; when off a Scope
// is one relaxed atomic load and nothing else.
//
// On CUDA a Scope records a pair of events on the current stream (the one
// every op launches on), so the times are GPU times, collected after a
// synchronisation; on the CPU (synchronous ops) it reads the steady clock.
// Scopes nest: only the outermost one of a thread counts, so a GEMM inside an
// attention layer is not counted twice. Whatever runs outside every Scope
// (elementwise ops, embeddings, layout, launch gaps) is "other": the caller
// measures the total and subtracts.
#pragma once

#include <array>
#include <atomic>
#include <string>

namespace td::prof {

enum class OpClass { Gemm = 0, Attention, Norm, Count };
const char* op_class_name(OpClass c);  // "gemm", "attention", "norm"

namespace detail {
extern std::atomic<bool> g_enabled;
void begin(OpClass c, bool cuda);
void end(bool cuda);
}  // namespace detail

inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

// Starts recording (clears what was recorded). `cuda`: time with CUDA events
// (device 0's current stream) instead of the host clock.
void enable(bool cuda);
void disable();

struct Summary {
  std::array<double, size_t(OpClass::Count)> ms{};
  std::array<long, size_t(OpClass::Count)> calls{};
};
// Synchronises (CUDA), sums the recorded scopes by class and clears them;
// recording goes on while enabled.
Summary collect();

class Scope {
 public:
  // `cuda`: whether the op runs on a CUDA tensor (pass t.device().is_cuda()).
  Scope(OpClass c, bool cuda) : active_(enabled()), cuda_(cuda) {
    if (active_) detail::begin(c, cuda_);
  }
  ~Scope() {
    if (active_) detail::end(cuda_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool active_, cuda_;
};

}  // namespace td::prof
