// Error type and checking macros. Every message says what was wrong, where,
// what was expected and what was found: the CLI prints it as-is.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace td {

// Broad category of a failure; the CLI maps Usage to exit code 2, the rest to 1.
enum class ErrorKind {
  Usage,        // bad flag or argument value
  Io,           // file cannot be opened, read, written
  Format,       // file content malformed (safetensors header, pickle, zip)
  Shape,        // tensor shape does not match what is expected
  DType,        // tensor dtype not supported here
  Unsupported,  // valid request this build / GPU / checkpoint cannot serve
  Cuda,         // CUDA runtime or library error
  OutOfMemory,  // host or device allocation failed
  Internal,     // a bug: an invariant of turbodiff itself broke
};

const char* error_kind_name(ErrorKind k);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Concatenates any streamable values: cat("tensor ", name, " has ", n, " dims").
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, Args&&... args) {
  throw Error(kind, cat(std::forward<Args>(args)...));
}

}  // namespace td

// TD_CHECK(cond, kind, message parts...): throws td::Error(kind, message) when cond is false.
#define TD_CHECK(cond, kind, ...)                         \
  do {                                                    \
    if (!(cond)) ::td::fail(::td::ErrorKind::kind, __VA_ARGS__); \
  } while (0)
