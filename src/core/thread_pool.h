// A fixed pool of worker threads for CPU kernels. parallel_for splits [0, n)
// into contiguous chunks; the calling thread takes part. Size from
// TURBODIFF_THREADS or the hardware concurrency.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace td {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // Calls fn(begin, end) on disjoint chunks covering [0, n), at least `grain` items each.
  // Exceptions thrown by fn are rethrown in the caller (the first one).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  static ThreadPool& global();

 private:
  void worker_loop();
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, chunk_ = 0, next_ = 0;
  int active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::mutex call_mu_;  // one parallel_for at a time
};

// Shorthand for ThreadPool::global().parallel_for.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace td
