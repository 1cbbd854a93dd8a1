#include "apps/commands.h"

namespace td::app {
void register_doctor(CLI::App& app, Commands& cmds) {
  auto* sub = app.add_subcommand("doctor", "Check this machine");
  cmds.emplace_back(sub, [] { return 1; });
}
}  // namespace td::app
