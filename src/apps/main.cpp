// The turbodiff command line: a thin layer over the library. Each subcommand
// lives in its own cmd_*.cpp and registers itself here.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "apps/commands.h"
#include "core/error.h"
#include "core/log.h"

int main(int argc, char** argv) {
  CLI::App app{"turbodiff: fast video diffusion (Wan2.1/2.2 DiTs with SageSLA, W8A8, FastNorm, rCM)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("turbodiff ") + TURBODIFF_VERSION);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "Log more (same as TURBODIFF_LOG=info)");

  td::app::Commands cmds;
  td::app::register_info(app, cmds);
  td::app::register_doctor(app, cmds);
  td::app::register_dit(app, cmds);
  td::app::register_vae(app, cmds);
  td::app::register_quantize(app, cmds);
  td::app::register_encode_text(app, cmds);
  td::app::register_generate(app, cmds);
  td::app::register_bench(app, cmds);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0 through here; real usage errors exit 2.
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (verbose) td::set_log_level(td::LogLevel::Info);
  try {
    for (auto& [sub, run] : cmds)
      if (sub->parsed()) return run();
    return 2;
  } catch (const td::Error& e) {
    std::fprintf(stderr, "turbodiff: %s: %s\n", td::error_kind_name(e.kind()), e.what());
    return e.kind() == td::ErrorKind::Usage ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "turbodiff: error: %s\n", e.what());
    return 1;
  }
}
