#include <kdn/llama/chunk_cache.h>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace kdn::llama {
namespace {

class MemoryLease final : public ChunkLease {
 public:
  explicit MemoryLease(std::vector<std::span<const uint8_t>> chunks) noexcept
      : chunks_(std::move(chunks)) {}
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

}  // namespace

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
                                                                    uint32_t first_chunk,
                                                                    uint32_t n_chunks) noexcept {
  if (uint64_t{first_chunk} + n_chunks > tokens.size() / model_.chunk_tokens)
    return Status(Code::kInvalidArgument, "reservation beyond the whole chunks of the tokens");
  std::vector<kdn_key> all = keys(tokens, first_chunk + n_chunks);
  std::vector<kdn_key> mine(all.begin() + first_chunk, all.end());
  std::vector<bool> wanted(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) wanted[i] = !node_.chunks.contains(mine[i]);
  return std::unique_ptr<ChunkReservation>(
      new MemoryReservation(node_, std::move(mine), std::move(wanted), model_.chunk_bytes));
}

std::vector<uint8_t>* MemoryChunkCache::find(std::span<const int32_t> tokens, uint32_t i) noexcept {
  std::vector<kdn_key> all = keys(tokens, size_t{i} + 1);
  if (all.size() <= i) return nullptr;
  auto it = node_.chunks.find(all[i]);
  return it == node_.chunks.end() ? nullptr : &it->second;
}

}  // namespace kdn::llama
