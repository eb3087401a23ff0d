// The kdnd the node benchmark measures: started by the bench with a private socket and a
// sized host arena, stopped with SIGTERM at the end (SIGKILL if it does not exit in time).
//
// Ownership: a KdndProcess owns the daemon; destroying it stops the daemon.
// Thread safety: none.
#pragma once

#include "process.h"

#include <kdn/common/status.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace kdn::bench {

struct KdndOptions {
  std::string binary;                   // path to kdnd
  std::string socket_path;              // --socket
  uint64_t host_arena_bytes = 0;        // --host-arena-bytes
  std::string log_path;                 // stdout and stderr of the daemon
  std::vector<std::string> extra_args;  // passed through (e.g. --spin-us=200)
};

class KdndProcess {
 public:
  // Starts kdnd and waits until a client can connect and ping it and its arena is
  // pre-faulted (or it exits, or 120 s pass).
  static Result<KdndProcess> start(const KdndOptions& options) noexcept;

  KdndProcess(KdndProcess&&) noexcept = default;
  KdndProcess& operator=(KdndProcess&&) noexcept = default;

  pid_t pid() const noexcept { return process_.pid(); }
  // False once the daemon has exited (reaped here).
  bool running() noexcept { return process_.running(); }
  // SIGTERM, then waits; the daemon's wait status.
  Result<int> stop() noexcept;
  // SIGKILL (a crash), then reaps it.
  Result<int> kill() noexcept;

 private:
  explicit KdndProcess(ChildProcess process) : process_(std::move(process)) {}
  Status wait_until_ready(const std::string& socket_path) noexcept;

  ChildProcess process_;
};

// The kdnd next to the running executable (…/bin/kdn-bench -> …/bin/kdnd).
std::string default_kdnd_path();

}  // namespace kdn::bench
