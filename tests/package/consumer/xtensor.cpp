// The xtensor adapter, found through the installed package (built only when branchgrpo::xtensor was installed).
#include <branchgrpo/xtensor/backend.hpp>

static_assert(branchgrpo::Backend<branchgrpo::xtensor_backend>);

int main() { return 0; }
