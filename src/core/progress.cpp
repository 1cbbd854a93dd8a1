#include "core/progress.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>

namespace td {
namespace {
std::atomic<bool> g_enabled{true};
}

void set_progress_enabled(bool enabled) { g_enabled.store(enabled); }
bool progress_enabled() { return g_enabled.load(); }

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), tty_(isatty(2) != 0),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {
  if (progress_enabled() && tty_) draw(false);
}

ProgressBar::~ProgressBar() {
  if (!finished_) finish();
}

void ProgressBar::advance(int64_t n) { set(done_ + n); }

void ProgressBar::set(int64_t done) {
  done_ = done;
  const auto now = std::chrono::steady_clock::now();
  if (progress_enabled() && tty_ && now - last_draw_ > std::chrono::milliseconds(100)) {
    last_draw_ = now;
    draw(false);
  }
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (progress_enabled()) draw(true);
}

double ProgressBar::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ProgressBar::draw(bool final_line) {
  const double t = elapsed_seconds();
  const double frac = total_ > 0 ? double(done_) / double(total_) : 1.0;
  constexpr int kWidth = 30;
  const int filled = int(frac * kWidth + 0.5);
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : '-';
  bar[kWidth] = 0;
  const double rate = t > 0 ? double(done_) / t : 0;
  const double eta = rate > 0 && total_ > done_ ? double(total_ - done_) / rate : 0;
  std::fprintf(stderr, "%s%-18s [%s] %lld/%lld%s%s  %.1fs", tty_ ? "\r" : "", label_.c_str(), bar,
               (long long)done_, (long long)total_, unit_.empty() ? "" : " ", unit_.c_str(), t);
  if (!final_line && eta > 0) std::fprintf(stderr, "  eta %.1fs", eta);
  if (final_line) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace td
