// Where an engine's KV chunks live. The production store is kdnd, reached through libkdn
// (kdn_chunk_cache.h); MemoryChunkCache keeps chunks in this process and lets tests corrupt,
// truncate or hide them. The engine only sees this interface, so every fault a test injects
// here takes the same path a fault in kdnd would.
//
// Chunks are canonical ([layer][K|V][token][kv_head][head_dim], kdn/kdn.h) and addressed, as
// in kdnd, by the prefix keys of the model descriptor the store was opened with: chunk i of a
// prompt names the prompt's tokens [0, (i + 1) * chunk_tokens).
//
// Thread safety: none; a store, its leases and reservations belong to one engine thread.
#pragma once

#include <kdn/common/model.h>
#include <kdn/common/status.h>
#include <kdn/kdn.h>

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

namespace kdn::llama {

// Read access to leased chunks; the destructor releases the lease.
class ChunkLease {
 public:
  virtual ~ChunkLease() = default;
  virtual uint32_t chunks() const noexcept = 0;
  // Bytes of chunk i (i < chunks()). Untrusted: the engine checks size and content.
  virtual std::span<const uint8_t> chunk(uint32_t i) const noexcept = 0;
};

// Slots for chunks to store; the destructor aborts the reservation unless it was committed.
class ChunkReservation {
 public:
  virtual ~ChunkReservation() = default;
  virtual uint32_t chunks() const noexcept = 0;
  // Writable slot for chunk i, or an empty span when the chunk needs no write (already
  // cached, or being stored by another engine).
  virtual std::span<uint8_t> slot(uint32_t i) noexcept = 0;
  // Publishes every written slot. Call at most once.
  virtual Status commit() noexcept = 0;
};

// A segment (kdn/kdn.h, docs/blend.md): tokens whose KV was computed at positions base_pos..
// after the base context named by base_key. Borrows its tokens.
struct SegmentRef {
  std::span<const int32_t> tokens;
  kdn_key base_key{};
  int64_t base_pos = 0;
};

// How much of a segment is cached (kdn_segment_hits without the map).
struct SegmentHits {
  uint32_t chunks = 0;          // ceil(tokens / chunk_tokens)
  uint32_t cached_chunks = 0;   // cached in some tier
  uint32_t leading_chunks = 0;  // cached before the first that is not
  uint64_t cached_tokens = 0;   // tokens of the leading cached chunks
  bool whole(const SegmentRef& s) const noexcept { return cached_tokens == s.tokens.size(); }
};

class ChunkCache {
 public:
  virtual ~ChunkCache() = default;

  // ---- segments (kUnsupported unless the cache implements them) ------------------------------
  // Per-segment hits, for all segments in one round trip.
  virtual Result<std::vector<SegmentHits>> lookup_segments(std::span<const SegmentRef> segs) noexcept;
  // Stores a segment's KV from an engine buffer (segment token t = engine token t of `src`);
  // returns the chunks written (chunks already cached are skipped).
  virtual Result<uint32_t> store_segment(const SegmentRef& seg, const kdn_engine_layout& src) noexcept;
  // Loads segments into an engine buffer at target positions: segment s goes to engine tokens
  // off_s .. off_s + its tokens - 1 (off_s = the tokens of the segments before it), K rotated
  // by target[s] - base_pos. loaded[s] gets the tokens written (its leading cached chunks);
  // kNotFound if a segment was not loaded whole. Bytes are written unchecked: the caller checks
  // what it loaded before using it.
  virtual Status retrieve_segments(std::span<const SegmentRef> segs, std::span<const int64_t> target,
                                   const kdn_engine_layout& dst, std::span<uint64_t> loaded) noexcept;
  // Leases the longest cached prefix of whole chunks of `tokens`, at most max_chunks of them
  // (0 = no limit). A miss is a lease of zero chunks, not an error.
  virtual Result<std::unique_ptr<ChunkLease>> retrieve(std::span<const int32_t> tokens,
                                                       uint32_t max_chunks) noexcept = 0;
  // Reserves slots for chunks [first_chunk, first_chunk + n_chunks) of `tokens`, at most
  // max_reserve_chunks() of them at once.
  virtual Result<std::unique_ptr<ChunkReservation>> reserve(std::span<const int32_t> tokens, uint32_t first_chunk,
                                                            uint32_t n_chunks) noexcept = 0;
  // The most chunks one reservation may hold (kdnd: what the session's staging area holds).
  virtual uint32_t max_reserve_chunks() const noexcept { return UINT32_MAX; }
  // Starts bringing the cached prefix of `tokens` close (kdnd: from its disk tier into the
  // host arena) and returns at once; a later retrieve finds it there. A hint: stores without
  // slower tiers do nothing, and an error only means it did not start.
  virtual Status prefetch(std::span<const int32_t> tokens) noexcept {
    (void)tokens;
    return OkStatus();
  }
};

// The chunks of one "node": shared by every MemoryChunkCache opened on it, whatever their
// model descriptors, so engines with different fingerprints meet in one key space exactly as
// they do in kdnd.
class MemoryNode {
 public:
  std::unordered_map<kdn_key, std::vector<uint8_t>, KeyHash> chunks;
};

class MemoryChunkCache final : public ChunkCache {
 public:
  // `node` must outlive the store.
  static Result<std::unique_ptr<MemoryChunkCache>> open(MemoryNode& node, const kdn_model_desc& desc) noexcept;

  Result<std::unique_ptr<ChunkLease>> retrieve(std::span<const int32_t> tokens, uint32_t max_chunks) noexcept override;
  Result<std::unique_ptr<ChunkReservation>> reserve(std::span<const int32_t> tokens, uint32_t first_chunk,
                                                    uint32_t n_chunks) noexcept override;

  Result<std::vector<SegmentHits>> lookup_segments(std::span<const SegmentRef> segs) noexcept override;
  Result<uint32_t> store_segment(const SegmentRef& seg, const kdn_engine_layout& src) noexcept override;
  Status retrieve_segments(std::span<const SegmentRef> segs, std::span<const int64_t> target,
                           const kdn_engine_layout& dst, std::span<uint64_t> loaded) noexcept override;

  // Test access: the stored bytes of chunk i of `tokens`, or null if absent. Mutating them
  // (or resizing them) is how tests corrupt and truncate chunks.
  std::vector<uint8_t>* find(std::span<const int32_t> tokens, uint32_t i) noexcept;
  // The same for chunk i of a segment.
  std::vector<uint8_t>* find_segment(const SegmentRef& seg, uint32_t i) noexcept;
  const ModelInfo& model() const noexcept { return model_; }

 private:
  MemoryChunkCache(MemoryNode& node, const ModelInfo& model) noexcept : node_(node), model_(model) {}
  std::vector<kdn_key> keys(std::span<const int32_t> tokens, size_t max) const;
  std::vector<kdn_key> segment_keys(const SegmentRef& seg) const;

  MemoryNode& node_;
  ModelInfo model_;
};

}  // namespace kdn::llama
