// branchgrpo._core: the C++ engine's plans, trees and methods as a Python extension (nanobind). It adapts only:
// every rule, name and number comes from the library's own descriptions (parameters(), policy_list, with_method),
// so that the package and the C++ tool are one engine. No LibTorch: arrays cross as numpy views of the engine's own
// memory (nb::ndarray owned by the Python object that holds it).
//
//   topologies()                     every topology policy: name, summary, parameters with defaults and rules
//   plan(kind, steps, **params)      a TreePlan: branching and edge kinds per step, node / leaf / evaluation counts
//   Tree(plan, trees)                the forest's structure: parent, step, kind, sibling rank, leaves as numpy views
//   methods()                        every name with_method knows; method_plan(name, steps): its tree plan
//   Method(name, **sections)         a method with the run config's sections overriding its components, and its
//                                    normalizer's state (method.hpp)
//   rollout(method, velocity, ...)   the engine's frontier-batched rollout of a method's trees on torch latents,
//                                    calling the Python velocity once per batch (torch_backend.hpp), on the given
//                                    sigmas or the shifted linear schedule
//   credit(method, tree, scores)     stages 2 and 3: keep_finite_trees, then the method's fusion, normalizer, pruner
//   trained_edges(result, credit)    where each trained edge's latents are and how its transition is scored
//   check_ppo, ppo_defaults          ppo_options' rules and defaults, for the Python PPO loss
//   train_step(method, policy, ...)  one train_iteration of the C++ trainer with a Python policy, reward and
//                                    torch.distributed group (trainer.hpp)
//
// One header per idea beside this file: parameters.hpp (keyword arguments through parameters()), forest.hpp (plans
// and trees), torch_backend.hpp (the Backend over Python torch tensors and the checked velocity), rollout.hpp,
// credit.hpp (credit, trained edges, PPO options). This file only binds them.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/policy_list.hpp"
#include "branchgrpo/loss/ppo.hpp"
#include "branchgrpo/topology/catalog.hpp"
#include "branchgrpo/training/methods.hpp"
#include "credit.hpp"
#include "forest.hpp"
#include "method.hpp"
#include "numpy_arrays.hpp"
#include "rollout.hpp"
#include "trainer.hpp"

namespace nb = nanobind;
namespace bg = branchgrpo;
using namespace branchgrpo::python;

