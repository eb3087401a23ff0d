// The engine side of the node benchmark: what an engine process does per request, timed.
//
//   retrieve = kdn_retrieve_lease + kdn_copy_chunk of every leased chunk into the engine buffer +
//              kdn_lease_release   (bytes copied / time, lease round trips included)
//   store    = kdn_store_reserve + kdn_copy_chunk from the engine buffer into every handed-out
//              staging slot + kdn_store_commit_post, whose op completes once kdnd copied the
//              slots into the arena; in rounds of half the staging area, the engine filling
//              one round while kdnd copies the previous    (bytes stored / time)
//
// Every chunk the bench stores carries a stamp (document, chunk) in its first bytes; every
// retrieved chunk's stamp is checked after the timed copy, so a wrong or torn chunk counts as
// corrupt instead of as bandwidth.
#include "engine_fleet.h"
#include "page_buffer.h"
#include "stats.h"

#include <kdn/common/clock.h>

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

namespace kdn::bench {
namespace {

constexpr uint32_t kDocChunks = kDocTokens / kBenchChunkTokens;
constexpr uint32_t kLookupWarmup = 1000;
constexpr auto kIdleCommandWait = std::chrono::hours(24);

struct ChunkStamp {
  uint64_t doc_tag;
  uint64_t chunk;
  bool operator==(const ChunkStamp&) const = default;
};

ChunkStamp stamp_for(uint32_t doc, uint32_t chunk) { return {0x6b646e0000000000ull | doc, chunk}; }

class Engine {
 public:
  Engine(const EngineSetup& setup, unsigned index) : setup_(setup), index_(index) {}
  ~Engine() {
    if (client_ != nullptr) kdn_disconnect(client_);
  }

  EngineReport connect();
  // Untimed setup of a task (buffers it needs); a failure is recorded in `rep`.
  void prepare(const EngineCommand& cmd, EngineReport& rep);
  void run(const EngineCommand& cmd, EngineReport& rep);
  // Untimed checks of the task's result, then frees what prepare allocated.
  void finish(const EngineCommand& cmd, EngineReport& rep);

 private:
  bool check(int rc, const char* call, EngineReport& rep);
  void store_chunks(uint32_t doc, const std::vector<int32_t>& tokens, uint32_t first, EngineReport& rep);
  uint32_t retrieve_chunks(uint32_t doc, const std::vector<int32_t>& tokens, EngineReport& rep);
  void serve_request(uint32_t doc, uint64_t request_id, EngineReport& rep);
  void run_store(const EngineCommand& cmd, EngineReport& rep);
  void run_retrieve(const EngineCommand& cmd, EngineReport& rep);
  void run_zipf(const EngineCommand& cmd, EngineReport& rep);
  void run_lookup_loop(const EngineCommand& cmd, EngineReport& rep);
  void time_prefix_keys(const std::vector<int32_t>& tokens, uint32_t samples, EngineReport& rep);
  void run_memcpy(const EngineCommand& cmd, EngineReport& rep);

  std::byte* chunk_in_buffer(uint32_t chunk) { return buffer_.data() + chunk * chunk_bytes_; }

