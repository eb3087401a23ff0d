// Daemon: kdnd's event loop — accepts clients, runs handshakes, polls every session's
// submission ring, and sleeps when there is nothing to do.
//
// One thread runs everything on the control path, so the chunk index needs no locks and a
// request costs ~1 µs: while requests arrive the loop busy-polls the rings; after `spin_us`
// of quiet it announces sleep in every session header (need_wakeup), re-checks the rings,
// and blocks in epoll on the listening socket, the session sockets (hang-up = client death),
// the session doorbells and a signalfd. An idle daemon therefore uses no CPU.
//
// Thread safety: run() on one thread; request_stop() from any thread or a signal handler.
#pragma once

#include <kdn/common/status.h>
#include <kdn/sidecar/config.h>

#include <atomic>
#include <memory>
#include <string>

namespace kdn::sidecar {

class DaemonImpl;

// Faults injected through the daemon's seams by a test build of kdnd (kdnd-test, built with the
// tests); the shipped kdnd injects none and reads no variable that would.
struct DaemonFaults {
  uint64_t fail_gpu_retrieve = 0;  // the N-th GPU retrieve's batch lands failed (0: none)
  // While this file exists, a request that takes leases first logs "test seam: stalling a
  // lease" and holds the event loop for stall_lease_ms: a test kills kdnd with a load in flight.
  std::string stall_lease_file;
  uint32_t stall_lease_ms = 0;
};

class Daemon {
 public:
  explicit Daemon(Config config, DaemonFaults faults = {});
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Binds the socket and creates the default namespace's arena. Fails if another kdnd
  // answers on the socket.
  Status start();
  // Serves until SIGTERM/SIGINT (when install_signals was true) or request_stop().
  Status run();
  // Asks run() to return after closing every session.
  void request_stop();

 private:
  std::unique_ptr<DaemonImpl> impl_;
};

}  // namespace kdn::sidecar