NB_MODULE(_core, m) {
  m.doc() = "The branchgrpo C++ engine (plans, trees, methods); see the branchgrpo package.";
  m.attr("cuda_kernels") = cuda_kernels;  // built with the fused CUDA SDE kernel (cuda_step.hpp)
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const bg::invalid_input& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  nb::class_<bg::tree_plan>(m, "TreePlan")
      .def_ro("steps", &bg::tree_plan::steps)
      .def_ro("roots", &bg::tree_plan::roots)
      .def_ro("branching", &bg::tree_plan::branching)
      .def_prop_ro("kinds", &kind_names)
      .def_prop_ro("node_count", &bg::tree_plan::node_count)
      .def_prop_ro("leaf_count", &bg::tree_plan::leaf_count)
      .def_prop_ro("evaluations", &bg::tree_plan::evaluations)
      .def_prop_ro("edge_count", &bg::tree_plan::edge_count)
      .def_prop_ro("branching_steps", &bg::tree_plan::branching_steps)
      .def("node_count_at_step", &bg::tree_plan::node_count_at_step, nb::arg("step"));

  m.def(
      "plan",
      [](const std::string& kind, int steps, const nb::kwargs& params) { return make_plan(kind, steps, params); },
      nb::arg("kind"), nb::arg("steps"), nb::arg("params"));

  m.def("topologies", [] {
    nb::list out;
    for (const bg::policy_description& d : bg::describe_policies<bg::topology_policies>()) {
      nb::list parameters;
      for (const auto& p : d.parameters) {
        nb::dict parameter;
        parameter["name"] = p.name;
        parameter["default"] = p.default_value;
        parameter["rule"] = p.constraint;
        parameter["meaning"] = p.meaning;
        parameters.append(parameter);
      }
      nb::dict policy;
      policy["name"] = d.name;
      policy["summary"] = d.summary;
      policy["parameters"] = parameters;
      out.append(policy);
    }
    return out;
  });

  m.def("methods", [] {
    std::vector<std::string_view> out(bg::method_names.begin(), bg::method_names.end());
    out.insert(out.end(), bg::flash_method_names.begin(), bg::flash_method_names.end());
    out.insert(out.end(), bg::decoupled_method_names.begin(), bg::decoupled_method_names.end());
    out.insert(out.end(), bg::adaptive_method_names.begin(), bg::adaptive_method_names.end());
    return out;
  });
  m.def(
      "method_plan",
      [](const std::string& name, int steps) {
        return bg::with_method(name, [&](const auto& recipe) { return bg::tree_plan(recipe.topology(steps)); });
      },
      nb::arg("name"), nb::arg("steps"));

  nb::class_<rollout_output>(m, "Rollout")
      .def_prop_ro("tree",
                   [](nb::handle self) {
                     return nb::cast(&nb::cast<rollout_output&>(self).trees, nb::rv_policy::reference_internal, self);
                   })
      .def_ro("method", &rollout_output::method)
      .def_ro("latents", &rollout_output::latents)
      .def_prop_ro("log_probs",
                   [](nb::handle self) { return view(self, nb::cast<const rollout_output&>(self).log_probs); })
      .def_prop_ro("edge_std",
                   [](nb::handle self) { return view(self, nb::cast<const rollout_output&>(self).edge_std); })
      .def_prop_ro("sigmas",
                   [](nb::handle self) { return numpy_copy(nb::cast<const rollout_output&>(self).schedule.values()); })
      .def_ro("evaluations", &rollout_output::evaluations)
      .def_ro("denoiser_calls", &rollout_output::denoiser_calls);

  nb::class_<method_spec>(m, "Method")
      .def(
          "__init__",
          [](method_spec* self, const std::string& name, const nb::kwargs& sections) {
            new (self) method_spec(make_method(name, sections));
          },
          nb::arg("name"), nb::arg("sections"))
      .def_ro("name", &method_spec::name)
      .def_prop_ro("sections", [](const method_spec& m) { return nb::dict(m.sections); })
      .def_prop_ro("components", &component_names)
      .def(
          "plan", [](const method_spec& m, int steps) { return bg::tree_plan(m.recipe.topology(steps)); },
          nb::arg("steps"))
      .def("state", &method_state)
      .def("load_state", &load_method_state, nb::arg("state"));

  // rollout and _linear_reference take one iteration's request with the same arguments.
  const auto request = [](const method_spec& method, std::vector<std::int64_t> prompts,
                          std::vector<std::int64_t> latent, int steps, double shift, std::vector<double> sigmas,
                          std::uint64_t seed, std::uint32_t iteration, std::int64_t max_batch) {
    return rollout_request{.method = &method,
                           .steps = steps,
                           .shift = shift,
                           .sigmas = std::move(sigmas),
                           .prompts = std::move(prompts),
                           .latent = std::move(latent),
                           .seed = seed,
                           .iteration = iteration,
                           .max_batch = max_batch};
  };
  m.def(
      "rollout",
      [request](nb::object method, nb::object velocity, std::vector<std::int64_t> prompts,
                std::vector<std::int64_t> latent, int steps, double shift, std::vector<double> sigmas,
                std::uint64_t seed, std::uint32_t iteration, std::int64_t max_batch, nb::object device,
                nb::object dtype) {
        const rollout_request r = request(nb::cast<const method_spec&>(method), std::move(prompts), std::move(latent),
                                          steps, shift, std::move(sigmas), seed, iteration, max_batch);
        return run_rollout(r, std::move(method), std::move(velocity), std::move(device), std::move(dtype));
      },
      nb::arg("method"), nb::arg("velocity"), nb::arg("prompts"), nb::arg("latent"), nb::arg("steps"), nb::arg("shift"),
      nb::arg("sigmas"), nb::arg("seed"), nb::arg("iteration"), nb::arg("max_batch"), nb::arg("device"),
      nb::arg("dtype"));

  m.def(
      "_linear_reference",
      [request](const method_spec& method, double a, std::vector<std::int64_t> prompts,
                std::vector<std::int64_t> latent, int steps, double shift, std::uint64_t seed, std::uint32_t iteration,
                std::int64_t max_batch, std::vector<double> sigmas) {
        return linear_reference(request(method, std::move(prompts), std::move(latent), steps, shift, std::move(sigmas),
                                        seed, iteration, max_batch),
                                a);
      },
      nb::arg("method"), nb::arg("a"), nb::arg("prompts"), nb::arg("latent"), nb::arg("steps"), nb::arg("shift"),
      nb::arg("seed"), nb::arg("iteration"), nb::arg("max_batch"), nb::arg("sigmas") = std::vector<double>{});

  nb::class_<credit_output>(m, "Credit")
      .def_prop_ro("kept_trees",
                   [](nb::handle self) { return view(self, nb::cast<const credit_output&>(self).kept_trees); })
      .def_prop_ro("trained", [](nb::handle self) { return view(self, nb::cast<const credit_output&>(self).trained); })
      .def_prop_ro("fused", [](nb::handle self) { return view(self, nb::cast<const credit_output&>(self).fused); })
      .def_prop_ro("advantages",
                   [](nb::handle self) { return view(self, nb::cast<const credit_output&>(self).advantages); })
      .def_prop_ro("edge_advantage",
                   [](nb::handle self) { return view(self, nb::cast<const credit_output&>(self).edge_advantage); })
      .def_prop_ro("mask", [](nb::handle self) { return view(self, nb::cast<const credit_output&>(self).mask); });
  m.def("credit", &assign, nb::arg("method"), nb::arg("tree"), nb::arg("scores"), nb::arg("components"),
        nb::arg("iteration"), nb::arg("total_iterations"));
  m.def(
      "win_rates",
      [](const std::vector<double>& scores, const std::vector<std::int64_t>& groups, double tie) {
        return group_win_rates(scores, groups, tie);
      },
      nb::arg("scores"), nb::arg("groups"), nb::arg("tie"));

  nb::class_<edge_table>(m, "_EdgeTable")
      .def_ro("node", &edge_table::node)
      .def_ro("step", &edge_table::step)
      .def_ro("parent_row", &edge_table::parent_row)
      .def_ro("row", &edge_table::row)
      .def_ro("sigma", &edge_table::sigma)
      .def_ro("x_coeff", &edge_table::x_coeff)
      .def_ro("velocity_coeff", &edge_table::velocity_coeff)
      .def_ro("std", &edge_table::std)
      .def_ro("old_log_prob", &edge_table::old_log_prob)
      .def_ro("advantage", &edge_table::advantage)
      .def_ro("weight", &edge_table::weight);
  m.def(
      "trained_edges",
      [](const rollout_output& result, const credit_output& credit, const std::string& step_weight) {
        return trained_edges(result, credit,
                             bg::parse_step_weighting(step_weight));  // the config's names and message
      },
      nb::arg("result"), nb::arg("credit"), nb::arg("step_weight"));
  m.def(
      "ppo_terms",
      [](const std::vector<double>& log_prob, const std::vector<double>& old_log_prob,
         const std::vector<double>& advantage, double clip_range, double advantage_clip) {
        ppo_terms_output out = ppo_terms(log_prob, old_log_prob, advantage, clip_range, advantage_clip);
        return std::pair{std::move(out.loss), std::move(out.gradient)};
      },
      nb::arg("log_prob"), nb::arg("old_log_prob"), nb::arg("advantage"), nb::arg("clip_range"),
      nb::arg("advantage_clip"));
  m.def("check_ppo", &check_ppo, nb::arg("clip_range"), nb::arg("advantage_clip"));
  m.def("ppo_defaults", [] {
    const bg::ppo_options defaults;
    return std::pair{defaults.clip_range, defaults.advantage_clip};
  });

  nb::class_<bg::training_options>(m, "TrainingOptions")
      .def_ro("max_batch", &bg::training_options::max_batch)
      .def_ro("seed", &bg::training_options::seed)
      .def_ro("updates_per_iteration", &bg::training_options::updates_per_iteration)
      .def_ro("total_iterations", &bg::training_options::total_iterations);
  m.def("training_options", &training_options_from, nb::arg("max_batch"), nb::arg("seed"), nb::arg("updates"),
        nb::arg("total_iterations"), nb::arg("loss"));
  m.def(
      "train_step",
      [](method_spec& method, nb::object policy, nb::object reward, bool groupwise, bool win_rate,
         std::vector<std::int64_t> prompts, std::vector<std::int64_t> latent, int steps, double shift,
         std::vector<double> sigmas, int iteration, const bg::training_options& options, nb::object device,
         nb::object dtype, nb::object group) {
        const train_request r{.prompts = std::move(prompts),
                              .latent = std::move(latent),
                              .steps = steps,
                              .shift = shift,
                              .sigmas = std::move(sigmas),
                              .iteration = iteration,
                              .options = options};
        return train_step(method, std::move(policy), std::move(reward), groupwise, win_rate, r, std::move(device),
                          std::move(dtype), std::move(group));
      },
      nb::arg("method"), nb::arg("policy"), nb::arg("reward"), nb::arg("groupwise"), nb::arg("win_rate"),
      nb::arg("prompts"), nb::arg("latent"), nb::arg("steps"), nb::arg("shift"), nb::arg("sigmas"),
      nb::arg("iteration"), nb::arg("options"), nb::arg("device"), nb::arg("dtype"), nb::arg("group").none());

  nb::class_<forest>(m, "Tree")
      .def(nb::init<const bg::tree_plan&, std::int32_t>(), nb::arg("plan"), nb::arg("trees") = 1)
      .def_prop_ro("node_count", [](const forest& f) { return f.tree.node_count(); })
      .def_prop_ro("tree_count", [](const forest& f) { return f.tree.tree_count(); })
      .def_prop_ro("nodes_per_tree", [](const forest& f) { return f.tree.nodes_per_tree(); })
      .def_prop_ro("evaluations", [](const forest& f) { return f.tree.evaluations(); })
      .def_prop_ro("edge_count", [](const forest& f) { return f.tree.edge_count(); })
      .def_prop_ro("parent", [](nb::handle self) { return view(self, nb::cast<const forest&>(self).parent); })
      .def_prop_ro("step", [](nb::handle self) { return view(self, nb::cast<const forest&>(self).step); })
      .def_prop_ro("kind", [](nb::handle self) { return view(self, nb::cast<const forest&>(self).kind); })
      .def_prop_ro("sibling_rank", [](nb::handle self) { return view(self, nb::cast<const forest&>(self).sibling); })
      .def_prop_ro("leaves", [](nb::handle self) { return view(self, nb::cast<const forest&>(self).leaves); })
      .def_prop_ro("prompts", [](nb::handle self) { return view(self, nb::cast<const forest&>(self).prompts); });
}
