// Leveled logging to stderr. The level comes from set_log_level() (the CLI's
// --verbose/--quiet) or the TURBODIFF_LOG environment variable
// (error|warn|info|debug).
#pragma once

#include <string>

#include "core/error.h"

namespace td {

enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_message(LogLevel level, const std::string& msg);
// Logs msg once per distinct `key` for the life of the process (fallback reasons).
void log_once(LogLevel level, const std::string& key, const std::string& msg);

template <typename... A> void log_error(A&&... a) { if (log_level() >= LogLevel::Error) log_message(LogLevel::Error, cat(std::forward<A>(a)...)); }
template <typename... A> void log_warn(A&&... a) { if (log_level() >= LogLevel::Warn) log_message(LogLevel::Warn, cat(std::forward<A>(a)...)); }
template <typename... A> void log_info(A&&... a) { if (log_level() >= LogLevel::Info) log_message(LogLevel::Info, cat(std::forward<A>(a)...)); }
template <typename... A> void log_debug(A&&... a) { if (log_level() >= LogLevel::Debug) log_message(LogLevel::Debug, cat(std::forward<A>(a)...)); }

}  // namespace td
