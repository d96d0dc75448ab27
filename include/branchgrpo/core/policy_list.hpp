#pragma once
// One list per component family, from which everything run-time follows: the variant that chooses a policy at
// run time (any_policy), the TOML reader (branchgrpo::config), the command-line tool's descriptions and the docs
// table (`branchgrpo policies`).
//
//   using fusion_policies = policy_list<"fusion", uniform_mean, path_softmax, split_softmax, max_reward>;
//   using any_fusion = any_policy<fusion_policies>;   // models Fusion; default: the first policy, value-initialized
//
// Each policy says who it is: `static constexpr std::string_view name` (its key in configs and on the command
// line), `summary` (when to use it) and, when it has parameters, `static constexpr auto parameters()`
// (core/parameters.hpp). Adding a policy = its header + its type in its family's list; a list of one's own
// extends a family: `extended_policy_list<fusion_policies, my_fusion>`.
#include <array>
#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/core/state.hpp"

namespace branchgrpo {

/// A string literal as a template argument: policy_list<"fusion", ...>.
template <std::size_t N>
struct fixed_string {
  std::array<char, N> text{};
  constexpr fixed_string(const char (&literal)[N]) {  // NOLINT: implicit, so that a literal is the argument
    for (std::size_t i = 0; i < N; ++i) text[i] = literal[i];
  }
  [[nodiscard]] constexpr std::string_view view() const { return {text.data(), N - 1}; }
};

/// A policy that can stand in a list: regular, with a name and a summary.
template <class P>
concept ListedPolicy = std::regular<P> && requires {
  { P::name } -> std::convertible_to<std::string_view>;
  { P::summary } -> std::convertible_to<std::string_view>;
};

/// A family's policies, the default first.
template <fixed_string Family, ListedPolicy... Policies>
requires(sizeof...(Policies) >= 1) struct policy_list {
  static constexpr std::string_view family = Family.view();
  static constexpr std::array<std::string_view, sizeof...(Policies)> names = {Policies::name...};
  using variant = std::variant<Policies...>;
};

namespace detail {
template <class List>
struct is_policy_list : std::false_type {};
template <fixed_string Family, class... Policies>
struct is_policy_list<policy_list<Family, Policies...>> : std::true_type {};

template <class List, class... More>
struct extended;
template <fixed_string Family, class... Policies, class... More>
struct extended<policy_list<Family, Policies...>, More...> {
  using type = policy_list<Family, Policies..., More...>;
};
}  // namespace detail

template <class L>
concept PolicyList = detail::is_policy_list<L>::value;

/// List's family with More appended.
template <PolicyList List, ListedPolicy... More>
using extended_policy_list = typename detail::extended<List, More...>::type;

/// A policy's described parameters (an empty tuple for a tag type).
template <class Policy>
constexpr auto parameters_of() {
  if constexpr (Described<Policy>)
    return Policy::parameters();
  else
    return std::tuple<>{};
}

/// Calls `body(std::type_identity<P>{})` for each policy P of the list, in order.
template <PolicyList List, class Body>
void for_each_policy(Body&& body) {
  [&]<class... Policies>(std::variant<Policies...>*) {
    (body(std::type_identity<Policies>{}), ...);
  }(static_cast<typename List::variant*>(nullptr));
}

/// The list's names as "a, b or c".
template <PolicyList List>
std::string policy_names_text() {
  return name_list(List::names);
}

/// The policy called `name`, value-initialized (its documented defaults), as the list's variant.
/// Example: make_policy<correlator_policies>("scaled") holds scaled{.scale = 4}.
/// @pre name is in the list (else invalid_input "unknown <family> '<name>' (expected a, b or c)").
template <PolicyList List>
typename List::variant make_policy(std::string_view name) {
  typename List::variant out;
  bool found = false;
  for_each_policy<List>([&]<class P>(std::type_identity<P>) {
    if (!found && P::name == name) {
      out = P{};
      found = true;
    }
  });
  if (!found) fail("unknown ", List::family, " '", name, "' (expected ", policy_names_text<List>(), ")");
  return out;
}

/// One parameter of a policy as tables and help texts show it.
struct parameter_description {
  std::string_view name;
  std::string default_value;  ///< as a config writes it (value_text)
  std::string constraint;     ///< the rule's text ("> 0", "[0, 1)", an enumeration's names), "" for none
  std::string_view meaning;
  bool may_change_on_resume = false;  ///< parameter_of::resumable
};

/// The described parameters of T with their values in `defaults` (T{} by default): a policy's or a run config
/// section's (config/run_config.hpp). Example: describe_parameters(parent_top_k{}) is {{"k", "1", ">= 1", "..."}}.
template <class T>
std::vector<parameter_description> describe_parameters(const T& defaults = T{}) {
  std::vector<parameter_description> out;
  std::apply(
      [&](const auto&... p) {
        (out.push_back({.name = p.name,
                        .default_value = value_text(defaults.*(p.member)),
                        .constraint = p.constraint(),
                        .meaning = p.meaning,
                        .may_change_on_resume = p.may_change_on_resume}),
         ...);
      },
      parameters_of<T>());
  return out;
}

/// One policy of a list as tables and help texts show it.
struct policy_description {
  std::string_view name;
  std::string_view summary;
  std::vector<parameter_description> parameters;
};

/// Every policy of the list with its parameters and their defaults.
/// Example: describe_policies<pruner_policies>()[1] is {"parent_top_k", "...", {{"k", "1", ">= 1", "..."}}}.
template <PolicyList List>
std::vector<policy_description> describe_policies() {
  std::vector<policy_description> out;
  for_each_policy<List>([&]<class P>(std::type_identity<P>) {
    out.push_back({.name = P::name, .summary = P::summary, .parameters = describe_parameters<P>()});
  });
  return out;
}

/// One of a list's policies, chosen at run time. It models the family's concept by visiting: every call forwards
/// to the held policy (one std::visit per call). It is Stateful: it saves the held policy's state when that policy
/// has any. Default: the list's first policy, value-initialized.
/// Example: any_policy<topology_policies>{sequential{.group_size = 4}}(20) == sequential{.group_size = 4}(20);
///   any_policy<topology_policies>{}.name() == "split_schedule".
template <PolicyList List, class Variant = typename List::variant>
struct any_policy;

template <PolicyList List, class... Policies>
struct any_policy<List, std::variant<Policies...>> {
  using list = List;
  std::variant<Policies...> policy = {};

