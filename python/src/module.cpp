// branchgrpo._core: the C++ engine's plans, trees and methods as a Python extension (nanobind). It adapts only:
// every rule, name and number comes from the library's own descriptions (parameters(), policy_list, with_method),
// so that the package and the C++ tool are one engine. No LibTorch: arrays cross as numpy views of the engine's own
// memory (nb::ndarray owned by the Python object that holds it).
//
//   topologies()                     every topology policy: name, summary, parameters with defaults and rules
//   plan(kind, steps, **params)      a TreePlan: branching and edge kinds per step, node / leaf / evaluation counts
//   Tree(plan, trees)                the forest's structure: parent, step, kind, sibling rank, leaves as numpy views
//   methods()                        every name with_method knows; method_plan(name, steps): its tree plan
//   rollout(method, velocity, ...)   the engine's frontier-batched rollout of a method's trees on torch latents,
//                                    calling the Python velocity once per batch (torch_backend.hpp)
//   credit(method, tree, scores)     stages 2 and 3: keep_finite_trees, then the method's fusion, normalizer, pruner
//   trained_edges(result, credit)    where each trained edge's latents are and how its transition is scored
//   check_ppo, ppo_defaults          ppo_options' rules and defaults, for the Python PPO loss
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/core/policy_list.hpp"
#include "branchgrpo/loss/ppo.hpp"
#include "branchgrpo/rollout/engine.hpp"
#include "branchgrpo/rollout/host_backend.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/schedule/steppers.hpp"
#include "branchgrpo/topology/catalog.hpp"
#include "branchgrpo/training/credit.hpp"
#include "branchgrpo/training/methods.hpp"
#include "branchgrpo/training/trainer.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"
#include "branchgrpo/tree/tree_plan.hpp"
#include "torch_backend.hpp"

namespace nb = nanobind;
namespace bg = branchgrpo;

