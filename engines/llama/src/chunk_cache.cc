#include <kdn/llama/chunk_cache.h>

#include <kdn/kernels/layout.h>
#include <kdn/kernels/segment.h>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace kdn::llama {
namespace {

class MemoryLease final : public ChunkLease {
 public:
  explicit MemoryLease(std::vector<std::span<const uint8_t>> chunks) noexcept : chunks_(std::move(chunks)) {}
  uint32_t chunks() const noexcept override { return static_cast<uint32_t>(chunks_.size()); }
  std::span<const uint8_t> chunk(uint32_t i) const noexcept override {
    return i < chunks_.size() ? chunks_[i] : std::span<const uint8_t>();
  }

 private:
  std::vector<std::span<const uint8_t>> chunks_;
};

// Writes go to private buffers and reach the node only on commit, like kdnd's two-phase store.
class MemoryReservation final : public ChunkReservation {
 public:
  MemoryReservation(MemoryNode& node, std::vector<kdn_key> keys, std::vector<bool> wanted,
                    uint64_t chunk_bytes) noexcept
      : node_(node), keys_(std::move(keys)), slots_(keys_.size()) {
    for (size_t i = 0; i < keys_.size(); ++i)
      if (wanted[i]) slots_[i].resize(chunk_bytes);
  }
  uint32_t chunks() const noexcept override { return static_cast<uint32_t>(keys_.size()); }
  std::span<uint8_t> slot(uint32_t i) noexcept override {
    return i < slots_.size() ? std::span<uint8_t>(slots_[i]) : std::span<uint8_t>();
  }
  Status commit() noexcept override {
    if (committed_) return Status(Code::kInvalidArgument, "reservation already committed");
    committed_ = true;
    for (size_t i = 0; i < keys_.size(); ++i)
      if (!slots_[i].empty()) node_.chunks.emplace(keys_[i], std::move(slots_[i]));
    return OkStatus();
  }

 private:
  MemoryNode& node_;
  std::vector<kdn_key> keys_;
  std::vector<std::vector<uint8_t>> slots_;
  bool committed_ = false;
};

Status check_segment(const SegmentRef& s) {
  if (s.tokens.empty() || s.tokens.size() > kMaxSegmentTokens)
    return Status(Code::kInvalidArgument, "segment: 1 .. 2^24 tokens");
  if (s.base_pos < 0 || s.base_pos > kMaxPosition)
    return Status(Code::kInvalidArgument, "segment: base_pos out of range");
  return OkStatus();
}

kernels::ChunkGeometry geometry_of(const ModelInfo& m) {
  return {m.desc.num_layers, m.desc.num_kv_heads, m.desc.head_dim, m.chunk_tokens, kernels::DType(m.desc.dtype)};
}

}  // namespace

Result<std::vector<SegmentHits>> ChunkCache::lookup_segments(std::span<const SegmentRef>) noexcept {
  return Status(Code::kUnsupported, "this cache does not store segments");
}
Result<uint32_t> ChunkCache::store_segment(const SegmentRef&, const kdn_engine_layout&) noexcept {
  return Status(Code::kUnsupported, "this cache does not store segments");
}
Status ChunkCache::retrieve_segments(std::span<const SegmentRef>, std::span<const int64_t>, const kdn_engine_layout&,
                                     std::span<uint64_t>) noexcept {
  return Status(Code::kUnsupported, "this cache does not store segments");
}

Result<std::unique_ptr<MemoryChunkCache>> MemoryChunkCache::open(MemoryNode& node,
                                                                 const kdn_model_desc& desc) noexcept {
  Result<ModelInfo> model = ModelInfo::from_desc(desc);
  if (!model.ok()) return model.status();
  return std::unique_ptr<MemoryChunkCache>(new MemoryChunkCache(node, model.value()));
}

std::vector<kdn_key> MemoryChunkCache::keys(std::span<const int32_t> tokens, size_t max) const {
  std::vector<kdn_key> out(std::min(max, tokens.size() / model_.chunk_tokens));
  out.resize(prefix_keys(model_, tokens, out));
  return out;
}

Result<std::unique_ptr<ChunkLease>> MemoryChunkCache::retrieve(std::span<const int32_t> tokens,
                                                               uint32_t max_chunks) noexcept {
  const size_t limit = max_chunks == 0 ? SIZE_MAX : max_chunks;
  std::vector<std::span<const uint8_t>> hits;
  for (const kdn_key& key : keys(tokens, limit)) {
    auto it = node_.chunks.find(key);
    if (it == node_.chunks.end()) break;
    hits.emplace_back(it->second);
  }
  return std::unique_ptr<ChunkLease>(new MemoryLease(std::move(hits)));
}

Result<std::unique_ptr<ChunkReservation>> MemoryChunkCache::reserve(std::span<const int32_t> tokens,
                                                                    uint32_t first_chunk, uint32_t n_chunks) noexcept {
  if (uint64_t{first_chunk} + n_chunks > tokens.size() / model_.chunk_tokens)
    return Status(Code::kInvalidArgument, "reservation beyond the whole chunks of the tokens");
  std::vector<kdn_key> all = keys(tokens, first_chunk + n_chunks);
  std::vector<kdn_key> mine(all.begin() + first_chunk, all.end());
  std::vector<bool> wanted(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) wanted[i] = !node_.chunks.contains(mine[i]);
  return std::unique_ptr<ChunkReservation>(
      new MemoryReservation(node_, std::move(mine), std::move(wanted), model_.chunk_bytes));
}

