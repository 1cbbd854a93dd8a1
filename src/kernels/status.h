// What every kernel entry point returns. Kernels are framework-free: raw
// pointers, sizes, a stream (as void*, a cudaStream_t), and a Status back; they
// never allocate, log or throw. The ops layer turns a bad Status into a td::Error.
#pragma once

namespace td::kernels {

enum class Status {
  Ok = 0,
  InvalidArgument,  // a size, stride, pointer alignment or dtype the kernel does not accept
  Unsupported,      // valid, but this kernel variant does not handle it (caller may fall back)
  LaunchFailed,     // the CUDA launch reported an error
};

inline const char* status_str(Status s) {
  switch (s) {
    case Status::Ok: return "ok";
    case Status::InvalidArgument: return "invalid argument";
    case Status::Unsupported: return "unsupported by this kernel";
    case Status::LaunchFailed: return "CUDA launch failed";
  }
  return "?";
}

// Element types kernels are instantiated for (a subset of td::DType, kept
// separate so kernels do not depend on core/).
enum class ElemType { F32, F16, BF16, I8, F8E4M3 };

}  // namespace td::kernels
