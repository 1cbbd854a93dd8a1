// Replays every file of a corpus directory (or the files named) through
// LLVMFuzzerTestOneInput: the regression test for inputs the fuzzers found or
// that we wrote by hand. Exits non-zero if the target crashes (it aborts).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static void run_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

int main(int argc, char** argv) {
  size_t n = 0;
  for (int i = 1; i < argc; ++i) {
    std::filesystem::path p(argv[i]);
    if (std::filesystem::is_directory(p)) {
      for (auto& e : std::filesystem::recursive_directory_iterator(p))
        if (e.is_regular_file()) run_file(e.path()), ++n;
    } else if (std::filesystem::exists(p)) {
      run_file(p), ++n;
    } else {
      std::fprintf(stderr, "replay: %s does not exist\n", argv[i]);
      return 1;
    }
  }
  std::printf("replayed %zu inputs, no crash\n", n);
  return n > 0 ? 0 : 1;
}
