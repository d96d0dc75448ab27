#pragma once
// `branchgrpo tree`: the shape and cost of one rollout tree of a topology (docs/cli.md).

namespace CLI {
class App;
}  // namespace CLI

namespace branchgrpo::cli {

/// Registers the `tree` subcommand on `app`. It prints a table (or one JSON object with --json) and throws
/// branchgrpo::invalid_input, naming the value, for a topology or schedule the core rejects.
/// Example: `branchgrpo tree --json` -> {"edges":218,...,"evaluations":203,...,"leaves":16,"nodes":219,...}.
void add_tree_command(CLI::App& app);

}  // namespace branchgrpo::cli
