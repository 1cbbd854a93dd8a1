#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace td {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    ++active_;
    while (next_ < job_n_) {
      const int64_t b = next_;
      const int64_t e = std::min(job_n_, b + chunk_);
      next_ = e;
      auto* job = job_;
      lk.unlock();
      try {
        (*job)(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> g(mu_);
        if (!error_) error_ = std::current_exception();
      }
      lk.lock();
    }
    if (--active_ == 0) done_cv_.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (workers_.empty() || n <= grain) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  std::unique_lock<std::mutex> lk(mu_);
  job_ = &fn;
  job_n_ = n;
  chunk_ = std::max(grain, (n + int64_t(size()) * 4 - 1) / (int64_t(size()) * 4));
  next_ = 0;
  error_ = nullptr;
  ++generation_;
  cv_.notify_all();
  ++active_;
  while (next_ < job_n_) {
    const int64_t b = next_;
    const int64_t e = std::min(job_n_, b + chunk_);
    next_ = e;
    lk.unlock();
    try {
      fn(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> g(mu_);
      if (!error_) error_ = std::current_exception();
    }
    lk.lock();
  }
  --active_;
  done_cv_.wait(lk, [&] { return active_ == 0; });
  job_ = nullptr;
  job_n_ = 0;
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (const char* e = std::getenv("TURBODIFF_THREADS")) {
      int n = std::atoi(e);
      if (n > 0) return n;
    }
    return int(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return pool;
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  ThreadPool::global().parallel_for(n, grain, fn);
}

}  // namespace td
