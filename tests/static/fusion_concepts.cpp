// Static tier: every fusion models Fusion; types with the wrong shape do not.
#include <span>
#include <vector>

#include "branchgrpo/advantage.hpp"
#include "branchgrpo/fusion.hpp"

namespace {

using namespace branchgrpo;

static_assert(Fusion<uniform_mean>);
static_assert(Fusion<path_softmax>);
static_assert(Fusion<split_softmax>);
static_assert(Fusion<max_reward>);

// Designated initializers name the parameters.
static_assert(path_softmax{.beta = 0.5}.beta == 0.5);
static_assert(path_softmax{}.beta == 1.0);
static_assert(split_softmax{}.alpha == 1.0);

struct returns_floats {
  std::vector<float> operator()(const rollout_tree&, std::span<const double>) const { return {}; }
  friend bool operator==(const returns_floats&, const returns_floats&) = default;
};
struct takes_node_index {
  std::vector<double> operator()(const rollout_tree&, std::int32_t) const { return {}; }
  friend bool operator==(const takes_node_index&, const takes_node_index&) = default;
};
struct mutating_call {  // a fusion must be callable on a const object
  std::vector<double> operator()(const rollout_tree&, std::span<const double>) { return {}; }
  friend bool operator==(const mutating_call&, const mutating_call&) = default;
};
struct not_comparable {  // right call, but not regular
  std::vector<double> operator()(const rollout_tree&, std::span<const double>) const { return {}; }
};

static_assert(!Fusion<int>);
static_assert(!Fusion<returns_floats>);
static_assert(!Fusion<takes_node_index>);
static_assert(!Fusion<mutating_call>);
static_assert(!Fusion<not_comparable>);
// A normalizer is not a fusion.
static_assert(!Fusion<depth_wise>);
static_assert(!Fusion<leaf_group>);

}  // namespace
