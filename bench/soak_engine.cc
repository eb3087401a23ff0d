#include "soak_engine.h"

#include "node_workload.h"

#include <kdn/common/clock.h>

#include <sys/mman.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <new>
#include <random>
#include <thread>

namespace kdn::bench::soak {
namespace {

uint64_t mix64(uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Word j of the stamp of a chunk whose key gives `seed`.
uint64_t stamp_word(uint64_t seed, uint64_t j) noexcept { return mix64(seed + j * 0x9E3779B97F4A7C15ull); }
uint64_t stamp_seed(const kdn_key& key) noexcept { return mix64(key.lo) ^ key.hi; }

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

constexpr uint64_t kStagingBytes = 8ull << 20;  // a document's reservation is well under this

struct Doc {
  std::vector<int32_t> tokens;
  std::vector<kdn_key> keys;  // one per chunk
};

struct Held {
  kdn_lease* lease = nullptr;
  uint32_t doc = 0;
};

// One engine: a libkdn client, the corpus' keys, the leases it holds, its slot on the board.
class SoakEngine {
 public:
  SoakEngine(const SoakWorkload& w, SoakBoard* board, uint32_t slot, uint64_t stream_seed)
      : w_(w), board_(board), slot_(board->slots[slot]), rng_(stream_seed), zipf_(w.docs, 1.0) {}
  ~SoakEngine() { kdn_disconnect(client_); }

  int run() {
    if (!build_corpus()) return 4;
    if (!connect()) return board_->stop.load(std::memory_order_acquire) ? 0 : 3;
    while (!board_->stop.load(std::memory_order_acquire)) {
      const uint32_t gen = board_->pause.load(std::memory_order_acquire);
      if (gen != 0 && slot_.parked.load(std::memory_order_relaxed) != gen) {
        park(gen);
        continue;
      }
      step();
    }
    release_all();
    return 0;
  }

 private:
  bool build_corpus() {
    docs_.resize(w_.docs);
    for (uint32_t d = 0; d < w_.docs; ++d) {
      docs_[d].tokens = soak_document(w_, d);
      docs_[d].keys.resize(w_.doc_chunks);
      size_t n = 0;
      if (kdn_prefix_keys(&w_.desc, docs_[d].tokens.data(), docs_[d].tokens.size(), docs_[d].keys.data(), w_.doc_chunks,
                          &n) != KDN_OK ||
          n != w_.doc_chunks)
        return false;
    }
    chunk_bytes_ = kdn_chunk_bytes(&w_.desc);
    return chunk_bytes_ > 0;
  }

  // Connects and registers the model, retrying while kdnd is down (a restart), for at most 2 min.
  bool connect() {
    const uint64_t deadline = now_ns() + 120'000'000'000ull;
    while (!board_->stop.load(std::memory_order_acquire) && now_ns() < deadline) {
      kdn_connect_opts o{};
      o.struct_size = sizeof o;
      o.socket_path = w_.socket_path.c_str();
      o.timeout_ms = 10000;
      o.staging_bytes = kStagingBytes;
      if (kdn_connect(&o, &client_) == KDN_OK) {
        if (kdn_register_model(client_, &w_.desc, &model_) == KDN_OK) return true;
        kdn_disconnect(client_);
        client_ = nullptr;
      }
      sleep_ms(50);
    }
    return false;
  }

  // True if a disconnection is what a client must expect of a call that started at t0: kdnd
  // is down, or the call started before kdnd came back (plus a grace period, in which a
  // connection the kill broke has not reconnected yet: one attempt per 200 ms).
  bool outage(uint64_t t0) const noexcept {
    if (board_->kdnd_down.load(std::memory_order_acquire) != 0) return true;
    const uint64_t up = board_->kdnd_up_ns.load(std::memory_order_acquire);
    return up != 0 && t0 < up + w_.expect_outage_ns;
  }

  bool expected(int status, uint64_t t0) const noexcept {
    switch (status) {
      case KDN_ERR_NOT_FOUND:  // evicted between a lookup and what followed it
      case KDN_ERR_NO_SPACE:   // the arena is full of leased and reserved chunks
      case KDN_ERR_BUSY:       // prefetches fill the rings
        return true;
      case KDN_ERR_UNAVAILABLE:
      case KDN_ERR_TIMEOUT:
        return outage(t0);
      default:
        return false;
    }
  }

  void finish(Op op, int status, uint64_t t0) {
    record(slot_, op, status, status != KDN_OK && expected(status, t0), now_ns() - t0);
    // While kdnd is down every call fails at once: do not spin on it.
    if (status == KDN_ERR_UNAVAILABLE) sleep_ms(5);
  }

  void step() {
    const uint32_t doc = zipf_.sample(rng_);
    const uint32_t pick = uint32_t(rng_() % 100);
    if (pick < 20)
      store(doc);
    else if (pick < 45)
      lookup(doc);
    else if (pick < 75)
      lease(doc);
    else if (pick < 88 && !held_.empty())
      release(uint32_t(rng_() % held_.size()));
    else
      prefetch(doc);
  }

  // Reserve, write each slot kdnd hands out with its stamp, commit: a prefix of the document.
  void store(uint32_t doc) {
    const Doc& d = docs_[doc];
    const uint32_t n = 1 + uint32_t(rng_() % w_.doc_chunks);
    const uint64_t t0 = now_ns();
    kdn_store* s = nullptr;
    int st = kdn_store_reserve(client_, model_, d.tokens.data(), d.tokens.size(), 0, n, &s);
    if (st == KDN_OK) {
      for (uint32_t i = 0; i < kdn_store_chunks(s); ++i)
        if (void* p = kdn_store_chunk_data(s, i)) fill_stamp(d.keys[i], p, chunk_bytes_);
      st = kdn_store_commit(client_, s);
    }
    finish(Op::kStore, st, t0);
  }

  void lookup(uint32_t doc) {
    const Doc& d = docs_[doc];
    kdn_lookup_result r{};
    const uint64_t t0 = now_ns();
    int st = kdn_lookup(client_, model_, d.tokens.data(), d.tokens.size(), &r);
    if (st == KDN_OK && r.hit_chunks > w_.doc_chunks) st = -int(kErrBadResult);
    finish(Op::kLookup, st, t0);
  }

  void lease(uint32_t doc) {
    const Doc& d = docs_[doc];
    kdn_lease* l = nullptr;
    const uint64_t t0 = now_ns();
    int st = kdn_retrieve_lease(client_, model_, d.tokens.data(), d.tokens.size(), 0, &l);
    if (st == KDN_OK && kdn_lease_chunks(l) > w_.doc_chunks) st = -int(kErrBadResult);
    finish(Op::kLease, st, t0);
    if (l == nullptr) return;
    verify(l, doc);
    held_.push_back({l, doc});
    if (held_.size() > w_.held_leases || rng_() % 2 == 0) release(uint32_t(held_.size() - 1));
  }

  // Verifies the lease's bytes again (a leased chunk must not change) and releases it.
  void release(uint32_t i) {
    const Held h = held_[i];
    held_.erase(held_.begin() + i);
    verify(h.lease, h.doc);
    const uint64_t t0 = now_ns();
    finish(Op::kRelease, kdn_lease_release(client_, h.lease), t0);
  }

  void release_all() {
    while (!held_.empty()) release(uint32_t(held_.size() - 1));
  }

  void prefetch(uint32_t doc) {
    const Doc& d = docs_[doc];
    const uint64_t t0 = now_ns();
    finish(Op::kPrefetch, kdn_prefetch(client_, model_, d.tokens.data(), d.tokens.size()), t0);
  }

  void verify(const kdn_lease* l, uint32_t doc) {
    const uint32_t n = std::min(kdn_lease_chunks(l), w_.doc_chunks);
    for (uint32_t i = 0; i < n; ++i) {
      const uint64_t wrong = count_wrong_bytes(docs_[doc].keys[i], kdn_lease_chunk_data(l, i), chunk_bytes_);
      slot_.verified_chunks.fetch_add(1, std::memory_order_relaxed);
      slot_.verified_bytes.fetch_add(chunk_bytes_, std::memory_order_relaxed);
      if (wrong == 0) continue;
      slot_.wrong_chunks.fetch_add(1, std::memory_order_relaxed);
      slot_.wrong_bytes.fetch_add(wrong, std::memory_order_relaxed);
    }
  }

  // Releases every lease, waits until kdnd answers a ping (reconnecting if it must), says so on
  // the board and waits for the pause to end: the bench then samples kdnd in a known state.
  void park(uint32_t gen) {
    release_all();
    while (kdn_ping(client_) != KDN_OK) {
      if (board_->stop.load(std::memory_order_acquire) || board_->pause.load(std::memory_order_acquire) != gen) return;
      sleep_ms(20);
    }
    slot_.parked.store(gen, std::memory_order_release);
    while (board_->pause.load(std::memory_order_acquire) == gen && !board_->stop.load(std::memory_order_acquire))
      sleep_ms(2);
  }

  const SoakWorkload& w_;
  SoakBoard* board_;
  EngineSlot& slot_;
  std::mt19937_64 rng_;
  ZipfSampler zipf_;
  std::vector<Doc> docs_;
  uint64_t chunk_bytes_ = 0;
  kdn_client* client_ = nullptr;
  kdn_model* model_ = nullptr;
  std::vector<Held> held_;
};

}  // namespace

const char* op_name(Op op) noexcept {
  switch (op) {
    case Op::kStore:
      return "store";
    case Op::kLookup:
      return "lookup";
    case Op::kLease:
      return "lease";
    case Op::kRelease:
      return "release";
    case Op::kPrefetch:
      return "prefetch";
    case Op::kEvict:
      return "evict";
    default:
      return "?";
  }
}

const char* error_name(uint32_t kind) noexcept {
  static const char* const kNames[kErrKindCount] = {
      "ok",         "invalid_argument", "not_found",      "no_space",    "protocol", "version",
      "permission", "unavailable",      "timeout",        "in_progress", "busy",     "io",
      "no_memory",  "corrupt",          "model_mismatch", "unsupported", "internal", "limit",
      "bad_result"};
  return kind < kErrKindCount ? kNames[kind] : "other";
}

uint32_t latency_bucket(uint64_t ns) noexcept {
  if (ns < 2) return 0;
  const double b = std::log2(double(ns)) * kBucketsPerOctave;
  return std::min<uint32_t>(kBuckets - 1, uint32_t(b));
}

double bucket_ns(uint32_t bucket) noexcept { return std::exp2((bucket + 0.5) / kBucketsPerOctave); }

SoakBoard* SoakBoard::create() noexcept {
  void* p = mmap(nullptr, sizeof(SoakBoard), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  return new (p) SoakBoard();  // the mapping is zeroed; value-initialization keeps it so
}

void SoakBoard::destroy(SoakBoard* board) noexcept {
  if (board != nullptr) munmap(board, sizeof(SoakBoard));
}

void record(EngineSlot& slot, Op op, int status, bool expected, uint64_t ns) noexcept {
  const uint32_t o = uint32_t(op);
  slot.ops[o].fetch_add(1, std::memory_order_relaxed);
  slot.latency[o][latency_bucket(ns)].fetch_add(1, std::memory_order_relaxed);
  if (status == KDN_OK) return;
  const uint32_t kind = status < 0 && uint32_t(-status) < kErrKindCount ? uint32_t(-status) : kErrBadResult;
  (expected ? slot.expected : slot.unexpected)[o][kind].fetch_add(1, std::memory_order_relaxed);
}

std::vector<int32_t> soak_document(const SoakWorkload& w, uint32_t doc) {
  std::vector<int32_t> t(size_t(w.doc_chunks) * w.desc.chunk_tokens);
  uint64_t x = mix64(w.seed * 0x9E3779B97F4A7C15ull + doc + 1);
  for (auto& v : t) v = int32_t((x = mix64(x + 0x9E3779B97F4A7C15ull)) % kVocabSize);
  return t;
}

void fill_stamp(const kdn_key& key, void* dst, size_t bytes) noexcept {
  const uint64_t seed = stamp_seed(key);
  auto* out = static_cast<unsigned char*>(dst);
  for (size_t j = 0; j * 8 < bytes; ++j) {
    const uint64_t w = stamp_word(seed, j);
    std::memcpy(out + j * 8, &w, std::min<size_t>(8, bytes - j * 8));
  }
}

uint64_t count_wrong_bytes(const kdn_key& key, const void* data, size_t bytes) noexcept {
  const uint64_t seed = stamp_seed(key);
  const auto* in = static_cast<const unsigned char*>(data);
  uint64_t wrong = 0;
  for (size_t j = 0; j * 8 < bytes; ++j) {
    const size_t n = std::min<size_t>(8, bytes - j * 8);
    uint64_t want = stamp_word(seed, j), got = 0;
    std::memcpy(&got, in + j * 8, n);
    if (n < 8) want &= (1ull << (8 * n)) - 1;
    for (uint64_t diff = want ^ got; diff != 0; diff >>= 8) wrong += (diff & 0xFF) != 0;
  }
  return wrong;
}

int run_soak_engine(const SoakWorkload& w, SoakBoard* board, uint32_t slot, uint64_t stream_seed) {
  SoakEngine engine(w, board, slot, stream_seed);
  return engine.run();
}

}  // namespace kdn::bench::soak
