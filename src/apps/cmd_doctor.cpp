// `turbodiff doctor`: what this machine offers turbodiff, checked without
// downloading anything or loading a model. The counterpart of TurboDiffusion's
// backend check.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "core/cuda_libraries.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "ops/registry.h"

namespace td::app {
namespace {

struct DoctorOptions {
  bool json = false;
  bool require_cuda = false;
  bool require_sagesla = false;
  int device = -1;  // -1: all
};

std::string version_str(int v) { return v ? cat(v / 1000, ".", (v % 1000) / 10) : "none"; }

int run_doctor(const DoctorOptions& o) {
  using nlohmann::json;
  json j;
  std::vector<std::string> failures;
  j["turbodiff_version"] = TURBODIFF_VERSION;
  j["built_with_cuda"] = cuda::built_with_cuda();
  j["compiled_cuda_archs"] = ops::compiled_cuda_archs();
#ifdef TURBODIFF_CUDA_COMPILER_VERSION
  j["cuda_compiler"] = TURBODIFF_CUDA_COMPILER_VERSION;
#endif
  j["cuda_runtime"] = cuda::built_with_cuda() ? version_str(cuda::runtime_version()) : "none";
  j["cuda_driver"] = version_str(cuda::driver_version());

  json libs = json::array();
  for (const auto& l : cuda::probe_cuda_libraries())
    libs.push_back({{"name", l.name}, {"found", l.found}, {"version", l.version}, {"path", l.path}, {"error", l.error}});
  j["libraries"] = libs;

  const int n = cuda::device_count();
  j["gpu_count"] = n;
  if (n == 0) j["gpu_unavailable_reason"] = cuda::unavailable_reason();
  if (o.device >= 0 && o.device >= n)
    fail(ErrorKind::Usage, "--device ", o.device, ": this machine has ", n, " CUDA device", n == 1 ? "" : "s",
         n == 0 ? cat(" (", cuda::unavailable_reason(), ")") : "");

  json gpus = json::array();
  bool sagesla_ok = false;
  for (int d = 0; d < n; ++d) {
    if (o.device >= 0 && d != o.device) continue;
    const auto info = cuda::device_info(d);
    json g = {{"index", d}, {"name", info.name}, {"compute_capability", cat(info.cc_major, ".", info.cc_minor)},
              {"sm_count", info.sm_count}, {"memory_total_bytes", info.total_memory},
              {"memory_free_bytes", info.free_memory}, {"l2_bytes", info.l2_bytes}};
    json fams = json::array();
    for (const auto& f : ops::kernel_families()) {
      std::string how;
      const auto archs = ops::family_archs(f);
      const bool runs = ops::archs_run_on(archs, info.cc_major, info.cc_minor, &how);
      json fj = {{"family", f.name}, {"archs", archs}, {"runs_here", runs}, {"how", how}};
      json smoke = json::array();
      bool all_ok = runs;
      if (runs && f.smoke) {
        cuda::set_device(d);
        for (const auto& [op, r] : f.smoke(d)) {
          smoke.push_back({{"op", op}, {"ok", r.ok}, {"detail", r.detail}});
          if (!r.ok) {
            all_ok = false;
            failures.push_back(cat("GPU ", d, ": ", f.name, "/", op, " smoke test failed: ", r.detail));
          }
        }
      }
      fj["smoke"] = smoke;
      fams.push_back(fj);
      if (f.name == "sagesla" && all_ok) sagesla_ok = true;
    }
    g["kernel_families"] = fams;
    gpus.push_back(g);
  }
  j["gpus"] = gpus;

  json cpu_fams = json::array();
  for (const auto& f : ops::kernel_families()) cpu_fams.push_back(f.name);
  j["cpu_reference_families"] = cpu_fams;

  if (o.require_cuda && n == 0) failures.push_back(cat("--require-cuda: no usable CUDA GPU: ", cuda::unavailable_reason()));
  if (o.require_sagesla && !sagesla_ok) {
    bool built = false;
    for (const auto& f : ops::kernel_families()) built |= f.name == "sagesla";
    failures.push_back(built ? "--require-sagesla: the SageSLA kernels did not pass their smoke test on any selected GPU"
                             : "--require-sagesla: this build has no SageSLA kernels (built without CUDA)");
  }
  j["failures"] = failures;
  j["ok"] = failures.empty();

  if (o.json) {
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("turbodiff %s\n", TURBODIFF_VERSION);
    std::printf("  CUDA build:    %s", cuda::built_with_cuda() ? "yes" : "no (CPU only)");
    if (cuda::built_with_cuda()) {
      std::string archs;
      for (auto& a : ops::compiled_cuda_archs()) archs += (archs.empty() ? "sm_" : ", sm_") + a;
      std::printf(", runtime %s, archs %s", j["cuda_runtime"].get<std::string>().c_str(), archs.c_str());
    }
    std::printf("\n  CUDA driver:   %s\n", j["cuda_driver"].get<std::string>().c_str());
    for (const auto& l : libs)
      std::printf("  %-14s %s\n", (l["name"].get<std::string>() + ":").c_str(),
                  l["found"].get<bool>() ? (l["version"].get<std::string>() + "  (" + l["path"].get<std::string>() + ")").c_str()
                                         : ("not found: " + l["error"].get<std::string>()).c_str());
    if (n == 0) std::printf("  GPUs:          none (%s)\n", cuda::unavailable_reason().c_str());
    for (const auto& g : gpus) {
      std::printf("  GPU %d:         %s, compute %s, %d SMs, %.1f GiB (%.1f GiB free)\n", g["index"].get<int>(),
                  g["name"].get<std::string>().c_str(), g["compute_capability"].get<std::string>().c_str(),
                  g["sm_count"].get<int>(), g["memory_total_bytes"].get<double>() / (1 << 30),
                  g["memory_free_bytes"].get<double>() / (1 << 30));
      for (const auto& f : g["kernel_families"]) {
        std::string smoke;
        for (const auto& s : f["smoke"])
          smoke += cat(" ", s["op"].get<std::string>(), s["ok"].get<bool>() ? ":ok" : ":FAIL");
        std::printf("    %-14s %s%s\n", f["family"].get<std::string>().c_str(),
                    f["runs_here"].get<bool>() ? ("runs (" + f["how"].get<std::string>() + ")").c_str() : "cannot run here",
                    smoke.c_str());
      }
    }
    std::printf("  CPU reference: %zu kernel families\n", ops::kernel_families().size());
    for (const auto& f : failures) std::printf("FAIL: %s\n", f.c_str());
    std::printf("%s\n", failures.empty() ? "doctor: all checks passed" : "doctor: some checks failed");
  }
  return failures.empty() ? 0 : 1;
}

}  // namespace

void register_doctor(CLI::App& app, Commands& cmds) {
  auto opts = std::make_shared<DoctorOptions>();
  auto* sub = app.add_subcommand("doctor",
      "Check this machine: driver, GPUs, CUDA libraries, compiled kernels and a smoke run of each against its CPU reference");
  sub->add_flag("--json", opts->json, "Print the report as JSON");
  sub->add_flag("--require-cuda", opts->require_cuda, "Fail (exit 1) unless a usable CUDA GPU is present");
  sub->add_flag("--require-sagesla", opts->require_sagesla, "Fail (exit 1) unless the SageSLA kernels run on the GPU");
  sub->add_option("--device", opts->device, "Check only this CUDA device")->check(CLI::NonNegativeNumber);
  cmds.emplace_back(sub, [opts] { return run_doctor(*opts); });
}

}  // namespace td::app
