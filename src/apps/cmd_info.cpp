#include "apps/commands.h"

namespace td::app {
void register_info(CLI::App& app, Commands& cmds) {
  auto* sub = app.add_subcommand("info", "Describe checkpoint files (placeholder until io lands)");
  cmds.emplace_back(sub, [] { return 1; });
}
}  // namespace td::app
