// Registration of the CLI subcommands. Each register_* adds its subcommand to
// the app and a function that runs it (returning the exit code) to `cmds`.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <utility>
#include <vector>

namespace td::app {

using Commands = std::vector<std::pair<CLI::App*, std::function<int()>>>;

void register_info(CLI::App& app, Commands& cmds);
void register_doctor(CLI::App& app, Commands& cmds);
void register_dit(CLI::App& app, Commands& cmds);
void register_vae(CLI::App& app, Commands& cmds);
void register_quantize(CLI::App& app, Commands& cmds);
void register_encode_text(CLI::App& app, Commands& cmds);
void register_generate(CLI::App& app, Commands& cmds);
void register_bench(CLI::App& app, Commands& cmds);

}  // namespace td::app
