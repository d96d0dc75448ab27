#pragma once
// scripts/reward_server.py (or another server script of the same command line, such as the VLM judge's
// tests/rewards/fake_openai_server.py) as a child process on a free loopback port, for tests of the remote
// rewards: started with --port 0 --port-file, waited for (30 s at most, or the child's exit), stopped with SIGTERM
// when the object goes (or by stop(), to simulate a server that dies). BRANCHGRPO_SOURCE_DIR must name the source
// tree.
#include <catch2/catch.hpp>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace branchgrpo::testing {

// `script` (a path under the source tree) on a free port, for the lifetime of this object.
class reward_server {
 public:
  explicit reward_server(std::vector<std::string> extra, const std::string& script = "scripts/reward_server.py") {
    static int counter = 0;
    port_file_ = std::filesystem::temp_directory_path() /
                 ("branchgrpo_remote_port_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove(port_file_);
    std::vector<std::string> args = {
        "/usr/bin/python3", BRANCHGRPO_SOURCE_DIR "/" + script, "--port", "0", "--port-file", port_file_.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    REQUIRE(posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) == 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (port_.empty()) {
      std::ifstream(port_file_) >> port_;
      int status = 0;
      if (port_.empty() && ::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        FAIL(script << " exited before listening");
      }
      if (std::chrono::steady_clock::now() > deadline) FAIL(script << " did not start in 30 s");
      if (port_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  reward_server(const reward_server&) = delete;
  reward_server& operator=(const reward_server&) = delete;
  ~reward_server() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    std::filesystem::remove(port_file_);
  }
  [[nodiscard]] std::string url() const { return "http://127.0.0.1:" + port_; }
  /// Kills the server now (SIGKILL: no goodbye), as a crashed server.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = 0;
  }

 private:
  pid_t pid_ = 0;
  std::filesystem::path port_file_;
  std::string port_;
};

}  // namespace branchgrpo::testing
