#pragma once
// A Communicator over threads of one process, for tests of the data-parallel trainer without processes or
// sockets: rank r is thread r; every collective meets at a std::barrier, and sums are taken in rank order (the
// same on every rank, like a deterministic all-reduce).
#include <barrier>
#include <cstddef>
#include <functional>
#include <span>
#include <thread>
#include <vector>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo::testing {

class thread_group {
 public:
  explicit thread_group(int size) : size_(size), meet_(size), slots_(static_cast<std::size_t>(size)) {}

  /// One rank's view of the group (models Communicator).
  struct member {
    thread_group* group;
    int index;

    [[nodiscard]] int rank() const { return index; }
    [[nodiscard]] int size() const { return group->size_; }
    void all_reduce_sum(std::span<double> values) {
      auto& mine = group->slots_[static_cast<std::size_t>(index)];
      mine.assign(reinterpret_cast<const std::byte*>(values.data()),
                  reinterpret_cast<const std::byte*>(values.data() + values.size()));
      group->meet_.arrive_and_wait();
      for (std::size_t i = 0; i < values.size(); ++i) {
        double sum = 0;
        for (const auto& slot : group->slots_) sum += reinterpret_cast<const double*>(slot.data())[i];
        values[i] = sum;
      }
      group->meet_.arrive_and_wait();  // nobody overwrites a slot before every rank has read it
    }
    void all_gather(std::span<const std::byte> local, std::span<std::byte> gathered) {
      require(gathered.size() == local.size() * group->slots_.size(), "all_gather: wrong output size");
      group->slots_[static_cast<std::size_t>(index)].assign(local.begin(), local.end());
      group->meet_.arrive_and_wait();
      std::size_t at = 0;
      for (const auto& slot : group->slots_) {
        require(slot.size() == local.size(), "all_gather: the ranks passed different sizes");
        std::copy(slot.begin(), slot.end(), gathered.begin() + static_cast<std::ptrdiff_t>(at));
        at += slot.size();
      }
      group->meet_.arrive_and_wait();
    }
    void barrier() { group->meet_.arrive_and_wait(); }
  };

  /// Runs body(member) on `size` threads and joins them; the first exception of any rank is rethrown.
  template <class Body>
  void run(Body body) {
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size_));
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r)
      threads.emplace_back([&, r] {
        try {
          member m{this, r};
          body(m);
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
        }
      });
    for (std::thread& t : threads) t.join();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

 private:
  int size_;
  std::barrier<> meet_;
  std::vector<std::vector<std::byte>> slots_;
};

}  // namespace branchgrpo::testing