std::vector<kdn_key> MemoryChunkCache::segment_keys(const SegmentRef& seg) const {
  std::vector<kdn_key> k(segment_chunks(model_, seg.tokens.size()));
  kdn::segment_keys(model_, seg.base_key, seg.base_pos, seg.tokens, k);
  return k;
}

Result<std::vector<SegmentHits>> MemoryChunkCache::lookup_segments(std::span<const SegmentRef> segs) noexcept {
  try {
    std::vector<SegmentHits> out;
    for (const SegmentRef& seg : segs) {
      KDN_RETURN_IF_ERROR(check_segment(seg));
      SegmentHits h;
      bool leading = true;
      for (const kdn_key& k : segment_keys(seg)) {
        const bool hit = node_.chunks.contains(k);
        ++h.chunks;
        h.cached_chunks += hit;
        leading = leading && hit;
        h.leading_chunks += leading;
      }
      h.cached_tokens = std::min<uint64_t>(seg.tokens.size(), uint64_t{h.leading_chunks} * model_.chunk_tokens);
      out.push_back(h);
    }
    return out;
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "segment lookup");
  }
}

Result<uint32_t> MemoryChunkCache::store_segment(const SegmentRef& seg, const kdn_engine_layout& src) noexcept {
  KDN_RETURN_IF_ERROR(check_segment(seg));
  const kernels::ChunkGeometry geo = geometry_of(model_);
  kernels::EngineView view;
  KDN_RETURN_IF_ERROR(kernels::view_from_abi(src, geo, {}, &view));
  try {
    const std::vector<kdn_key> keys = segment_keys(seg);
    std::vector<std::vector<uint8_t>> bufs(keys.size());
    std::vector<void*> ptrs(keys.size(), nullptr);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (node_.chunks.contains(keys[i])) continue;
      bufs[i].resize(model_.chunk_bytes);
      ptrs[i] = bufs[i].data();
    }
    KDN_RETURN_IF_ERROR(kernels::gather_segment(view, ptrs, seg.tokens.size(), geo, kernels::Executor::cpu()));
    uint32_t stored = 0;
    for (size_t i = 0; i < keys.size(); ++i)
      if (ptrs[i] != nullptr) stored += node_.chunks.emplace(keys[i], std::move(bufs[i])).second;
    return stored;
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "segment store");
  }
}

Status MemoryChunkCache::retrieve_segments(std::span<const SegmentRef> segs, std::span<const int64_t> target,
                                           const kdn_engine_layout& dst, std::span<uint64_t> loaded) noexcept {
  if (target.size() != segs.size() || loaded.size() != segs.size())
    return Status(Code::kInvalidArgument, "segment: one target and one count per segment");
  for (size_t s = 0; s < segs.size(); ++s) {
    KDN_RETURN_IF_ERROR(check_segment(segs[s]));
    if (target[s] < 0 || target[s] > kMaxPosition - int64_t(segs[s].tokens.size()))
      return Status(Code::kInvalidArgument, "segment: target position out of range");
  }
  const kernels::ChunkGeometry geo = geometry_of(model_);
  kernels::EngineView view;
  KDN_RETURN_IF_ERROR(kernels::view_from_abi(dst, geo, {}, &view));
  float inv[kMaxHeadDim / 2];
  kernels::SegmentRope rope;
  KDN_RETURN_IF_ERROR(kernels::segment_rope_from_desc(model_.desc, inv, kMaxHeadDim / 2, &rope));
  try {
    bool whole = true;
    int64_t offset = 0;
    for (size_t s = 0; s < segs.size(); ++s) {
      std::vector<const void*> chunks;
      for (const kdn_key& k : segment_keys(segs[s])) {
        auto it = node_.chunks.find(k);
        if (it == node_.chunks.end() || it->second.size() != model_.chunk_bytes) break;
        chunks.push_back(it->second.data());
      }
      const uint64_t n = std::min<uint64_t>(segs[s].tokens.size(), uint64_t{chunks.size()} * model_.chunk_tokens);
      loaded[s] = 0;
      if (n > 0) {
        view.first_token = offset;
        KDN_RETURN_IF_ERROR(kernels::scatter_segment(chunks, n, geo, view, rope, target[s] - segs[s].base_pos,
                                                     kernels::Executor::cpu()));
      }
      loaded[s] = n;
      whole = whole && n == segs[s].tokens.size();
      offset += int64_t(segs[s].tokens.size());
    }
    return whole ? OkStatus() : Status(Code::kNotFound, "a segment is not cached whole");
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "segment retrieve");
  }
}

std::vector<uint8_t>* MemoryChunkCache::find_segment(const SegmentRef& seg, uint32_t i) noexcept {
  const std::vector<kdn_key> k = segment_keys(seg);
  if (i >= k.size()) return nullptr;
  auto it = node_.chunks.find(k[i]);
  return it == node_.chunks.end() ? nullptr : &it->second;
}

std::vector<uint8_t>* MemoryChunkCache::find(std::span<const int32_t> tokens, uint32_t i) noexcept {
  std::vector<kdn_key> all = keys(tokens, size_t{i} + 1);
  if (all.size() <= i) return nullptr;
  auto it = node_.chunks.find(all[i]);
  return it == node_.chunks.end() ? nullptr : &it->second;
}

}  // namespace kdn::llama
