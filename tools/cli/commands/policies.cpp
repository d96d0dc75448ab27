#include <CLI/CLI.hpp>

#include <cerrno>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/advantage/catalog.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/policy_list.hpp"
#include "branchgrpo/correlator/catalog.hpp"
#include "branchgrpo/fusion/catalog.hpp"
#include "branchgrpo/loss/objective.hpp"
#include "branchgrpo/pruning/catalog.hpp"
#include "branchgrpo/schedule/stepper_catalog.hpp"
#include "branchgrpo/topology/catalog.hpp"
#include "cli/commands.hpp"
#include "cli/output/output_file.hpp"

namespace branchgrpo::cli {
namespace {

// A family as a run config selects it.
struct family_description {
  std::string_view name;
  std::string_view config_key;  // where a run config names the policy
  std::vector<policy_description> policies;
};

std::vector<family_description> families() {
  return {{topology_policies::family, "[topology] kind", describe_policies<topology_policies>()},
          {stepper_policies::family, "[rollout] stepper", describe_policies<stepper_policies>()},
          {correlator_policies::family, "[correlator] kind", describe_policies<correlator_policies>()},
          {fusion_policies::family, "[fusion] kind", describe_policies<fusion_policies>()},
          {advantage_policies::family, "[advantage] kind", describe_policies<advantage_policies>()},
          {pruner_policies::family, "[[pruning.pruners]] kind", describe_policies<pruner_policies>()},
          {objective_policies::family, "[objective] kind", describe_policies<objective_policies>()}};
}

// One markdown table per family; the first policy listed is the default.
// The whole output in one write, checked at once: the system's reason for a failure (errno) is known only right
// after the failing write, not at the final check (main.cpp) when the output was larger than stdout's buffer.
void print_checked(std::string_view text) {
  std::cout << text << std::flush;
  if (!std::cout) throw write_error("standard output", "cannot write", errno);
}

void print_markdown(std::ostream& out, const family_description& family) {
  out << "#### " << family.name << " (`" << family.config_key << "`)\n\n"
      << "| kind | parameter | default | rule | meaning |\n|---|---|---|---|---|\n";
  for (const policy_description& policy : family.policies) {
    out << "| `" << policy.name << "` | | | | " << policy.summary << " |\n";
    for (const parameter_description& p : policy.parameters)
      out << "| | `" << p.name << "` | `" << p.default_value << "` | " << p.constraint << " | " << p.meaning << " |\n";
  }
  out << '\n';
}

// One markdown table per run config section described by its parameters() (config/run_config.hpp).
void print_sections_markdown(std::ostream& out) {
  for_each_described_section([&]<class Section>(std::type_identity<Section>, std::string_view name) {
    out << "#### [" << name << "]\n\n"
        << "| key | default | rule | resume may change | meaning |\n|---|---|---|---|---|\n";
    for (const parameter_description& p : describe_parameters<Section>())
      out << "| `" << p.name << "` | `" << p.default_value << "` | " << p.constraint << " | "
          << (p.may_change_on_resume ? "yes" : "") << " | " << p.meaning << " |\n";
    out << '\n';
  });
}

void print_sections_text(std::ostream& out) {
  for_each_described_section([&]<class Section>(std::type_identity<Section>, std::string_view name) {
    out << "[" << name << "]\n";
    for (const parameter_description& p : describe_parameters<Section>())
      out << "    " << p.name << " = " << p.default_value << (p.constraint.empty() ? "" : "  (" + p.constraint + ")")
          << (p.may_change_on_resume ? "  [resume may change]" : "") << "  " << p.meaning << '\n';
  });
}

void print_text(std::ostream& out, const family_description& family) {
  out << family.name << " (" << family.config_key << ")\n";
  for (const policy_description& policy : family.policies) {
    out << "  " << policy.name << std::string(policy.name.size() < 20 ? 20 - policy.name.size() : 1, ' ')
        << policy.summary << '\n';
    for (const parameter_description& p : policy.parameters)
      out << "    " << p.name << " = " << p.default_value << (p.constraint.empty() ? "" : "  (" + p.constraint + ")")
          << "  " << p.meaning << '\n';
  }
}

}  // namespace

void add_policies_command(CLI::App& app) {
  struct options {
    std::string family;
    bool markdown = false;
    bool sections = false;
  };
  auto o = std::make_shared<options>();
  CLI::App* command =
      app.add_subcommand("policies", "List each component family's policies with their parameters, defaults and rules");
  command->add_option("--family", o->family,
                      "Only this family (topology, stepper, correlator, fusion, advantage, pruner)");
  command->add_flag("--markdown", o->markdown, "Markdown tables (docs/config.md)");
  command->add_flag("--sections", o->sections,
                    "The run config's sections instead: every key with its default, rule and whether resume may "
                    "change it");
  command->callback([o] {
    if (o->sections) {
      require(o->family.empty(), "--family '", o->family, "' does not go with --sections");
      std::ostringstream out;
      if (o->markdown)
        print_sections_markdown(out);
      else
        print_sections_text(out);
      print_checked(out.str());
      return;
    }
    std::vector<family_description> all = families();
    std::ostringstream out;
    std::vector<std::string_view> names;
    bool found = o->family.empty();
    for (const family_description& family : all) {
      names.push_back(family.name);
      if (!o->family.empty() && family.name != o->family) continue;
      found = true;
      if (o->markdown)
        print_markdown(out, family);
      else
        print_text(out, family);
    }
    require(found, "--family '", o->family, "' is not ", name_list(names));
    print_checked(out.str());
  });
}

}  // namespace branchgrpo::cli
