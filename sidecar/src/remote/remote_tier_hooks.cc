// What the daemon's loop asks of T3 through the Tier hooks (tier.h): its sockets and timers
// serviced, faults logged once per cause, and its own counters for TIER_STATS and the metrics
// page.
#include "remote_tier.h"

#include <kdn/common/clock.h>

#include <spdlog/spdlog.h>

#include <iterator>

namespace kdn::sidecar {

namespace {

// The fault causes, logged once each.
struct RemoteFault {
  const char* cause;
  uint64_t RemoteCounters::*count;
  const char* meaning;
};
constexpr RemoteFault kRemoteFaults[] = {
    {"missing", &RemoteCounters::missing, "a value was gone (evicted, deleted or flushed)"},
    {"foreign", &RemoteCounters::foreign, "a value of another chunk, model or namespace sat under a key"},
    {"bad_length", &RemoteCounters::bad_length, "a value had the wrong length"},
    {"bad_header", &RemoteCounters::bad_header, "a value's header failed its checks"},
    {"crc", &RemoteCounters::crc_mismatch, "a payload failed its CRC32C"},
    {"decode", &RemoteCounters::decode_errors, "a compressed value did not decode"},
    {"wrong_type", &RemoteCounters::wrong_type, "a key held another type (WRONGTYPE)"},
    {"no_space", &RemoteCounters::no_space, "the store refused a write with OOM (maxmemory)"},
    {"timeout", &RemoteCounters::timeouts, "a request got no answer by tier.remote.timeout_ms"},
    {"unavailable", &RemoteCounters::unavailable, "a node was down or unreachable"},
    {"error_reply", &RemoteCounters::error_replies, "the store answered with an error"},
};
static_assert(std::size(kRemoteFaults) <= 32, "a bit of faults_logged_ per cause");

}  // namespace

bool RemoteTier::advance(bool) noexcept {
  const auto now = RedisClock::now();
  if (in_flight() > 0 || next_deadline() <= now) service(now);
  return false;
}

uint64_t RemoteTier::next_deadline_ns() const noexcept {
  const auto next = next_deadline();
  if (next == RedisClock::time_point::max()) return UINT64_MAX;
  const auto now = RedisClock::now();
  if (next <= now) return now_ns();
  return now_ns() + uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(next - now).count());
}

void RemoteTier::log_new_faults(std::string_view ns) noexcept {
  for (size_t i = 0; i < std::size(kRemoteFaults); ++i) {
    const RemoteFault& f = kRemoteFaults[i];
    if ((faults_logged_ >> i) & 1u || counters_.*f.count == 0) continue;
    faults_logged_ |= 1u << i;
    spdlog::warn(
        "namespace '{}': remote tier: {} ({} so far); each is a local miss, never an error; logged once, "
        "counted in kdn_remote_faults_{}_total",
        ns, f.meaning, counters_.*f.count, f.cause);
  }
}

void RemoteTier::describe_stats(ipc::TierStatsRecord& r) const noexcept {
  const RemoteCounters& c = counters_;
  r.reads = c.reads;
  r.read_bytes = c.read_bytes;
  r.writes = c.writes;
  r.write_bytes = c.write_bytes;
  r.fault_io = c.timeouts + c.unavailable + c.error_replies;
  r.fault_no_space = c.no_space;
  r.fault_eof = c.missing;  // the value is gone
  r.fault_crc = c.crc_mismatch + c.bad_header + c.bad_length + c.foreign + c.wrong_type;
  r.fault_decode = c.decode_errors;
  r.raw_bytes_written = c.write_bytes;
  r.stored_bytes_written = c.stored_bytes_written;
}

void RemoteTier::describe_metrics(MetricsSink& sink) const {
  constexpr auto kCounter = MetricsSink::Kind::kCounter;
  const RemoteCounters& c = counters_;
  sink.add("kdn_remote_reads_total", kCounter, "Values read from the remote tier (GET).", c.reads);
  sink.add("kdn_remote_read_bytes_total", kCounter, "Chunk bytes read from the remote tier (decoded).", c.read_bytes);
  sink.add("kdn_remote_stored_bytes_read_total", kCounter,
           "Payload bytes read from the remote tier (as stored: the codec's ratio is read_bytes / this).",
           c.stored_bytes_read);
  sink.add("kdn_remote_writes_total", kCounter, "Values written to the remote tier (SET).", c.writes);
  sink.add("kdn_remote_write_bytes_total", kCounter, "Chunk bytes written to the remote tier.", c.write_bytes);
  sink.add("kdn_remote_stored_bytes_written_total", kCounter,
           "Payload bytes written to the remote tier (as stored: the codec's ratio is write_bytes / this).",
           c.stored_bytes_written);
  sink.add("kdn_remote_encoded_writes_total", kCounter, "Values written encoded with remote_codec.", c.encoded_writes);
  sink.add("kdn_remote_raw_writes_total", kCounter,
           "Values written raw under a remote_codec (encoders busy, model unknown, no gain).", c.raw_writes);
  sink.add("kdn_remote_faults_missing_total", kCounter, "Remote reads that found no value (evicted, deleted, flushed).",
           c.missing);
  sink.add("kdn_remote_faults_foreign_total", kCounter, "Remote values of another chunk, model or namespace, refused.",
           c.foreign);
  sink.add("kdn_remote_faults_bad_length_total", kCounter, "Remote values of the wrong length, refused unread.",
           c.bad_length);
  sink.add("kdn_remote_faults_bad_header_total", kCounter, "Remote values whose header failed its checks.",
           c.bad_header);
  sink.add("kdn_remote_faults_crc_total", kCounter, "Remote payloads that failed their CRC32C.", c.crc_mismatch);
  sink.add("kdn_remote_faults_decode_total", kCounter,
           "Remote KVC1 payloads that did not decode (or, lossless, to other bytes).", c.decode_errors);
  sink.add("kdn_remote_faults_wrong_type_total", kCounter, "Remote keys holding another type (WRONGTYPE).",
           c.wrong_type);
  sink.add("kdn_remote_faults_no_space_total", kCounter, "Remote writes refused with OOM (maxmemory).", c.no_space);
  sink.add("kdn_remote_faults_timeout_total", kCounter,
           "Remote requests unanswered by their deadline (tier.remote.timeout_ms).", c.timeouts);
  sink.add("kdn_remote_faults_unavailable_total", kCounter,
           "Remote requests failed by a node down, a lost connection or redirects.", c.unavailable);
  sink.add("kdn_remote_faults_error_reply_total", kCounter,
           "Remote requests answered with another error (CLUSTERDOWN, TRYAGAIN, ...).", c.error_replies);
}

}  // namespace kdn::sidecar
