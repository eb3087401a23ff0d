// What the kdn-bench end-to-end tests share: run the binary of this build and read its JSON.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace kdn::bench::smoke {

struct BenchRun {
  int exit_code = -1;
  std::string stdout_text;
  std::string stderr_tail;  // the last lines of its progress and errors

  // For a failed assertion: what the bench said, then what it printed.
  std::string said() const { return "stderr:\n" + stderr_tail + "\nstdout:\n" + stdout_text; }
};

// kdn-bench: the one beside the running test (a bundle carried to another machine), else
// KDN_BENCH_BINARY, the build tree's.
inline std::string bench_binary() {
  std::error_code ec;
  const auto beside = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "kdn-bench";
  if (!ec && ::access(beside.c_str(), X_OK) == 0) return beside.string();
  return KDN_BENCH_BINARY;
}

// kdn-bench with `args`; stderr (progress) goes to a temporary file, its tail kept.
inline BenchRun run_bench(const std::string& args) {
  BenchRun run;
  char log[] = "/tmp/kdn-bench-smoke-XXXXXX";
  const int fd = mkstemp(log);
  if (fd < 0) return run;
  close(fd);
  std::string command = std::string(bench_binary()) + " " + args + " 2>" + log;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe != nullptr) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) run.stdout_text.append(buf, n);
    int status = pclose(pipe);
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::ifstream err(log, std::ios::binary);
  std::stringstream ss;
  ss << err.rdbuf();
  const std::string text = ss.str();
  run.stderr_tail = text.size() > 4096 ? text.substr(text.size() - 4096) : text;
  unlink(log);
  return run;
}

// The value at a dotted path ("a.b.c"); a test failure and null when it is missing.
inline const nlohmann::json& at(const nlohmann::json& j, const std::string& dotted) {
  const nlohmann::json* node = &j;
  size_t start = 0;
  while (true) {
    size_t dot = dotted.find('.', start);
    std::string part = dotted.substr(start, dot == std::string::npos ? dot : dot - start);
    if (!node->is_object() || !node->contains(part)) {
      static const nlohmann::json missing;
      ADD_FAILURE() << "missing " << dotted;
      return missing;
    }
    node = &node->at(part);
    if (dot == std::string::npos) return *node;
    start = dot + 1;
  }
}

}  // namespace kdn::bench::smoke
