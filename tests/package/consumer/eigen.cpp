// The Eigen adapter, found through the installed package (built only when branchgrpo::eigen was installed).
#include <branchgrpo/eigen/backend.hpp>

static_assert(branchgrpo::Backend<branchgrpo::eigen_backend>);

int main() { return 0; }
