#include "core/profile.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "core/cuda_runtime.h"

namespace td::prof {
namespace detail {
std::atomic<bool> g_enabled{false};
}  // namespace detail

namespace {

struct Record {
  OpClass cls;
  bool cuda;
  std::unique_ptr<cuda::Event> start, stop;  // CUDA scopes
  std::chrono::steady_clock::time_point t0, t1;  // host scopes
};

std::mutex g_mutex;
std::vector<Record> g_records;
thread_local int t_depth = 0;
thread_local long t_open = -1;  // index of the outermost open record of this thread

}  // namespace

const char* op_class_name(OpClass c) {
  switch (c) {
    case OpClass::Gemm: return "gemm";
    case OpClass::Attention: return "attention";
    case OpClass::Norm: return "norm";
    default: return "?";
  }
}

void enable(bool) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_records.clear();
  detail::g_enabled.store(true);
}

void disable() { detail::g_enabled.store(false); }

void detail::begin(OpClass c, bool is_cuda) {
  if (t_depth++ > 0) return;
  Record r;
  r.cls = c;
  r.cuda = is_cuda;
  if (is_cuda) {
    r.start = std::make_unique<cuda::Event>();
    r.stop = std::make_unique<cuda::Event>();
    r.start->record(cuda::current_stream());
  } else {
    r.t0 = std::chrono::steady_clock::now();
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_records.push_back(std::move(r));
  t_open = long(g_records.size()) - 1;
}

void detail::end(bool) {
  if (--t_depth > 0) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (t_open < 0 || size_t(t_open) >= g_records.size()) return;  // cleared by enable() meanwhile
  Record& r = g_records[size_t(t_open)];
  if (r.cuda)
    r.stop->record(cuda::current_stream());
  else
    r.t1 = std::chrono::steady_clock::now();
  t_open = -1;
}

Summary collect() {
  std::vector<Record> recs;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    recs.swap(g_records);
  }
  Summary s;
  for (auto& r : recs) {
    double ms = 0;
    if (r.cuda) {
      r.stop->synchronize();
      ms = cuda::Event::elapsed_ms(*r.start, *r.stop);
    } else {
      ms = std::chrono::duration<double, std::milli>(r.t1 - r.t0).count();
    }
    s.ms[size_t(r.cls)] += ms;
    s.calls[size_t(r.cls)] += 1;
  }
  return s;
}

}  // namespace td::prof
