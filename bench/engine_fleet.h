// Engine processes of the node benchmark and the bench's private control channel to them.
//
// Each engine is a forked process that links libkdn like a real engine would: it connects to
// kdnd, registers the model, owns a pre-faulted engine KV buffer the size of one document,
// and runs tasks the bench sends it. Per task the bench sends a command, each engine prepares
// and answers "ready", the bench sends "go" to all of them at once, and each engine answers
// with its report. Engines time themselves with CLOCK_MONOTONIC, which is system-wide, so
// the bench can compute the wall time of a phase across processes.
//
// The control channel is a SOCK_SEQPACKET socket pair per engine carrying the fixed-size
// POD messages below (the bench talks only to its own children; no other peer can write).
//
// Thread safety: none; an EngineFleet is driven by one thread.
#pragma once

#include "node_workload.h"
#include "process.h"

#include <kdn/common/status.h>
#include <kdn/kdn.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kdn::bench {

enum class EngineTask : uint32_t {
  kStore = 1,       // store documents [first_doc, first_doc + n_docs), all chunks
  kRetrieve = 2,    // lease + copy documents [first_doc, first_doc + n_docs), `passes` times
  kLookupLoop = 3,  // `samples` timed kdn_lookup of document first_doc, then kdn_ping
  kZipf = 4,        // `requests` RAG requests over corpus documents [0, corpus_docs)
  kStats = 5,       // kdn_get_stats
  kQuit = 6,        // disconnect and exit
  kMemcpy = 7,      // the retrieve phase's copies from a private buffer, no kdn: a baseline
};

// The one-word messages of the ready/go handshake.
inline constexpr uint32_t kEngineReady = 0x21594452;  // "RDY!"
inline constexpr uint32_t kEngineGo = 0x21214f47;     // "GO!!"

struct EngineCommand {
  EngineTask task = EngineTask::kStats;
  uint32_t first_doc = 0;
  uint32_t n_docs = 0;
  uint32_t passes = 1;
  uint32_t samples = 0;
  uint32_t requests = 0;
  uint32_t corpus_docs = 0;
  double zipf_s = 1.1;
  uint64_t stream_seed = 0;  // this engine's Zipf request stream
};

struct EngineReport {
  int32_t status = KDN_OK;  // KDN_OK or the first kdn_status that failed
  char error[120] = {};     // which call failed
  uint64_t start_ns = 0, end_ns = 0;
  uint64_t requests = 0;
  uint64_t requested_chunks = 0, lookup_hit_chunks = 0;
  uint64_t retrieve_bytes = 0, retrieve_ns = 0, retrieved_chunks = 0;
  uint64_t store_bytes = 0, store_ns = 0, stored_chunks = 0;
  uint64_t store_skipped_chunks = 0;  // slots kdnd did not hand out (already cached)
  uint64_t store_no_space = 0;        // reservations refused with KDN_ERR_NO_SPACE
  uint64_t corrupt_chunks = 0;        // retrieved chunks whose stamp was not theirs
  uint64_t lookup_not_cached = 0;     // lookup-loop answers that missed chunks
  uint64_t memcpy_bytes = 0;          // kMemcpy
  uint64_t minor_faults = 0;          // page faults of this engine during the task
  double lookup_p50_us = 0, lookup_p99_us = 0, lookup_mean_us = 0;
  double ping_p50_us = 0, ping_p99_us = 0;
  double prefix_keys_p50_us = 0;    // kdn_prefix_keys of the same prompt, no daemon
  double lookup_tokens_p50_us = 0;  // kdn_lookup from token ids: hashing + round trip
  kdn_stats stats = {};
};

struct EngineSetup {
  std::string socket_path;
  ModelLayout layout;
  uint64_t corpus_seed = 0;
};

class EngineFleet {
 public:
  // Forks `processes` engines; each connects, registers the model and pre-faults its buffer.
  // Fails if any engine cannot (its kdn error in the Status text is printed to stderr).
  static Result<EngineFleet> start(const EngineSetup& setup, unsigned processes) noexcept;

  EngineFleet(EngineFleet&&) noexcept = default;
  EngineFleet& operator=(EngineFleet&&) noexcept = default;
  ~EngineFleet();

  size_t size() const noexcept { return engines_.size(); }

  // Runs commands[i] on engine i (nullopt: engine i sits the task out) and returns the
  // reports of the engines that ran, in order. Engines start together (ready/go).
  Result<std::vector<EngineReport>> run(const std::vector<std::optional<EngineCommand>>& commands,
                                        std::chrono::seconds timeout) noexcept;

  // Tells every engine to disconnect and exit, and reaps it.
  Status quit() noexcept;

 private:
  struct Engine {
    ChildProcess process;
    int control_fd = -1;
  };
  EngineFleet() = default;
  std::vector<Engine> engines_;
};

// The body of one engine process (runs in the forked child); its exit code.
int run_engine_process(const EngineSetup& setup, unsigned index, int control_fd);

}  // namespace kdn::bench
