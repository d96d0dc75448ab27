#pragma once
// `branchgrpo bench iteration`: seconds per training iteration of dance and the BranchGRPO variants on one
// model, with the time split into model and library time, and the frontier batching speedup
// (docs/performance.md).

namespace CLI {
class App;
}  // namespace CLI

namespace branchgrpo::cli {

/// Registers the `bench` subcommand (with its `iteration` subcommand) on `app`. `bench iteration` runs
/// dance, branch, branch-widpru, branch-deppru and branch-mix alternately (A B C D E A B ...) on copies of one
/// model, same seed and prompts, and prints a table (one JSON object keyed by variant with --json). Throws
/// branchgrpo::invalid_input, naming the value, for a count below its minimum or a model that was not built.
/// Example: `branchgrpo bench iteration --model toy --iters 3 --json` ->
///   {"branch":{...,"seconds_per_iter":...,"time_ratio_vs_dance":...,"overhead_fraction":...,
///    "batching_speedup":...},"dance":{...,"time_ratio_vs_dance":1.0,...},...}.
void add_bench_command(CLI::App& app);

}  // namespace branchgrpo::cli
