// Static tier: topology policies and steppers model their concepts; wrong types do not.
#include "branchgrpo/schedule/steppers.hpp"
#include "branchgrpo/topology.hpp"

namespace {
using namespace branchgrpo;

struct returns_int {
  int operator()(int) const { return 0; }
  friend bool operator==(const returns_int&, const returns_int&) = default;
};
struct takes_a_string {
  tree_plan operator()(const char*) const { return {}; }
  friend bool operator==(const takes_a_string&, const takes_a_string&) = default;
};

static_assert(Topology<split_schedule>);
static_assert(Topology<sequential>);
static_assert(Topology<flow_grpo_fast>);
static_assert(!Topology<int>);
static_assert(!Topology<returns_int>);
static_assert(!Topology<takes_a_string>);

static_assert(Stepper<dance_sde>);
static_assert(Stepper<flow_grpo_sde>);
static_assert(Stepper<euler_ode>);
static_assert(!Stepper<split_schedule>);
static_assert(!Stepper<double>);
}  // namespace
