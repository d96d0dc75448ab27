// Static tier: every normalizer models Normalizer; types with the wrong shape do not.
#include <span>
#include <vector>

#include "branchgrpo/advantage.hpp"
#include "branchgrpo/fusion.hpp"

namespace {

using namespace branchgrpo;

static_assert(Normalizer<depth_wise>);
static_assert(Normalizer<leaf_group>);
static_assert(Normalizer<per_prompt_running>);  // stateful: non-const call operator
static_assert(std::regular<depth_wise> && std::regular<leaf_group> && std::regular<per_prompt_running>);

static_assert(depth_wise{}.scope == normalization_scope::per_tree);
static_assert(depth_wise{}.epsilon == 1e-8 && depth_wise{}.min_std == 1e-6);
static_assert(leaf_group{}.epsilon == 1e-8 && leaf_group{}.min_std == 1e-6);

struct returns_floats {
  std::vector<float> operator()(const rollout_tree&, const reward_view&) const { return {}; }
};
struct takes_leaf_span {
  std::vector<double> operator()(const rollout_tree&, std::span<const double>) const { return {}; }
};
struct not_copyable {
  not_copyable() = default;
  not_copyable(const not_copyable&) = delete;
  not_copyable& operator=(const not_copyable&) = delete;
  std::vector<double> operator()(const rollout_tree&, const reward_view&) const { return {}; }
};

static_assert(!Normalizer<int>);
static_assert(!Normalizer<returns_floats>);
static_assert(!Normalizer<takes_leaf_span>);
static_assert(!Normalizer<not_copyable>);
// A fusion is not a normalizer.
static_assert(!Normalizer<uniform_mean>);
static_assert(!Normalizer<path_softmax>);

}  // namespace
