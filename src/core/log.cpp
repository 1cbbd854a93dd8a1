#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

namespace td {
namespace {

LogLevel level_from_env() {
  const char* e = std::getenv("TURBODIFF_LOG");
  if (!e) return LogLevel::Warn;
  if (!std::strcmp(e, "error")) return LogLevel::Error;
  if (!std::strcmp(e, "info")) return LogLevel::Info;
  if (!std::strcmp(e, "debug")) return LogLevel::Debug;
  return LogLevel::Warn;
}

std::atomic<int> g_level{int(level_from_env())};
std::mutex g_mu;

}  // namespace

void set_log_level(LogLevel level) { g_level.store(int(level)); }
LogLevel log_level() { return LogLevel(g_level.load()); }

void log_message(LogLevel level, const std::string& msg) {
  static const char* names[] = {"error", "warning", "info", "debug"};
  std::lock_guard<std::mutex> lk(g_mu);
  std::fprintf(stderr, "turbodiff: %s: %s\n", names[int(level)], msg.c_str());
}

void log_once(LogLevel level, const std::string& key, const std::string& msg) {
  static std::set<std::string> seen;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!seen.insert(key).second) return;
  }
  if (log_level() >= level) log_message(level, msg);
}

}  // namespace td
