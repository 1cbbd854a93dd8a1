// Fuzz target for the PyTorch checkpoint reader (zip central directory, the
// pickle interpreter, storage resolution and tensor view validation).
// Any td::Error is an accepted outcome; a crash, a sanitizer report, a hang or
// any other exception is a bug. Every byte a returned tensor can reach is read,
// so a view that escapes its storage shows up under AddressSanitizer.
#include <cstdint>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "io/pth.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A heap copy of exactly `size` bytes: reads past the end are caught.
  std::shared_ptr<uint8_t[]> copy(new uint8_t[size > 0 ? size : 1]);
  if (size > 0) std::memcpy(copy.get(), data, size);
  try {
    const td::io::TensorFile f = td::io::parse_pth(copy, copy.get(), size, "fuzz.pth");
    uint8_t acc = 0;
    for (const auto& [name, t] : f.tensors) {
      acc ^= uint8_t(name.size());
      if (t.numel() == 0) continue;
      // The view's footprint: from its first element to the furthest one its
      // strides reach (touching each element would take forever for stride-0 views).
      int64_t last = 0;
      for (int64_t d = 0; d < t.dim(); ++d) last += (t.shape()[size_t(d)] - 1) * t.strides()[size_t(d)];
      const size_t bytes = size_t(last + 1) * td::dtype_size(t.dtype());
      const auto* p = static_cast<const uint8_t*>(t.raw_data());
      for (size_t i = 0; i < bytes; ++i) acc ^= p[i];
    }
    for (const auto& [k, v] : f.metadata) acc ^= uint8_t(k.size() + v.size());
    volatile uint8_t sink = acc;
    (void)sink;
  } catch (const td::Error&) {
    // Rejected with a message: what hostile input must get.
  }
  return 0;
}
