// Prefaulter: faults in the declared namespaces' arenas on a thread of its own, after kdnd
// listens, so a large arena (seconds per GiB on some machines) neither delays the socket nor
// blocks the first clients. Until an arena is done, copies into it take page faults — slower,
// never wrong. Progress goes to the log about once a second and to each namespace's
// `host_prefault_left_bytes` (STATS), so a benchmark or an operator can wait for it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace kdn::sidecar {

class Prefaulter {
 public:
  struct Target {
    std::string name;           // the namespace, for the log
    std::byte* base = nullptr;  // kdnd's writable mapping of its arena
    uint64_t bytes = 0;
    std::atomic<uint64_t>* left = nullptr;  // bytes not yet faulted in; counts down to 0
  };

  Prefaulter() = default;
  Prefaulter(const Prefaulter&) = delete;
  Prefaulter& operator=(const Prefaulter&) = delete;
  ~Prefaulter() { stop(); }

  // Starts faulting `targets` in, one after the other. The mappings must outlive stop().
  void start(std::vector<Target> targets);
  // Stops between steps and joins (idempotent).
  void stop() noexcept;

 private:
  void run();

  std::vector<Target> targets_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kdn::sidecar
