// ChunkCache over libkdn: the engine's chunks live in kdnd, shared by every engine on the node.
//
// Segments go through kdn_segment_lookup / _store_from / _retrieve_to (libkdn re-rotates K
// on the way into the engine's buffer).
//
// Retrieve leases chunks zero-copy from kdnd's host arena (kdn_retrieve_lease); store
// reserves arena slots, the engine writes canonical chunks straight into them, and commit
// publishes them (kdn_store_reserve / kdn_store_commit). A lease is held only while the
// engine copies its chunks into llama.cpp.
//
// Ownership: the store owns its kdn_client connection and model registration; leases and
// reservations it hands out must be destroyed before it. Not thread-safe (libkdn clients
// are not).
#pragma once

#include <kdn/kdn.h>
#include <kdn/llama/chunk_cache.h>

#include <memory>
#include <string>

namespace kdn::llama {

class KdnChunkCache final : public ChunkCache {
 public:
  // Connects to kdnd (socket_path empty: libkdn's default) in namespace `name_space` (empty:
  // "default") and registers the model. A kUnavailable status when kdnd is not running.
  // `create`: ask kdnd to create the namespace if it does not exist (KDN_CONNECT_CREATE_NAMESPACE;
  // kdnd decides whether this client may). `token`: the shared secret kdnd may require (empty: none).
  static Result<std::unique_ptr<KdnChunkCache>> connect(const kdn_model_desc& desc, const std::string& socket_path,
                                                        const std::string& name_space = "", bool create = false,
                                                        const std::string& token = "") noexcept;
  ~KdnChunkCache() override;
  KdnChunkCache(const KdnChunkCache&) = delete;
  KdnChunkCache& operator=(const KdnChunkCache&) = delete;

  Result<std::unique_ptr<ChunkLease>> retrieve(std::span<const int32_t> tokens, uint32_t max_chunks) noexcept override;
  Result<std::unique_ptr<ChunkReservation>> reserve(std::span<const int32_t> tokens, uint32_t first_chunk,
                                                    uint32_t n_chunks) noexcept override;
  uint32_t max_reserve_chunks() const noexcept override;
  // kdn_prefetch: promotions from kdnd's disk tier start, nothing waits.
  Status prefetch(std::span<const int32_t> tokens) noexcept override;
  Result<std::vector<SegmentHits>> lookup_segments(std::span<const SegmentRef> segs) noexcept override;
  Result<uint32_t> store_segment(const SegmentRef& seg, const kdn_engine_layout& src) noexcept override;
  Status retrieve_segments(std::span<const SegmentRef> segs, std::span<const int64_t> target,
                           const kdn_engine_layout& dst, std::span<uint64_t> loaded) noexcept override;
  // kdnd's counters for this client's namespace.
  Result<kdn_stats> stats() noexcept;

 private:
  KdnChunkCache(kdn_client* client, kdn_model* model) noexcept : client_(client), model_(model) {}
  kdn_client* client_;
  kdn_model* model_;
};

// A kdn C status as a kdn::Status (the codes are the same numbers).
Status from_kdn(int rc, const char* what) noexcept;

}  // namespace kdn::llama