  const EngineSetup& setup_;
  unsigned index_;
  kdn_client* client_ = nullptr;
  kdn_model* model_ = nullptr;
  uint64_t chunk_bytes_ = 0;
  PageBuffer buffer_;
  PageBuffer source_;  // kMemcpy only: stands in for the arena
};

// Records the first failure; true if rc is KDN_OK.
bool Engine::check(int rc, const char* call, EngineReport& rep) {
  if (rc == KDN_OK) return true;
  if (rep.status == KDN_OK) {
    rep.status = rc;
    std::snprintf(rep.error, sizeof rep.error, "engine %u: %s: %s", index_, call, kdn_strerror(rc));
  }
  return false;
}

EngineReport Engine::connect() {
  EngineReport rep;
  kdn_connect_opts opts;
  std::memset(&opts, 0, sizeof opts);
  opts.struct_size = sizeof opts;
  opts.socket_path = setup_.socket_path.c_str();
  if (!check(kdn_connect(&opts, &client_), "kdn_connect", rep)) return rep;
  kdn_model_desc desc = model_desc(setup_.layout);
  if (!check(kdn_register_model(client_, &desc, &model_), "kdn_register_model", rep)) return rep;
  chunk_bytes_ = kdn_model_chunk_bytes(model_);
  if (chunk_bytes_ != setup_.layout.chunk_bytes()) {
    check(KDN_ERR_MODEL_MISMATCH, "kdn_model_chunk_bytes differs from the layout", rep);
    return rep;
  }
  Result<PageBuffer> buffer = PageBuffer::allocate(setup_.layout.doc_bytes(), true);
  if (!buffer.ok()) {
    check(KDN_ERR_NO_MEMORY, "engine buffer", rep);
    return rep;
  }
  buffer_ = std::move(buffer).value();
  buffer_.fill_pattern(index_ + 1);
  return rep;
}

void Engine::store_chunks(uint32_t doc, const std::vector<int32_t>& tokens, uint32_t first, EngineReport& rep) {
  if (first >= kDocChunks) return;
  for (uint32_t c = first; c < kDocChunks; ++c) {
    ChunkStamp stamp = stamp_for(doc, c);
    std::memcpy(chunk_in_buffer(c), &stamp, sizeof stamp);
  }
  // In rounds of half what the staging area holds, two rounds in flight: the engine copies
  // round k+1 into staging while kdnd copies round k into the arena (kdn_store_commit_post).
  const uint32_t round = std::max<uint32_t>(1, kdn_store_max_chunks(client_, model_) / 2);
  uint64_t t0 = now_ns();
  uint64_t copied = 0;
  kdn_op* in_flight = nullptr;
  auto land = [&]() {  // waits for the commit in flight, if any
    if (in_flight == nullptr) return true;
    const int rc = kdn_op_wait(client_, in_flight, 0);
    kdn_op_release(client_, in_flight);
    in_flight = nullptr;
    return check(rc, "kdn_store_commit_post", rep);
  };
  for (uint32_t at = first; at < kDocChunks;) {
    const uint32_t n = std::min(round, kDocChunks - at);
    kdn_store* store = nullptr;
    int rc = kdn_store_reserve(client_, model_, tokens.data(), tokens.size(), at, n, &store);
    if (rc == KDN_ERR_NO_SPACE) {
      ++rep.store_no_space;
      break;
    }
    if (!check(rc, "kdn_store_reserve", rep)) break;
    const uint32_t slots = kdn_store_chunks(store);
    for (uint32_t i = 0; i < slots; ++i) {
      void* slot = kdn_store_chunk_data(store, i);
      if (slot == nullptr) {
        ++rep.store_skipped_chunks;
        continue;
      }
      kdn_copy_chunk(slot, chunk_in_buffer(at + i), chunk_bytes_);
      ++copied;
    }
    if (!land()) {
      (void)kdn_store_abort(client_, store);
      return;
    }
    if (!check(kdn_store_commit_post(client_, store, &in_flight), "kdn_store_commit_post", rep)) return;
    at += n;
  }
  if (!land()) return;
  rep.store_ns += now_ns() - t0;
  rep.store_bytes += copied * chunk_bytes_;
  rep.stored_chunks += copied;
}

// Leases and copies the cached prefix; returns how many chunks were copied.
uint32_t Engine::retrieve_chunks(uint32_t doc, const std::vector<int32_t>& tokens, EngineReport& rep) {
  uint64_t t0 = now_ns();
  kdn_lease* lease = nullptr;
  int rc = kdn_retrieve_lease(client_, model_, tokens.data(), tokens.size(), 0, &lease);
  if (!check(rc, "kdn_retrieve_lease", rep)) return 0;
  uint32_t n = std::min(kdn_lease_chunks(lease), kDocChunks);
  uint32_t copied = 0;
  for (; copied < n; ++copied) {
    const void* src = kdn_lease_chunk_data(lease, copied);
    if (src == nullptr) break;
    kdn_copy_chunk(chunk_in_buffer(copied), src, chunk_bytes_);
  }
  if (!check(kdn_lease_release(client_, lease), "kdn_lease_release", rep)) return 0;
  rep.retrieve_ns += now_ns() - t0;
  if (copied < n) check(KDN_ERR_INTERNAL, "kdn_lease_chunk_data returned NULL", rep);
  rep.retrieve_bytes += uint64_t{copied} * chunk_bytes_;
  rep.retrieved_chunks += copied;
  for (uint32_t c = 0; c < copied; ++c) {
    ChunkStamp seen;
    std::memcpy(&seen, chunk_in_buffer(c), sizeof seen);
    if (!(seen == stamp_for(doc, c))) ++rep.corrupt_chunks;
  }
  return copied;
}

// One RAG request: lookup, retrieve the cached prefix, store what had to be computed.
void Engine::serve_request(uint32_t doc, uint64_t request_id, EngineReport& rep) {
  std::vector<int32_t> tokens = request_tokens(setup_.corpus_seed, doc, request_id);
  kdn_lookup_result found;
  if (!check(kdn_lookup(client_, model_, tokens.data(), tokens.size(), &found), "kdn_lookup", rep)) {
    return;
  }
  ++rep.requests;
  rep.requested_chunks += kDocChunks;
  rep.lookup_hit_chunks += std::min(found.hit_chunks, kDocChunks);
  uint32_t have = found.hit_chunks > 0 ? retrieve_chunks(doc, tokens, rep) : 0;
  if (have < kDocChunks) store_chunks(doc, tokens, have, rep);
}

void Engine::run_zipf(const EngineCommand& cmd, EngineReport& rep) {
  ZipfSampler zipf(cmd.corpus_docs, cmd.zipf_s);
  std::mt19937_64 rng(cmd.stream_seed);
  for (uint32_t r = 0; r < cmd.requests && rep.status == KDN_OK; ++r) {
    uint32_t doc = zipf.sample(rng);
    serve_request(doc, cmd.stream_seed * 1000003ull + r, rep);
  }
}

// The client-side part of a lookup: hashing the prompt into prefix keys.
void Engine::time_prefix_keys(const std::vector<int32_t>& tokens, uint32_t samples, EngineReport& rep) {
  kdn_model_desc desc = model_desc(setup_.layout);
  kdn_key keys[kDocChunks + 1];
  std::vector<uint64_t> times;
  times.reserve(samples);
  for (uint32_t i = 0; i < kLookupWarmup + samples; ++i) {
    size_t n = 0;
    uint64_t t0 = now_ns();
    int rc = kdn_prefix_keys(&desc, tokens.data(), tokens.size(), keys, kDocChunks + 1, &n);
    uint64_t t1 = now_ns();
    if (!check(rc, "kdn_prefix_keys", rep)) return;
    if (i >= kLookupWarmup) times.push_back(t1 - t0);
  }
  rep.prefix_keys_p50_us = summarize_ns(times).p50_us;
}

// The control path: a lookup of a cached 8K-token document with its prefix keys already
// computed (kdn_lookup_keys), which is what an engine that hashes each request once pays
// per lookup. kdn_lookup from token ids (hashing included) is timed separately.
void Engine::run_lookup_loop(const EngineCommand& cmd, EngineReport& rep) {
  std::vector<int32_t> tokens = request_tokens(setup_.corpus_seed, cmd.first_doc, 0);
  kdn_model_desc desc = model_desc(setup_.layout);
  kdn_key keys[kDocChunks + 1];
  size_t n_keys = 0;
  if (!check(kdn_prefix_keys(&desc, tokens.data(), tokens.size(), keys, kDocChunks + 1, &n_keys), "kdn_prefix_keys",
             rep))
    return;
  std::vector<uint64_t> lookups, by_tokens, pings;
  lookups.reserve(cmd.samples);
  by_tokens.reserve(cmd.samples);
  pings.reserve(cmd.samples);
  for (uint32_t i = 0; i < kLookupWarmup + cmd.samples; ++i) {
    kdn_lookup_result found;
    uint64_t t0 = now_ns();
    int rc = kdn_lookup_keys(client_, model_, keys, n_keys, &found);
    uint64_t t1 = now_ns();
    if (!check(rc, "kdn_lookup_keys", rep)) return;
    if (found.hit_chunks != kDocChunks) ++rep.lookup_not_cached;
    if (i >= kLookupWarmup) lookups.push_back(t1 - t0);
  }
  for (uint32_t i = 0; i < kLookupWarmup + cmd.samples; ++i) {
    kdn_lookup_result found;
    uint64_t t0 = now_ns();
    int rc = kdn_lookup(client_, model_, tokens.data(), tokens.size(), &found);
    uint64_t t1 = now_ns();
    if (!check(rc, "kdn_lookup", rep)) return;
    if (found.hit_chunks != kDocChunks) ++rep.lookup_not_cached;
    if (i >= kLookupWarmup) by_tokens.push_back(t1 - t0);
  }
  rep.lookup_tokens_p50_us = summarize_ns(by_tokens).p50_us;
  for (uint32_t i = 0; i < kLookupWarmup + cmd.samples; ++i) {
    uint64_t t0 = now_ns();
    int rc = kdn_ping(client_);
    uint64_t t1 = now_ns();
    if (!check(rc, "kdn_ping", rep)) return;
    if (i >= kLookupWarmup) pings.push_back(t1 - t0);
  }
  time_prefix_keys(tokens, cmd.samples, rep);
  LatencySummary lookup = summarize_ns(lookups), ping = summarize_ns(pings);
  rep.lookup_p50_us = lookup.p50_us;
  rep.lookup_p99_us = lookup.p99_us;
  rep.lookup_mean_us = lookup.mean_us;
  rep.ping_p50_us = ping.p50_us;
  rep.ping_p99_us = ping.p99_us;
}

void Engine::prepare(const EngineCommand& cmd, EngineReport& rep) {
  if (cmd.task != EngineTask::kMemcpy) return;
  Result<PageBuffer> source = PageBuffer::allocate(buffer_.size(), true);
  if (!source.ok()) {
    check(KDN_ERR_NO_MEMORY, "memcpy source buffer", rep);
    return;
  }
  source_ = std::move(source).value();
  source_.fill_pattern(index_ + 100);
}

// Exactly the copies of the retrieve phase (chunk by chunk into the engine buffer, same
// bytes, same processes, moments apart) with a private buffer in place of the arena.
void Engine::run_memcpy(const EngineCommand& cmd, EngineReport& rep) {
  if (source_.size() != buffer_.size()) return;
  for (uint32_t p = 0; p < cmd.passes; ++p) {
    for (uint32_t d = 0; d < cmd.n_docs; ++d) {
      for (uint32_t c = 0; c < kDocChunks; ++c) {
        std::memcpy(chunk_in_buffer(c), source_.data() + c * chunk_bytes_, chunk_bytes_);
      }
      rep.memcpy_bytes += uint64_t{kDocChunks} * chunk_bytes_;
    }
  }
}

void Engine::finish(const EngineCommand& cmd, EngineReport& rep) {
  if (cmd.task == EngineTask::kMemcpy && rep.status == KDN_OK &&
      std::memcmp(buffer_.data(), source_.data(), buffer_.size()) != 0) {
    check(KDN_ERR_INTERNAL, "memcpy baseline copy differs", rep);
  }
  source_ = PageBuffer();
}

void Engine::run_store(const EngineCommand& cmd, EngineReport& rep) {
  for (uint32_t d = cmd.first_doc; d < cmd.first_doc + cmd.n_docs; ++d) {
    if (rep.status != KDN_OK) return;
    store_chunks(d, request_tokens(setup_.corpus_seed, d, 0), 0, rep);
  }
}

void Engine::run_retrieve(const EngineCommand& cmd, EngineReport& rep) {
  for (uint32_t p = 0; p < cmd.passes; ++p) {
    for (uint32_t d = cmd.first_doc; d < cmd.first_doc + cmd.n_docs; ++d) {
      if (rep.status != KDN_OK) return;
      rep.requested_chunks += kDocChunks;
      retrieve_chunks(d, request_tokens(setup_.corpus_seed, d, 0), rep);
    }
  }
}

void Engine::run(const EngineCommand& cmd, EngineReport& rep) {
  switch (cmd.task) {
    case EngineTask::kStore:
      return run_store(cmd, rep);
    case EngineTask::kRetrieve:
      return run_retrieve(cmd, rep);
    case EngineTask::kLookupLoop:
      return run_lookup_loop(cmd, rep);
    case EngineTask::kZipf:
      return run_zipf(cmd, rep);
    case EngineTask::kStats:
      rep.stats.struct_size = sizeof rep.stats;
      check(kdn_get_stats(client_, &rep.stats), "kdn_get_stats", rep);
      return;
    case EngineTask::kMemcpy:
      return run_memcpy(cmd, rep);
    case EngineTask::kQuit:
      return;
  }
  check(KDN_ERR_INVALID_ARGUMENT, "unknown task", rep);
}

// Minor page faults of this process so far: first touches of arena pages show up here.
uint64_t minor_faults() {
  rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<uint64_t>(usage.ru_minflt);
}

// ready -> go -> run -> report. False when the bench went away.
bool serve_command(Engine& engine, const EngineCommand& cmd, int fd) {
  EngineReport rep;
  engine.prepare(cmd, rep);
  uint32_t ready = kEngineReady, go = 0;
  if (!send_message(fd, &ready, sizeof ready).ok()) return false;
  if (!receive_message(fd, &go, sizeof go, kIdleCommandWait).ok() || go != kEngineGo) return false;
  uint64_t faults_before = minor_faults();
  rep.start_ns = now_ns();
  if (rep.status == KDN_OK) engine.run(cmd, rep);
  rep.end_ns = now_ns();
  rep.minor_faults = minor_faults() - faults_before;
  engine.finish(cmd, rep);
  return send_message(fd, &rep, sizeof rep).ok();
}

}  // namespace

int run_engine_process(const EngineSetup& setup, unsigned index, int control_fd) {
  Engine engine(setup, index);
  EngineReport hello = engine.connect();
  if (!send_message(control_fd, &hello, sizeof hello).ok() || hello.status != KDN_OK) return 1;
  while (true) {
    EngineCommand cmd;
    if (!receive_message(control_fd, &cmd, sizeof cmd, kIdleCommandWait).ok()) return 1;
    if (cmd.task == EngineTask::kQuit) return 0;
    if (!serve_command(engine, cmd, control_fd)) return 1;
  }
}

}  // namespace kdn::bench
