// Versions of the CUDA libraries found at run time (dlopen), for `doctor`:
// what the dynamic loader would give turbodiff on this machine, whether or not
// this build links them.
#pragma once

#include <string>
#include <vector>

namespace td::cuda {

struct LibraryVersion {
  std::string name;     // "cuBLAS", "cuDNN", "NCCL", "CUDA driver (libcuda)"
  bool found = false;
  std::string version;  // "13.0.2"
  std::string path;     // the soname that loaded
  std::string error;    // why not found
};

std::vector<LibraryVersion> probe_cuda_libraries();

}  // namespace td::cuda
