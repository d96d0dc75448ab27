// The branchgrpo command-line tool. Each subcommand lives in its own <name>_command.cpp (declared in
// cli/commands.hpp) and registers itself on the app; errors end the run with one line on stderr and a non-zero
// exit status: 2 for invalid input refused before the run (branchgrpo::invalid_input), 1 for a failure of the
// system during it (a server, a rank, a failed write: standard output is checked after every command,
// cli/output_file.hpp), 128 + signal when SIGINT / SIGTERM stopped a long loop (branchgrpo::stop_requested;
// docs/reliability.md, "Exit status").
#include <CLI/CLI.hpp>
#include <signal.h>

#include <algorithm>
#include <csignal>
#include <exception>
#include <iostream>
#include <string>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/core/stop.hpp"
#include "cli/commands.hpp"
#include "cli/output/output_file.hpp"

namespace {

// One line whatever the message holds, so scripts can rely on it. A library error (LibTorch's c10::Error) carries
// a backtrace after its first line: only the first line is the message. The values in a message are cut where
// they are echoed (echo_text, echo_middle, path_text); the line as a whole is cut here too, at 1000 characters,
// so that no message of any origin (CLI11's, the system's) prints megabytes.
int report_error(std::string message, int exit_code) {
  constexpr std::size_t most = 1000;
  if (const auto backtrace = message.find("\nException raised from "); backtrace != std::string::npos)
    message.resize(backtrace);
  std::replace(message.begin(), message.end(), '\n', ' ');
  std::cerr << "branchgrpo: " << branchgrpo::echo_middle(message, most) << '\n';
  return exit_code;
}

#ifndef BRANCHGRPO_CLI_TORCH
// Without LibTorch the LibTorch subcommands still exist, and say what they need.
void add_unavailable_command(CLI::App& app, const std::string& name, const std::string& description) {
  CLI::App* command = app.add_subcommand(name, description + " (needs LibTorch: not built)");
  command->allow_extras();
  command->callback([name] {
    branchgrpo::fail("branchgrpo ", name,
                     " needs the LibTorch adapter (not built): install LibTorch, toml++ and "
                     "TurboJPEG (scripts/setup.sh) and rebuild");
  });
}
#endif

std::string missing_subcommand(CLI::App& app) {
  std::string names;
  for (const CLI::App* command : app.get_subcommands([](CLI::App*) { return true; }))
    names += (names.empty() ? "" : ", ") + command->get_name();
  return "a subcommand is required: " + names + " (see --help)";
}

}  // namespace

int main(int argc, char** argv) {
  // Over `ulimit -f`, a write fails with EFBIG and its reason is reported (write_error); by default SIGXFSZ would
  // kill the process with no message (exit 153).
  ::signal(SIGXFSZ, SIG_IGN);
  const branchgrpo::cli::checked_standard_output standard_output;  // every write to std::cout checked, errno kept
  CLI::App app{"BranchGRPO: tree-structured GRPO for diffusion and flow-matching models", "branchgrpo"};
  app.require_subcommand(0, 1);  // "none" is reported below; an unknown word is an ExtrasError naming it
  branchgrpo::cli::add_tree_command(app);
  branchgrpo::cli::add_toy_command(app);
  branchgrpo::cli::add_compare_command(app);  // the toy always; --model shapes with LibTorch
  branchgrpo::cli::add_gradient_signal_command(app);
  branchgrpo::cli::add_bench_command(app);
  branchgrpo::cli::add_weights_command(app);
  branchgrpo::cli::add_policies_command(app);
#ifdef BRANCHGRPO_CLI_TORCH
  branchgrpo::cli::add_pretrain_command(app);
  branchgrpo::cli::add_train_command(app);
  branchgrpo::cli::add_sample_command(app);
  branchgrpo::cli::add_export_lora_command(app);
  branchgrpo::cli::add_demo_command(app);
#else
  add_unavailable_command(app, "train", "Align a model with the run a TOML config describes");
  add_unavailable_command(app, "sample", "Render a grid of a checkpoint's samples");
  add_unavailable_command(app, "export-lora", "Write a checkpoint's LoRA for diffusers, kohya or ComfyUI");
  add_unavailable_command(app, "demo", "Align the shipped shapes model with every method; write a report");
#endif

  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty())
      return report_error(missing_subcommand(app), static_cast<int>(CLI::ExitCodes::RequiredError));
    branchgrpo::cli::check_standard_output();
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) {  // --help prints the usage and succeeds, when the usage was written
      const int code = app.exit(error);
      try {
        branchgrpo::cli::check_standard_output();
      } catch (const std::exception& failure) {
        return report_error(failure.what(), 1);
      }
      return code;
    }
    return report_error(error.what(), error.get_exit_code());
  } catch (const branchgrpo::invalid_input& error) {
    return report_error(error.what(), 2);
  } catch (const branchgrpo::stop_requested& stopped) {
    return report_error(stopped.what(), 128 + stopped.signal());
  } catch (const std::exception& error) {
    // A failure after a stop request is part of the stop (a rank whose peer stopped first loses its connection).
    if (const int signal = branchgrpo::stop_signal(); signal != 0)
      return report_error("stopped by " + branchgrpo::stop_signal_name(signal) + " (then: " + error.what() + ")",
                          128 + signal);
    return report_error(error.what(), 1);
  }
  return 0;
}
