// DaemonCounters: kdnd's daemon-wide counters and request latency histograms, kept by the
// event loop and rendered by metrics.cc (Prometheus) and STATS (admins).
//
// Not thread-safe: the daemon's event loop owns them; the metrics thread reads a copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>

namespace kdn::sidecar {

// Why a connection did not become a session.
enum class Refusal : uint8_t {
  kUid,        // at accept: its uid and groups open no namespace and may create none
  kPending,    // at accept: max_pending_handshakes (in all, or of its uid) are waiting
  kTimeout,    // no hello within handshake_timeout_ms
  kHello,      // a malformed hello
  kVersion,    // another protocol major
  kAccess,     // the namespace does not exist, or refuses this uid or token
  kLimit,      // a session cap
  kResources,  // kdnd could not set the session up (memory, descriptors)
  kCount
};
const char* refusal_name(Refusal r) noexcept;

// Request latency, from the loop's first look at a request to its completion being queued for
// the client, in fixed buckets (Prometheus' cumulative form is made when rendering).
struct LatencyHistogram {
  static constexpr uint64_t kBoundsNs[] = {1'000,     2'500,      5'000,       10'000,       25'000,
                                           50'000,    100'000,    250'000,     500'000,      1'000'000,
                                           2'500'000, 10'000'000, 100'000'000, 1'000'000'000};
  static constexpr size_t kBuckets = std::size(kBoundsNs) + 1;  // the last: above every bound
  uint64_t buckets[kBuckets] = {};
  uint64_t count = 0, sum_ns = 0;
  void observe(uint64_t ns) noexcept {
    size_t b = 0;
    while (b < std::size(kBoundsNs) && ns > kBoundsNs[b]) ++b;
    ++buckets[b];
    ++count;
    sum_ns += ns;
  }
};

struct DaemonCounters {
  static constexpr size_t kOpcodeSlots = 32;  // latency[op]; opcodes past it count in [0]
  uint64_t sessions_total = 0, sessions_active = 0, protocol_errors = 0, requests = 0;
  uint64_t handshakes_refused = 0, limit_errors = 0, namespaces = 0;
  uint64_t pending_handshakes = 0;
  uint64_t refused[size_t(Refusal::kCount)] = {};  // handshakes_refused by reason
  LatencyHistogram latency[kOpcodeSlots];
  void refuse(Refusal r) noexcept {
    ++handshakes_refused;
    ++refused[size_t(r)];
  }
  void observe(uint8_t opcode, uint64_t ns) noexcept { latency[opcode < kOpcodeSlots ? opcode : 0].observe(ns); }
};

}  // namespace kdn::sidecar
