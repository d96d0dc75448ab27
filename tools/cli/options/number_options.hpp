#pragma once
// The one way a subcommand declares a numeric flag. CLI11 parses the command line, but the text of every number
// goes through the core's parse_integer / parse_number (core/numbers.hpp), so "--seed -1", "--iters 1e3",
// "--steps 0x10", "--lr 1e999" and a pasted 300-digit number are refused with one line naming the flag, e.g.
// "--seed = -1: must be an integer in [0, 18446744073709551615]", instead of saturating or wrapping.
//
//   add_integer(cmd, "--prompts", value, "help", 1, 1'000'000)   one integer in [low, high]
//   add_number(cmd, "--lr", value, "help", 1e-12, 1)               one finite double in [low, high]
//   add_integer_list / add_number_list(cmd, "--split-steps", values, "help")
//                                                                 comma-separated; each element checked, the
//                                                                 message names it ("--sigmas[1] = nan: ...")
//   add_text_list(cmd, "--methods", values, "help")               comma-separated words
// A list given explicitly must hold at least one element: "--split-steps ''" is an error, never the default.
#include <CLI/CLI.hpp>

#include <cfloat>
#include <concepts>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"

namespace branchgrpo::cli {

namespace detail {

// The elements of a list option: each value split at ',' here, not by CLI11 (which drops empty elements, so
// "4,,2" would silently be "4,2"). An empty list or an empty element is an error.
inline std::vector<std::string> list_elements(const std::string& flag, const CLI::results_t& results) {
  std::vector<std::string> elements;
  for (const std::string& result : results) {
    std::size_t start = 0;
    for (std::size_t comma = result.find(','); comma != std::string::npos; comma = result.find(',', start)) {
      elements.push_back(result.substr(start, comma - start));
      start = comma + 1;
    }
    elements.push_back(result.substr(start));
  }
  const bool empty = elements.empty() || (elements.size() == 1 && elements.front().empty());
  require(!empty, flag, ": the list is empty (give at least one value, or leave the flag out for the default)");
  for (std::size_t i = 0; i < elements.size(); ++i)
    require(!elements[i].empty(), flag, ": element ", i, " of the list is empty");
  return elements;
}

// The one value of a scalar option (CLI11 refuses a second occurrence before the callback runs).
inline const std::string& single_element(const std::string& flag, const CLI::results_t& results) {
  require(results.size() == 1, flag, " takes one value, got ", results.size());
  return results.front();
}

inline std::string list_key(const std::string& flag, std::size_t i) { return flag + "[" + std::to_string(i) + "]"; }

}  // namespace detail

/// Declares the integer flag `flag` of `command`, stored in `value` (which must outlive the parse). The text must
/// be a decimal integer in [low, high] (parse_integer), else invalid_input naming the flag. `--help` shows the
/// default (chain ->capture_default_str()) and the range when it is not the whole type's.
/// Example: add_integer(toy, "--prompts", options->prompts, "Trees per iteration", 1, 1'000'000);
///   `toy --prompts 0` -> "--prompts = 0: must be an integer in [1, 1000000]".
template <std::integral T>
requires(!std::same_as<T, bool>) CLI::Option* add_integer(CLI::App* command, const std::string& flag, T& value,
                                                          std::string help, T low = std::numeric_limits<T>::min(),
                                                          T high = std::numeric_limits<T>::max()) {
  if (low != std::numeric_limits<T>::min() || high != std::numeric_limits<T>::max())
    help += " [" + std::to_string(low) + ", " + std::to_string(high) + "]";
  CLI::Option* option = command->add_option(
      flag,
      [&value, flag, low, high](const CLI::results_t& results) {
        value = parse_integer<T>(detail::single_element(flag, results), flag, low, high);
        return true;
      },
      help, false, [&value] { return std::to_string(value); });
  option->type_size(1)->expected(1)->type_name("INT");
  return option;
}

/// Declares the floating-point flag `flag`: a finite number in [low, high] (parse_number); `--help` shows the
/// range when one is given.
/// Example: add_number(pretrain, "--lr", options->lr, "Peak learning rate", 1e-12, 1); `--lr 1e999` ->
///   "--lr = 1e999: must be a finite number"; `--lr 5` -> "--lr = 5: must be a number in [1e-12, 1]".
inline CLI::Option* add_number(CLI::App* command, const std::string& flag, double& value, std::string help,
                               double low = -DBL_MAX, double high = DBL_MAX) {
  if (low != -DBL_MAX || high != DBL_MAX) help += " [" + number_bound_text(low) + ", " + number_bound_text(high) + "]";
  CLI::Option* option = command->add_option(
      flag,
      [&value, flag, low, high](const CLI::results_t& results) {
        value = parse_number(detail::single_element(flag, results), flag, low, high);
        return true;
      },
      help, false, [&value] { return CLI::detail::to_string(value); });
  option->type_size(1)->expected(1)->type_name("X");
  return option;
}

/// Declares a comma-separated integer list flag; each element in [low, high], the message naming its index.
/// Example: add_integer_list(tree, "--split-steps", options->split_steps, "Split steps");
///   `--split-steps 0,x` -> "--split-steps[1] = x: must be an integer in [-2147483648, 2147483647]";
///   `--split-steps ''` -> "--split-steps: the list is empty (...)".
template <std::integral T>
requires(!std::same_as<T, bool>) CLI::Option* add_integer_list(CLI::App* command, const std::string& flag,
                                                               std::vector<T>& values, std::string help,
                                                               T low = std::numeric_limits<T>::min(),
                                                               T high = std::numeric_limits<T>::max()) {
  if (low != std::numeric_limits<T>::min() || high != std::numeric_limits<T>::max())
    help += " [each " + std::to_string(low) + " to " + std::to_string(high) + "]";
  CLI::Option* option = command->add_option(
      flag,
      [&values, flag, low, high](const CLI::results_t& results) {
        std::vector<T> parsed;
        const std::vector<std::string> elements = detail::list_elements(flag, results);
        for (std::size_t i = 0; i < elements.size(); ++i)
          parsed.push_back(parse_integer<T>(elements[i], detail::list_key(flag, i), low, high));
        values = std::move(parsed);
        return true;
      },
      help);
  option->type_size(1)->expected(1, CLI::detail::expected_max_vector_size)->type_name("INT,...");
  return option;
}

/// Declares a comma-separated list of finite numbers.
/// Example: `tree --sigmas 1,nan,0` -> "--sigmas[1] = nan: must be a finite number".
inline CLI::Option* add_number_list(CLI::App* command, const std::string& flag, std::vector<double>& values,
                                    const std::string& help) {
  CLI::Option* option = command->add_option(
      flag,
      [&values, flag](const CLI::results_t& results) {
        std::vector<double> parsed;
        const std::vector<std::string> elements = detail::list_elements(flag, results);
        for (std::size_t i = 0; i < elements.size(); ++i)
          parsed.push_back(parse_number(elements[i], detail::list_key(flag, i)));
        values = std::move(parsed);
        return true;
      },
      help);
  option->type_size(1)->expected(1, CLI::detail::expected_max_vector_size)->type_name("X,...");
  return option;
}

/// Declares a comma-separated list of words (method names...): an empty list or element is an error.
/// Example: `demo --methods ''` -> "--methods: the list is empty (...)".
inline CLI::Option* add_text_list(CLI::App* command, const std::string& flag, std::vector<std::string>& values,
                                  const std::string& help) {
  CLI::Option* option = command->add_option(
      flag,
      [&values, flag](const CLI::results_t& results) {
        values = detail::list_elements(flag, results);
        return true;
      },
      help);
  option->type_size(1)->expected(1, CLI::detail::expected_max_vector_size)->type_name("LIST");
  return option;
}

}  // namespace branchgrpo::cli