  any_policy() = default;
  template <class Policy>
  requires(std::is_same_v<std::remove_cvref_t<Policy>, Policies> || ...) any_policy(Policy&& held)
      : policy(std::forward<Policy>(held)) {}  // NOLINT: implicit, as the variant's own

  template <class... Args>
  requires(std::invocable<const Policies&, Args&...>&&...) decltype(auto) operator()(Args&&... args) const {
    return std::visit([&](const auto& p) -> decltype(auto) { return p(args...); }, policy);
  }
  template <class... Args>
  requires(!(std::invocable<const Policies&, Args&...> && ...) &&
           (std::invocable<Policies&, Args&...> && ...)) decltype(auto)
  operator()(Args&&... args) {
    return std::visit([&](auto& p) -> decltype(auto) { return p(args...); }, policy);
  }

  /// The held policy's name.
  [[nodiscard]] std::string_view name() const { return List::names[policy.index()]; }

  /// The held policy's state, or none for a stateless one.
  [[nodiscard]] component_state save_state() const {
    return std::visit(
        [](const auto& p) {
          if constexpr (Stateful<std::remove_cvref_t<decltype(p)>>)
            return p.save_state();
          else
            return component_state{};
        },
        policy);
  }
  /// Restores what save_state returned. @pre a stateless policy gets an empty state (else invalid_input).
  void load_state(const component_state& state) {
    std::visit(
        [&](auto& p) {
          if constexpr (Stateful<std::remove_cvref_t<decltype(p)>>)
            p.load_state(state);
          else
            require(state.empty(), List::family, " '", name(), "' keeps no state, got '", state.begin()->first, "'");
        },
        policy);
  }

  friend bool operator==(const any_policy&, const any_policy&) = default;
};

}  // namespace branchgrpo
