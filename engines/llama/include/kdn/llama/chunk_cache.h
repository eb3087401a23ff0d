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

class ChunkCache {
 public:
  virtual ~ChunkCache() = default;
  // Leases the longest cached prefix of whole chunks of `tokens`, at most max_chunks of them
  // (0 = no limit). A miss is a lease of zero chunks, not an error.
  virtual Result<std::unique_ptr<ChunkLease>> retrieve(std::span<const int32_t> tokens,
                                                       uint32_t max_chunks) noexcept = 0;
  // Reserves slots for chunks [first_chunk, first_chunk + n_chunks) of `tokens`, at most
  // max_reserve_chunks() of them at once.
  virtual Result<std::unique_ptr<ChunkReservation>> reserve(std::span<const int32_t> tokens,
                                                             uint32_t first_chunk,
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
  static Result<std::unique_ptr<MemoryChunkCache>> open(MemoryNode& node,
                                                        const kdn_model_desc& desc) noexcept;

  Result<std::unique_ptr<ChunkLease>> retrieve(std::span<const int32_t> tokens,
                                               uint32_t max_chunks) noexcept override;
  Result<std::unique_ptr<ChunkReservation>> reserve(std::span<const int32_t> tokens,
                                                    uint32_t first_chunk,
                                                    uint32_t n_chunks) noexcept override;

  // Test access: the stored bytes of chunk i of `tokens`, or null if absent. Mutating them
  // (or resizing them) is how tests corrupt and truncate chunks.
  std::vector<uint8_t>* find(std::span<const int32_t> tokens, uint32_t i) noexcept;
  const ModelInfo& model() const noexcept { return model_; }

 private:
  MemoryChunkCache(MemoryNode& node, const ModelInfo& model) noexcept : node_(node), model_(model) {}
  std::vector<kdn_key> keys(std::span<const int32_t> tokens, size_t max) const;

  MemoryNode& node_;
  ModelInfo model_;
};

}  // namespace kdn::llama
