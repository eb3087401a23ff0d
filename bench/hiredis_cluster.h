// The Redis Cluster baseline of `kdn-bench remote`: what hiredis (Debian's 0.14.1, which has no
// cluster client of its own) delivers from the same cluster kdn's T3 reads, driven the way a
// careful engine would drive it and the way RemoteTier drives its own client:
//
//   - `pool_size` connections to every master, found with CLUSTER SLOTS; each request goes to
//     a connection of the master that owns its key's slot (kdn's key_slot()), the one with the
//     fewest requests waiting;
//   - one thread, non-blocking sockets and poll(): at most `depth` requests in flight over all
//     connections, a new one sent as soon as one completes;
//   - hiredis formats every command and parses every reply (its reader copies a bulk into a
//     reply object); the socket is read in 1 MiB pieces (hiredis' own reads are 16 KiB), so the
//     baseline is not held back by system calls;
//   - a GET's value lands in the caller's destination with one memcpy, as an engine's buffer
//     would receive it.
// No redirects are followed: the cluster is not resharded while it is measured (a MOVED or
// ASK is an error).
//
// Ownership: the object owns its connections. Thread safety: none; one thread.
#pragma once

#include <kdn/common/status.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kdn::bench {

// Where a GET's value goes: the bytes [skip, skip + bytes) of a value of exactly
// `value_bytes` are copied to `dest`.
struct GetTarget {
  std::byte* dest = nullptr;
  uint64_t skip = 0;
  uint64_t bytes = 0;
  uint64_t value_bytes = 0;
};

class HiredisCluster {
 public:
  // Connects `pool_size` connections to every master of the cluster `host`:`seed_port` belongs
  // to. kUnavailable when hiredis was not found at build time or a node does not answer;
  // *why says more.
  static Result<std::unique_ptr<HiredisCluster>> connect(const std::string& host, int seed_port, uint32_t pool_size,
                                                         std::chrono::milliseconds timeout, std::string* why) noexcept;
  ~HiredisCluster();

  // GETs keys[i] into targets[i], at most `depth` in flight. kCorrupt when a value is missing
  // or of another length; kIo for a failed connection or an error reply.
  Status get_all(std::span<const std::string> keys, std::span<const GetTarget> targets, uint32_t depth) noexcept;
  // One EXISTS per key, all pipelined at once; the number of keys that exist.
  Result<uint64_t> exists_all(std::span<const std::string> keys) noexcept;
  // The whole value under `key` ("" with kCorrupt when there is none).
  Result<std::string> get_value(const std::string& key) noexcept;
  // The length of the value under `key` (STRLEN).
  Result<uint64_t> value_length(const std::string& key) noexcept;

  size_t connections() const noexcept;
  size_t masters() const noexcept;
  // What the last failure was about (the key, hiredis' message). After a failure every later
  // call fails too: what the connections still hold is unknown.
  const std::string& last_error() const noexcept;

  struct State;

 private:
  explicit HiredisCluster(std::unique_ptr<State> state) noexcept;
  std::unique_ptr<State> state_;
};

}  // namespace kdn::bench
