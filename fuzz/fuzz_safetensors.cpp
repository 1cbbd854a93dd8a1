// libFuzzer target for the safetensors parser. The input is copied into a
// buffer of exactly its size (so AddressSanitizer flags any read past it), then
// every byte of every returned tensor is read: a view that reaches outside the
// input is caught here rather than in a kernel later. td::Error is the parser's
// only allowed way to reject an input; anything else escaping is a finding.
#include <cstdint>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::shared_ptr<uint8_t[]> copy(new uint8_t[size == 0 ? 1 : size]);
  if (size) std::memcpy(copy.get(), data, size);
  try {
    const td::io::TensorFile f = td::io::parse_safetensors(copy, copy.get(), size, "fuzz.safetensors");
    uint64_t sum = 0;
    for (const auto& [name, t] : f.tensors) {
      const auto* p = static_cast<const uint8_t*>(t.raw_data());
      for (size_t i = 0; i < t.nbytes(); ++i) sum += p[i];
      sum += name.size();
    }
    // Keeps the reads from being optimised away.
    volatile uint64_t sink = sum;
    (void)sink;
  } catch (const td::Error&) {
  }
  return 0;
}
