// Build without CUDA: the facade reports no devices, and anything that needs a
// GPU says that this binary was built without CUDA.
#include "core/cuda_runtime.h"

#include "core/error.h"

namespace td::cuda {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  fail(ErrorKind::Unsupported, what, ": this turbodiff was built without CUDA (reconfigure with nvcc on PATH)");
}
}  // namespace

bool built_with_cuda() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return "this turbodiff was built without CUDA"; }
DeviceInfo device_info(int) { no_cuda("device_info"); }
int driver_version() { return 0; }
int runtime_version() { return 0; }
void set_device(int) { no_cuda("set_device"); }
void* current_stream() { return nullptr; }
void* device_alloc(size_t, int) { no_cuda("GPU allocation"); }
void device_free(void*, int) {}
size_t allocated_bytes(int) { return 0; }
size_t peak_allocated_bytes(int) { return 0; }
void reset_peak(int) {}
void memset_zero(void*, size_t, int) { no_cuda("memset"); }
void memcpy_sync(void*, const void*, size_t, bool) { no_cuda("memcpy"); }
void memcpy_d2d(void*, const void*, size_t, int) { no_cuda("memcpy"); }
void synchronize(int) { no_cuda("synchronize"); }
void check_last_launch(const char*) {}
Stream::Stream(int) { no_cuda("Stream"); }
Stream::~Stream() = default;
void Stream::synchronize() const {}
Event::Event() { no_cuda("Event"); }
Event::~Event() = default;
void Event::record(void*) {}
void Event::synchronize() const {}
float Event::elapsed_ms(const Event&, const Event&) { return 0; }
}  // namespace td::cuda
