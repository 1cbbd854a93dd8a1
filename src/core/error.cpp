#include "core/error.h"

namespace td {

const char* error_kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::Usage: return "usage error";
    case ErrorKind::Io: return "I/O error";
    case ErrorKind::Format: return "format error";
    case ErrorKind::Shape: return "shape error";
    case ErrorKind::DType: return "dtype error";
    case ErrorKind::Unsupported: return "unsupported";
    case ErrorKind::Cuda: return "CUDA error";
    case ErrorKind::OutOfMemory: return "out of memory";
    case ErrorKind::Internal: return "internal error";
  }
  return "error";
}

}  // namespace td
