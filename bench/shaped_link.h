// A rate-limited network link on this machine, for measuring what a store across a real
// network delivers: a network namespace joined to this one by a veth pair, each end with a
// private address of the benchmarking range 198.18.0.0/15 (RFC 2544, a /30 chosen by pid) and
// a token bucket (tc tbf) at `rate_gbit` on its egress, so both directions are limited. A server
// started inside the namespace (redis_servers.h ClusterOptions::netns) and bound to
// peer_address() is reached only through the link; traffic inside the namespace (a cluster's
// own bus) stays on its loopback.
//
// Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip` and `tc`; create() says why
// not otherwise (kPermission or kUnavailable, and a message), so a benchmark can skip with a reason.
//
// Cleanup. The destructor deletes the veth pair and the namespace. Should the process die
// before that, the namespace dies with the last process inside it (servers started with
// PR_SET_PDEATHSIG), because a SIGINT/SIGTERM/SIGHUP handler (installed once) unmounts its
// name; a SIGKILLed run leaves the name, and the next create() removes any link whose owning
// pid is gone.
//
// Ownership: the object owns the namespace and the pair. Thread safety: none; at most one
// ShapedLink per process at a time.
#pragma once

#include <kdn/common/status.h>

#include <cstdint>
#include <memory>
#include <string>

namespace kdn::bench {

struct ShapedLinkOptions {
  double rate_gbit = 10;  // each direction
  uint32_t mtu = 1500;
  // The tbf bucket: bytes that may pass at once (0: 1 ms at the rate, at least 256 KiB) and
  // how long a packet may wait in its queue.
  uint64_t burst_bytes = 0;
  uint32_t latency_ms = 10;
};

class ShapedLink {
 public:
  // *why says what failed (the command and its output).
  static Result<std::unique_ptr<ShapedLink>> create(const ShapedLinkOptions& options, std::string* why) noexcept;
  ~ShapedLink();
  ShapedLink(const ShapedLink&) = delete;
  ShapedLink& operator=(const ShapedLink&) = delete;

  const std::string& netns() const noexcept { return netns_; }
  const std::string& local_address() const noexcept { return local_; }  // this namespace's end
  const std::string& peer_address() const noexcept { return peer_; }    // the namespace's end
  // The qdiscs as `tc qdisc show` prints them (for the report).
  std::string describe() const;
  const ShapedLinkOptions& options() const noexcept { return options_; }

 private:
  ShapedLink() = default;
  ShapedLinkOptions options_;
  std::string netns_, host_dev_, peer_dev_, local_, peer_;
  bool created_ = false;
};

}  // namespace kdn::bench
