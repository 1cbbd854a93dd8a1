// A progress bar for long work on stderr: label, bar, count, rate and ETA.
// Redraws in place on a terminal; on a pipe it prints only the final line.
// Disabled globally by set_progress_enabled(false) (the CLI's --quiet/--json).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace td {

void set_progress_enabled(bool enabled);
bool progress_enabled();

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, std::string unit = "");
  ~ProgressBar();  // finishes the bar if finish() was not called
  void advance(int64_t n = 1);
  void set(int64_t done);
  void finish();
  double elapsed_seconds() const;

 private:
  void draw(bool final_line);
  std::string label_, unit_;
  int64_t total_, done_ = 0;
  bool finished_ = false, tty_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace td
