// kdnd's GPU tier end to end with real engine processes: a kdnd with [tier.gpu] on, and
// kdn-gpu-engine processes that register a paged KV cache (cudaMalloc + IPC, or VMM with a
// POSIX fd), store a sequence from its blocks in one process and retrieve it into other blocks
// in another, checking every byte. Registration edges and an engine SIGKILLed mid-run too.
// Every case skips on a machine without a CUDA device.
#include "kdnd_process.h"

#include <kdn/kernels/executor.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef KDN_GPU_ENGINE_PATH
#error "KDN_GPU_ENGINE_PATH must name the kdn-gpu-engine binary"
#endif

namespace kdn::testing {
namespace {

using namespace std::chrono_literals;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One kdn-gpu-engine process, its stdout and stderr in files of the test's directory.
class EngineProcess {
 public:
  EngineProcess(const KdndProcess& d, std::vector<std::string> args, const std::string& tag)
      : out_(d.dir() + "/engine-" + tag + ".out"), err_(d.dir() + "/engine-" + tag + ".err") {
    std::vector<std::string> argv = {kdn::testing::binary_beside_self("kdn-gpu-engine", KDN_GPU_ENGINE_PATH),
                                     "--socket",
                                     d.socket(),
                                     "--json",
                                     "--timeout-ms",
                                     "60000"};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = fork();
    if (pid_ == 0) {
      const int out = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      const int err = ::open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (out < 0 || err < 0) _exit(126);
      ::dup2(out, 1);
      ::dup2(err, 2);
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
  }
  ~EngineProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  // Waits up to `timeout`; the exit code, 128 + signal, or -1 (it was killed for running late).
  int wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(20ms);
    }
    return -1;
  }
  void kill9() {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    exited_ = true;
  }
  // True once `text` appears on its stderr (polled up to `timeout`).
  bool wait_for_stderr(const std::string& text, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (read_file(err_).find(text) != std::string::npos) return true;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return read_file(err_).find(text) != std::string::npos;
      }
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
  // The JSON result line (an empty object if there is none).
  nlohmann::json result() const {
    auto j = nlohmann::json::parse(read_file(out_), nullptr, false);
    return j.is_discarded() ? nlohmann::json::object() : j;
  }
  std::string describe() const { return "stdout: " + read_file(out_) + "\nstderr: " + read_file(err_); }

 private:
  std::string out_, err_;
  pid_t pid_ = -1;
  bool exited_ = false;
};

class GpuEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    kdnd_ = std::make_unique<KdndProcess>(
        std::vector<std::string>{"--set", "tier.gpu.enable=on", "--set", "tier.gpu.bytes=512M"}, "-gpu");
    ASSERT_TRUE(kdnd_->alive()) << kdnd_->log();
  }

  // Runs one engine to completion (at most 3 minutes); expects exit 0 and every byte right.
  nlohmann::json run_ok(std::vector<std::string> args, const std::string& tag) {
    EngineProcess e(*kdnd_, std::move(args), tag);
    const int rc = e.wait(180s);
    EXPECT_EQ(rc, 0) << tag << "\n" << e.describe();
    const nlohmann::json r = e.result();
    EXPECT_EQ(r.value("ok", false), true) << tag << "\n" << e.describe();
    EXPECT_EQ(r.value("mismatches", uint64_t(1)), 0u) << tag << "\n" << e.describe();
    return r;
  }

  std::unique_ptr<KdndProcess> kdnd_;
};

struct Kinds {
  const char* store;
  const char* retrieve;
};

class GpuEngineKinds : public GpuEngineTest, public ::testing::WithParamInterface<Kinds> {};

TEST_P(GpuEngineKinds, StoreInOneProcessRetrieveInAnother) {
  const Kinds k = GetParam();
  const std::string seed = std::to_string(100 + (k.store[0] == 'v') * 2 + (k.retrieve[0] == 'v'));
  const std::vector<std::string> common = {"--model", "smollm2-135m", "--tokens", "1024", "--seed", seed};
  auto args = [&](const char* mode, const char* alloc) {
    std::vector<std::string> a = {"--mode", mode, "--alloc", alloc};
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };
  const auto stored = run_ok(args("store", k.store), "store");
  EXPECT_EQ(stored.value("stored", 0u), 4u);
  const auto loaded = run_ok(args("retrieve", k.retrieve), "retrieve");
  EXPECT_EQ(loaded.value("loaded", 0u), 4u);
  EXPECT_EQ(loaded.value("rounds", 0u), 1u);
  // Stored already: a second store writes nothing.
  EXPECT_EQ(run_ok(args("store", k.retrieve), "store-again").value("stored", 9u), 0u);
}

INSTANTIATE_TEST_SUITE_P(Allocations, GpuEngineKinds,
                         ::testing::Values(Kinds{"ipc", "ipc"}, Kinds{"vmm", "vmm"}, Kinds{"ipc", "vmm"}),
                         [](const auto& info) { return std::string(info.param.store) + "_to_" + info.param.retrieve; });

TEST_F(GpuEngineTest, Llama3GeometryInOneProcess) {
  const auto r =
      run_ok({"--mode", "both", "--model", "llama3-8b", "--tokens", "512", "--seed", "200", "--repeat", "3"}, "llama3");
  EXPECT_EQ(r.value("stored", 0u), 2u);
  EXPECT_EQ(r.value("rounds", 0u), 3u);
}

TEST_F(GpuEngineTest, StaleRegistrationIsRefused) {
  for (const char* alloc : {"ipc", "vmm"}) {
    const auto r = run_ok({"--mode", "stale", "--alloc", alloc, "--model", "smollm2-135m", "--tokens", "512", "--seed",
                           alloc[0] == 'i' ? "300" : "301"},
                          std::string("stale-") + alloc);
    EXPECT_NE(r.value("checks", std::string()).find("registered again"), std::string::npos) << r.dump();
  }
}

TEST_F(GpuEngineTest, EngineKilledMidRunThenANewEngineRegisters) {
  {
    EngineProcess doomed(*kdnd_,
                         {"--mode", "both", "--alloc", "ipc", "--model", "smollm2-135m", "--tokens", "2048", "--seed",
                          "400", "--repeat", "1000000"},
                         "doomed");
    ASSERT_TRUE(doomed.wait_for_stderr("stored", 120s)) << doomed.describe();
    std::this_thread::sleep_for(500ms);  // mid-way through its retrieves
    doomed.kill9();
  }
  ASSERT_TRUE(kdnd_->alive()) << kdnd_->log();
  // A new engine on the same device registers at once and works, with either allocation; the
  // chunks the dead engine stored are still served.
  const auto start = std::chrono::steady_clock::now();
  run_ok({"--mode", "both", "--alloc", "vmm", "--model", "smollm2-135m", "--tokens", "1024", "--seed", "401"}, "after");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s) << "restart was held up";
  const auto r =
      run_ok({"--mode", "retrieve", "--alloc", "ipc", "--model", "smollm2-135m", "--tokens", "2048", "--seed", "400"},
             "dead-engines-chunks");
  EXPECT_EQ(r.value("loaded", 0u), 8u);
  ASSERT_TRUE(kdnd_->alive()) << kdnd_->log();
}

}  // namespace
}  // namespace kdn::testing
