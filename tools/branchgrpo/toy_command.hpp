#pragma once
// `branchgrpo toy`: trains the 2-D toy with one method (or every method, --compare) and reports reward, cost and
// time per iteration, with a CSV and PNG plots (docs/cli.md).

namespace CLI {
class App;
}  // namespace CLI

namespace branchgrpo::cli {

/// Registers the `toy` subcommand on `app`. It prints per-iteration stats (JSON lines with --json) or, with
/// --compare, a table of every method (one JSON object keyed by method with --json), writes
/// toy_<method>.csv or compare.csv, reward_vs_time.png and samples_before_after.png into --out, and throws
/// branchgrpo::invalid_input, naming the value, for an unknown method or a count below its minimum.
/// Example: `branchgrpo toy --method branch --iters 3 --json` -> three lines
///   {"edges":...,"edges_trained":...,"evaluations":...,"iteration":0,...,"reward_mean":...,"seconds":...}.
void add_toy_command(CLI::App& app);

}  // namespace branchgrpo::cli
