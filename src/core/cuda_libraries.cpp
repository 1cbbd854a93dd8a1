#include "core/cuda_libraries.h"

#include <dlfcn.h>

#include <cstddef>

#include "core/error.h"

namespace td::cuda {
namespace {

// dlopens the first of `sonames` that loads (also trying /usr/local/cuda/lib64),
// then calls `get` on the handle. Handles stay open: unloading CUDA libraries
// at exit has caused crashes elsewhere and costs nothing to skip.
template <typename F>
LibraryVersion probe(const char* name, std::initializer_list<const char*> sonames, F get) {
  LibraryVersion v;
  v.name = name;
  std::string errors;
  for (const char* so : sonames) {
    for (const std::string& path : {std::string(so), std::string("/usr/local/cuda/lib64/") + so}) {
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        const char* e = dlerror();
        if (errors.empty() && e) errors = e;
        continue;
      }
      v.path = path;
      v.version = get(h);
      v.found = !v.version.empty();
      if (v.found) return v;
      v.error = "loaded " + path + " but could not read its version";
      return v;
    }
  }
  v.error = errors.empty() ? "not found" : errors;
  return v;
}

}  // namespace

std::vector<LibraryVersion> probe_cuda_libraries() {
  std::vector<LibraryVersion> out;
  out.push_back(probe("CUDA driver (libcuda)", {"libcuda.so.1", "libcuda.so"}, [](void* h) -> std::string {
    using Fn = int (*)(int*);
    auto f = reinterpret_cast<Fn>(dlsym(h, "cuDriverGetVersion"));
    int v = 0;
    if (!f || f(&v) != 0) return "";
    return cat(v / 1000, ".", (v % 1000) / 10);
  }));
  out.push_back(probe("cuBLAS", {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}, [](void* h) -> std::string {
    using Fn = int (*)(int, int*);  // cublasGetProperty(libraryPropertyType, int*)
    auto f = reinterpret_cast<Fn>(dlsym(h, "cublasGetProperty"));
    int ma = 0, mi = 0, pa = 0;
    if (!f || f(0, &ma) != 0 || f(1, &mi) != 0 || f(2, &pa) != 0) return "";
    return cat(ma, ".", mi, ".", pa);
  }));
  out.push_back(probe("cuDNN", {"libcudnn.so.9", "libcudnn.so"}, [](void* h) -> std::string {
    using Fn = size_t (*)();
    auto f = reinterpret_cast<Fn>(dlsym(h, "cudnnGetVersion"));
    if (!f) return "";
    const size_t v = f();  // 9.x: major*10000 + minor*100 + patch
    return cat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
  }));
  out.push_back(probe("NCCL", {"libnccl.so.2", "libnccl.so"}, [](void* h) -> std::string {
    using Fn = int (*)(int*);
    auto f = reinterpret_cast<Fn>(dlsym(h, "ncclGetVersion"));
    int v = 0;
    if (!f || f(&v) != 0) return "";
    return cat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);  // 2.x: major*10000 + minor*100 + patch
  }));
  return out;
}

}  // namespace td::cuda
