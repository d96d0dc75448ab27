// Static tier: the policy lists (core/policy_list.hpp) hold listed policies, their run-time choices model their
// families' concepts, and the described-parameter and state concepts accept what they should and nothing else.
#include <string_view>
#include <tuple>

#include "branchgrpo/branchgrpo.hpp"
#include "branchgrpo/toy.hpp"

namespace {

using namespace branchgrpo;

// Every policy in a list says who it is.
static_assert(ListedPolicy<correlated> && ListedPolicy<keep_all> && ListedPolicy<split_schedule>);
struct unnamed {
  friend bool operator==(const unnamed&, const unnamed&) = default;
};
static_assert(!ListedPolicy<unnamed>);

static_assert(PolicyList<fusion_policies> && PolicyList<pruner_policies>);
static_assert(!PolicyList<fusion_policies::variant> && !PolicyList<int>);
static_assert(fusion_policies::family == "fusion" && fusion_policies::names[0] == "uniform_mean");
static_assert(correlator_policies::names.size() == 5 && pruner_policies::names.size() == 6);

// The run-time choices model their families' concepts.
static_assert(Topology<any_topology>);
static_assert(Stepper<any_stepper>);
static_assert(NoiseCorrelator<any_correlator>);
static_assert(Fusion<any_fusion>);
static_assert(Normalizer<any_normalizer>);
static_assert(Pruner<any_pruner_choice> && RolloutShaper<any_pruner_choice>);
static_assert(Pruner<any_pruner> && RolloutShaper<any_pruner>);
static_assert(Pruner<all_in<parent_top_k>> && RolloutShaper<all_in<parent_top_k>>);

// Described parameters: policies with parameters and the option structs; tag types have none.
static_assert(Described<correlated> && Described<depth_window> && Described<optimizer_options> && Described<adam>);
static_assert(!Described<independent> && !Described<keep_all>);
static_assert(std::tuple_size_v<decltype(parameters_of<independent>())> == 0);
static_assert(std::tuple_size_v<decltype(parameters_of<depth_window>())> == 7);

// State: only what keeps some is Stateful; every run-time choice is (it forwards or reports none).
static_assert(Stateful<per_prompt_running> && !Stateful<depth_wise> && !Stateful<leaf_group>);
static_assert(Stateful<any_normalizer> && Stateful<any_fusion>);

// Enumerations with names.
static_assert(NamedEnum<normalization_scope> && !NamedEnum<int>);

}  // namespace