namespace {

// --- Parameters from Python values, by the policy's own description ---------------------------------------------

// What a parameter of type V takes, for messages: "an integer", "a list of integers".
template <class V>
std::string type_text() {
  if constexpr (std::is_same_v<V, bool>)
    return "True or False";
  else if constexpr (std::is_integral_v<V>)
    return "an integer";
  else if constexpr (std::is_floating_point_v<V>)
    return "a number";
  else if constexpr (std::is_same_v<V, std::string> || bg::NamedEnum<V>)
    return "a string";
  else
    return "a list of " +
           type_text<typename V::value_type>().substr(type_text<typename V::value_type>().find(' ') + 1) + "s";
}

// `value` as the parameter's type, or a TypeError naming `where` ("topology.branching = 2: must be a list of
// integers").
template <class V>
V from_python(const nb::handle& value, const std::string& where) {
  try {
    if constexpr (std::is_same_v<V, bool>) {
      if (!nb::isinstance<nb::bool_>(value)) throw nb::cast_error();
      return nb::cast<bool>(value);
    } else if constexpr (std::is_integral_v<V>) {
      if (nb::isinstance<nb::bool_>(value) || !nb::isinstance<nb::int_>(value)) throw nb::cast_error();
      return nb::cast<V>(value);
    } else if constexpr (std::is_floating_point_v<V>) {
      if (nb::isinstance<nb::bool_>(value)) throw nb::cast_error();
      return nb::cast<V>(value);
    } else if constexpr (std::is_same_v<V, std::string>) {
      return nb::cast<std::string>(value);
    } else if constexpr (bg::NamedEnum<V>) {
      const std::string name = nb::cast<std::string>(value);
      for (const auto& choice : enum_choices(V{}))
        if (choice.name == name) return choice.value;
      std::vector<std::string_view> names;
      for (const auto& choice : enum_choices(V{})) names.push_back(choice.name);
      throw nb::value_error((where + " = '" + name + "': must be " + bg::name_list(names)).c_str());
    } else {
      if (!nb::isinstance<nb::list>(value) && !nb::isinstance<nb::tuple>(value)) throw nb::cast_error();
      V out;
      for (const nb::handle item : value)
        out.push_back(from_python<typename V::value_type>(item, where + "[" + std::to_string(out.size()) + "]"));
      return out;
    }
  } catch (const nb::cast_error&) {
    throw nb::type_error(
        (where + " = " + nb::cast<std::string>(nb::repr(value)) + ": must be " + type_text<V>()).c_str());
  }
}

// Sets every entry of `params` on `policy` by its parameters() and checks each against its rule, naming it
// ("topology.branching = [0]: ..."); an unknown key lists the policy's.
template <class P>
void set_parameters(P& policy, const nb::dict& params, std::string_view section) {
  for (const auto& [key, value] : params) {
    const std::string name = nb::cast<std::string>(key);
    bool found = false;
    std::vector<std::string_view> known;
    std::apply(
        [&](const auto&... p) {
          (([&] {
             known.push_back(p.name);
             if (p.name != name) return;
             found = true;
             using V = typename std::decay_t<decltype(p)>::value_type;
             policy.*(p.member) = from_python<V>(value, std::string(section) + "." + name);
           }()),
           ...);
        },
        bg::parameters_of<P>());
    if (!found)
      throw nb::value_error((std::string(section) + "." + name + ": unknown key (" + std::string(P::name) +
                             " has: " + bg::name_list(known, ", ") + ")")
                                .c_str());
  }
  bg::validate_parameters(policy, section);
}

// --- Plans --------------------------------------------------------------------------------------------------------

bg::tree_plan make_plan(const std::string& kind, int steps, const nb::dict& params) {
  auto topology = bg::make_policy<bg::topology_policies>(kind);
  std::visit([&](auto& p) { set_parameters(p, params, "topology"); }, topology);
  return std::visit([&](const auto& p) { return p(steps); }, topology);
}

std::vector<std::string> kind_names(const bg::tree_plan& plan) {
  std::vector<std::string> out;
  for (const bg::edge_kind k : plan.kinds)
    out.emplace_back(k == bg::edge_kind::sde ? "sde" : k == bg::edge_kind::ode ? "ode" : "skip");
  return out;
}

// --- Trees --------------------------------------------------------------------------------------------------------

// A forest of `trees` trees of one plan, its arrays copied once out of rollout_tree and exposed as read-only views.
struct forest {
  forest(const bg::tree_plan& plan, std::int32_t trees) : forest(bg::rollout_tree(plan, tree_infos(trees))) {}
  explicit forest(bg::rollout_tree built) : tree(std::move(built)) {
    const std::int32_t n = tree.node_count();
    parent.resize(static_cast<std::size_t>(n));
    step.resize(static_cast<std::size_t>(n));
    kind.resize(static_cast<std::size_t>(n));
    sibling.resize(static_cast<std::size_t>(n));
    for (std::int32_t i = 0; i < n; ++i) {
      parent[static_cast<std::size_t>(i)] = tree.parent(i);
      step[static_cast<std::size_t>(i)] = tree.step(i);
      kind[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(tree.kind(i));
      sibling[static_cast<std::size_t>(i)] = tree.sibling_rank(i);
    }
    leaves.assign(tree.leaves().begin(), tree.leaves().end());
    for (std::int32_t t = 0; t < tree.tree_count(); ++t) prompts.push_back(tree.info(t).prompt);
  }
  static std::vector<bg::tree_info> tree_infos(std::int32_t trees) {
    bg::require(trees >= 1, "Tree: trees = ", trees, ": must be at least 1");
    return std::vector<bg::tree_info>(static_cast<std::size_t>(trees));
  }

  bg::rollout_tree tree;
  std::vector<std::int32_t> parent, step, sibling, leaves;
  std::vector<std::uint8_t> kind;
  std::vector<std::int64_t> prompts;  ///< each tree's prompt
};

template <class T>
nb::ndarray<nb::numpy, const T, nb::ndim<1>> view(nb::handle owner, const std::vector<T>& values) {
  return nb::ndarray<nb::numpy, const T, nb::ndim<1>>(values.data(), {values.size()}, owner);
}

// --- The rollout -------------------------------------------------------------------------------------------------

// What a rollout returns to Python: the forest (as a Tree), the latents of every step (torch tensors, rows in the
// forest's order at that step), each node's log-prob and scoring std (numpy), the evaluation and call counts.
struct rollout_output {
  std::string method;
  int steps = 0;
  double shift = 0;
  forest trees;
  std::vector<nb::object> latents;
  std::vector<double> log_probs, edge_std;
  std::int64_t evaluations = 0, denoiser_calls = 0;
};

struct rollout_request {
  std::string method;
  int steps = 20;
  double shift = 3.0;
  std::vector<std::int64_t> prompts, latent;
  std::uint64_t seed = 0;
  std::uint32_t iteration = 0;
  std::int64_t max_batch = 64;
};

// The plan of one iteration of `recipe`, as train_iteration's stage 1 makes it: shaped by the pruner at this
// iteration, ODE where the stepper draws no noise.
template <class Recipe>
bg::tree_plan iteration_plan(const Recipe& recipe, const rollout_request& r, const bg::sigma_schedule& schedule) {
  return bg::ode_where_noiseless(bg::shape_plan(recipe.pruner, recipe.topology(r.steps), static_cast<int>(r.iteration)),
                                 recipe.stepper, schedule);
}

// One iteration's rollout as train_iteration's stage 1 does it: the method's plan shaped by its pruner at this
// iteration and made ODE where its stepper draws no noise, one tree per prompt keyed by its position, the shifted
// linear schedule.
rollout_output run_rollout(const rollout_request& r, nb::object velocity, nb::object device, nb::object dtype) {
  bg::require(!r.prompts.empty(), "rollout: prompts is empty: give one prompt index per tree");
  const nb::object ops = nb::module_::import_("branchgrpo._torch_ops");
  bg::python::python_torch_backend backend{.ops = ops, .device = device, .dtype = dtype};
  bg::python::python_velocity denoiser{.ops = ops, .velocity = std::move(velocity), .iteration = r.iteration};
  const bg::latent_shape shape{r.latent};
  const bg::sigma_schedule schedule = bg::shifted_linear_schedule(r.steps, r.shift);
  return bg::with_method(r.method, [&](const auto& recipe) {
    const bg::tree_plan plan = iteration_plan(recipe, r, schedule);
    auto result = bg::rollout(backend, denoiser, recipe.stepper, recipe.correlator, schedule,
                              bg::rollout_tree(plan, bg::detail::iteration_trees(r.prompts)), shape,
                              {.max_batch = r.max_batch, .seed = r.seed, .iteration = r.iteration});
    rollout_output out{.method = r.method,
                       .steps = r.steps,
                       .shift = r.shift,
                       .trees = forest(result.tree),
                       .latents = std::move(result.latents),
                       .log_probs = {result.tree.log_probs().begin(), result.tree.log_probs().end()},
                       .edge_std = std::move(result.edge_std),
                       .evaluations = result.evaluations,
                       .denoiser_calls = result.denoiser_calls};
    return out;
  });
}

// --- Credit -------------------------------------------------------------------------------------------------------

// Stage 3 of train_iteration on a rollout's forest and its leaf rewards: the method's fusion, normalizer and pruner
// (assign_credit), after keep_finite_trees (the trees whose every leaf reward is finite train).
struct credit_output {
  std::vector<std::int32_t> kept_trees, trained;
  std::vector<double> fused, advantages, edge_advantage;
  std::vector<std::uint8_t> mask;
};

credit_output assign(const std::string& method, const forest& trees, std::vector<double> scores, int iteration,
                     int total_iterations) {
  bg::require(total_iterations >= 1 && iteration >= 0 && iteration < total_iterations,
              "credit: iteration = ", iteration, ", total_iterations = ", total_iterations,
              ": needs 0 <= iteration < total_iterations");
  const bg::scored_leaves leaves = bg::keep_finite_trees(trees.tree, std::move(scores));
  bg::require(!leaves.kept_trees.empty(), "credit: every tree has a non-finite leaf reward; none can train");
  return bg::with_method(method, [&](auto recipe) {
    bg::edge_credit credit = bg::assign_credit(recipe, trees.tree, leaves, iteration, total_iterations);
    return credit_output{.kept_trees = leaves.kept_trees,
                         .trained = std::move(credit.trained),
                         .fused = std::move(credit.fused),
                         .advantages = std::move(credit.advantages),
                         .edge_advantage = std::move(credit.edge_advantage),
                         .mask = std::move(credit.mask)};
  });
}

// --- The trained edges ---------------------------------------------------------------------------------------------

// Per trained edge (credit.trained's order, by step): where its latents are and how its transition is scored, so
// that torch can recompute its log-prob with gradients: mean = x_coeff x + velocity_coeff v(x), the row's mean of
// log N(next; mean, std^2) (torch_backend's row_log_prob).
struct edge_table {
  std::vector<std::int32_t> node, step, parent_row, row;
  std::vector<double> sigma, x_coeff, velocity_coeff, std, old_log_prob, advantage;
};

edge_table trained_edges(const rollout_output& result, const credit_output& credit) {
  const bg::rollout_tree& tree = result.trees.tree;
  const bg::sigma_schedule schedule = bg::shifted_linear_schedule(result.steps, result.shift);
  return bg::with_method(result.method, [&](const auto& recipe) {
    edge_table out;
    for (const std::int32_t n : credit.trained) {
      bg::require(n >= 0 && n < tree.node_count() && !tree.is_root(n), "edges: node ", n,
                  " is not an edge of this rollout's forest (a Credit of another rollout?)");
      const std::int32_t parent = tree.parent(n);
      const int s = tree.step(parent);
      const bg::affine_step step = bg::step_coefficients(recipe.stepper, schedule, s, tree.plan().layer(s));
      out.node.push_back(n);
      out.step.push_back(s);
      out.parent_row.push_back(tree.row_at_step(parent));
      out.row.push_back(tree.row_at_step(n));
      out.sigma.push_back(schedule.sigma(s));
      out.x_coeff.push_back(step.x_coeff);
      out.velocity_coeff.push_back(step.velocity_coeff);
      out.std.push_back(result.edge_std[static_cast<std::size_t>(n)]);
      out.old_log_prob.push_back(tree.log_prob(n));
      out.advantage.push_back(credit.edge_advantage[static_cast<std::size_t>(n)]);
    }
    return out;
  });
}

// The ppo_ratio options' rules (ppo_options::parameters()), on the values a Python loss is given.
void check_ppo(double clip_range, double advantage_clip) {
  bg::validate_parameters(bg::ppo_options{.clip_range = clip_range, .advantage_clip = advantage_clip}, "loss");
}

// The same rollout on the core's host_backend (float64) with the velocity v = a x computed in C++: the reference the
// package's tests hold rollout() to (every latent of every step, row-major doubles).
std::vector<std::vector<double>> linear_reference(const rollout_request& r, double a) {
  bg::host_backend backend;
  const auto velocity = [&](const bg::host_tensor& x, const bg::denoise_batch&) {
    return backend.affine(a, x, 0.0, x);
  };
  const bg::latent_shape shape{r.latent};
  const bg::sigma_schedule schedule = bg::shifted_linear_schedule(r.steps, r.shift);
  return bg::with_method(r.method, [&](const auto& recipe) {
    const bg::tree_plan plan = iteration_plan(recipe, r, schedule);
    auto denoiser = velocity;
    const auto result = bg::rollout(backend, denoiser, recipe.stepper, recipe.correlator, schedule,
                                    bg::rollout_tree(plan, bg::detail::iteration_trees(r.prompts)), shape,
                                    {.max_batch = r.max_batch, .seed = r.seed, .iteration = r.iteration});
    std::vector<std::vector<double>> out;
    for (const bg::host_tensor& step : result.latents) out.push_back(step.values);
    return out;
  });
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "The branchgrpo C++ engine (plans, trees, methods); see the branchgrpo package.";
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
      .def_ro("evaluations", &rollout_output::evaluations)
      .def_ro("denoiser_calls", &rollout_output::denoiser_calls);

  // rollout and _linear_reference take one iteration's request with the same arguments.
  const auto request = [](const std::string& method, std::vector<std::int64_t> prompts,
                          std::vector<std::int64_t> latent, int steps, double shift, std::uint64_t seed,
                          std::uint32_t iteration, std::int64_t max_batch) {
    return rollout_request{.method = method,
                           .steps = steps,
                           .shift = shift,
                           .prompts = std::move(prompts),
                           .latent = std::move(latent),
                           .seed = seed,
                           .iteration = iteration,
                           .max_batch = max_batch};
  };
  m.def(
      "rollout",
      [request](const std::string& method, nb::object velocity, std::vector<std::int64_t> prompts,
                std::vector<std::int64_t> latent, int steps, double shift, std::uint64_t seed, std::uint32_t iteration,
                std::int64_t max_batch, nb::object device, nb::object dtype) {
        return run_rollout(
            request(method, std::move(prompts), std::move(latent), steps, shift, seed, iteration, max_batch),
            std::move(velocity), std::move(device), std::move(dtype));
      },
      nb::arg("method"), nb::arg("velocity"), nb::arg("prompts"), nb::arg("latent"), nb::arg("steps"), nb::arg("shift"),
      nb::arg("seed"), nb::arg("iteration"), nb::arg("max_batch"), nb::arg("device"), nb::arg("dtype"));

  m.def(
      "_linear_reference",
      [request](const std::string& method, double a, std::vector<std::int64_t> prompts,
                std::vector<std::int64_t> latent, int steps, double shift, std::uint64_t seed, std::uint32_t iteration,
                std::int64_t max_batch) {
        return linear_reference(
            request(method, std::move(prompts), std::move(latent), steps, shift, seed, iteration, max_batch), a);
      },
      nb::arg("method"), nb::arg("a"), nb::arg("prompts"), nb::arg("latent"), nb::arg("steps"), nb::arg("shift"),
      nb::arg("seed"), nb::arg("iteration"), nb::arg("max_batch"));

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
  m.def("credit", &assign, nb::arg("method"), nb::arg("tree"), nb::arg("scores"), nb::arg("iteration"),
        nb::arg("total_iterations"));

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
      .def_ro("advantage", &edge_table::advantage);
  m.def("trained_edges", &trained_edges, nb::arg("result"), nb::arg("credit"));
  m.def("check_ppo", &check_ppo, nb::arg("clip_range"), nb::arg("advantage_clip"));
  m.def("ppo_defaults", [] {
    const bg::ppo_options defaults;
    return std::pair{defaults.clip_range, defaults.advantage_clip};
  });

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
