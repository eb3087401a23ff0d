#include <kdn/llama/kdn_chunk_cache.h>

#include <new>
#include <vector>

namespace kdn::llama {
namespace {

class KdnLease final : public ChunkLease {
 public:
  KdnLease(kdn_client* client, kdn_lease* lease, uint64_t chunk_bytes) noexcept
      : client_(client), lease_(lease), chunk_bytes_(chunk_bytes) {}
  ~KdnLease() override { (void)kdn_lease_release(client_, lease_); }
  uint32_t chunks() const noexcept override { return kdn_lease_chunks(lease_); }
  std::span<const uint8_t> chunk(uint32_t i) const noexcept override {
    const void* p = kdn_lease_chunk_data(lease_, i);
    if (p == nullptr) return {};
    return {static_cast<const uint8_t*>(p), chunk_bytes_};
  }

 private:
  kdn_client* client_;
  kdn_lease* lease_;
  uint64_t chunk_bytes_;
};

class KdnReservation final : public ChunkReservation {
 public:
  KdnReservation(kdn_client* client, kdn_store* store, uint64_t chunk_bytes) noexcept
      : client_(client), store_(store), chunk_bytes_(chunk_bytes) {}
  ~KdnReservation() override {
    if (store_ != nullptr) (void)kdn_store_abort(client_, store_);
  }
  uint32_t chunks() const noexcept override { return kdn_store_chunks(store_); }
  std::span<uint8_t> slot(uint32_t i) noexcept override {
    void* p = store_ == nullptr ? nullptr : kdn_store_chunk_data(store_, i);
    if (p == nullptr) return {};
    return {static_cast<uint8_t*>(p), chunk_bytes_};
  }
  Status commit() noexcept override {
    if (store_ == nullptr) return Status(Code::kInvalidArgument, "reservation already finished");
    kdn_store* s = store_;
    store_ = nullptr;  // commit consumes the handle, whatever it returns
    return from_kdn(kdn_store_commit(client_, s), "kdn_store_commit failed");
  }

 private:
  kdn_client* client_;
  kdn_store* store_;
  uint64_t chunk_bytes_;
};

}  // namespace

Status from_kdn(int rc, const char* what) noexcept {
  if (rc == KDN_OK) return OkStatus();
  if (rc < KDN_ERR_LIMIT || rc > 0) return Status(Code::kInternal, what);
  return Status(static_cast<Code>(rc), what);
}

Result<std::unique_ptr<KdnChunkCache>> KdnChunkCache::connect(const kdn_model_desc& desc,
                                                              const std::string& socket_path,
                                                              const std::string& name_space, bool create,
                                                              const std::string& token) noexcept {
  kdn_connect_opts opts{};
  opts.struct_size = sizeof opts;
  if (create) opts.flags |= KDN_CONNECT_CREATE_NAMESPACE;
  opts.socket_path = socket_path.empty() ? nullptr : socket_path.c_str();
  opts.name_space = name_space.empty() ? nullptr : name_space.c_str();
  opts.token = token.empty() ? nullptr : token.c_str();
  kdn_client* client = nullptr;
  KDN_RETURN_IF_ERROR(from_kdn(kdn_connect(&opts, &client), "cannot connect to kdnd"));
  kdn_model* model = nullptr;
  const Status st = from_kdn(kdn_register_model(client, &desc, &model), "kdnd refused the model");
  if (!st.ok()) {
    kdn_disconnect(client);
    return st;
  }
  std::unique_ptr<KdnChunkCache> s(new (std::nothrow) KdnChunkCache(client, model));
  if (!s) {
    kdn_disconnect(client);
    return Status(Code::kNoMemory, "store allocation failed");
  }
  return s;
}

KdnChunkCache::~KdnChunkCache() { kdn_disconnect(client_); }

Result<std::unique_ptr<ChunkLease>> KdnChunkCache::retrieve(std::span<const int32_t> tokens,
                                                            uint32_t max_chunks) noexcept {
  kdn_lease* lease = nullptr;
  KDN_RETURN_IF_ERROR(from_kdn(kdn_retrieve_lease(client_, model_, tokens.data(), tokens.size(), max_chunks, &lease),
                               "kdn_retrieve_lease failed"));
  std::unique_ptr<ChunkLease> l(new (std::nothrow) KdnLease(client_, lease, kdn_model_chunk_bytes(model_)));
  if (!l) {
    (void)kdn_lease_release(client_, lease);
    return Status(Code::kNoMemory, "lease allocation failed");
  }
  return l;
}

Result<std::unique_ptr<ChunkReservation>> KdnChunkCache::reserve(std::span<const int32_t> tokens, uint32_t first_chunk,
                                                                 uint32_t n_chunks) noexcept {
  kdn_store* store = nullptr;
  KDN_RETURN_IF_ERROR(
      from_kdn(kdn_store_reserve(client_, model_, tokens.data(), tokens.size(), first_chunk, n_chunks, &store),
               "kdn_store_reserve failed"));
  std::unique_ptr<ChunkReservation> r(new (std::nothrow) KdnReservation(client_, store, kdn_model_chunk_bytes(model_)));
  if (!r) {
    (void)kdn_store_abort(client_, store);
    return Status(Code::kNoMemory, "reservation allocation failed");
  }
  return r;
}

uint32_t KdnChunkCache::max_reserve_chunks() const noexcept { return kdn_store_max_chunks(client_, model_); }

Status KdnChunkCache::prefetch(std::span<const int32_t> tokens) noexcept {
  return from_kdn(kdn_prefetch(client_, model_, tokens.data(), tokens.size()), "kdn_prefetch failed");
}

namespace {

std::vector<kdn_segment> to_abi(std::span<const SegmentRef> segs) {
  std::vector<kdn_segment> out(segs.size());
  for (size_t i = 0; i < segs.size(); ++i) {
    out[i].struct_size = sizeof(kdn_segment);
    out[i].tokens = segs[i].tokens.data();
    out[i].n_tokens = segs[i].tokens.size();
    out[i].base_key = segs[i].base_key;
    out[i].base_pos = segs[i].base_pos;
  }
  return out;
}

}  // namespace

Result<std::vector<SegmentHits>> KdnChunkCache::lookup_segments(std::span<const SegmentRef> segs) noexcept {
  try {
    const std::vector<kdn_segment> abi = to_abi(segs);
    std::vector<kdn_segment_hits> hits(abi.size());
    size_t chunks = 0;
    for (const SegmentRef& s : segs)
      chunks += (s.tokens.size() + kdn_model_chunk_tokens(model_) - 1) / kdn_model_chunk_tokens(model_);
    std::vector<uint8_t> map(chunks);
    KDN_RETURN_IF_ERROR(
        from_kdn(kdn_segment_lookup(client_, model_, abi.data(), abi.size(), hits.data(), map.data(), map.size()),
                 "kdn_segment_lookup failed"));
    std::vector<SegmentHits> out(hits.size());
    for (size_t i = 0; i < hits.size(); ++i)
      out[i] = SegmentHits{hits[i].chunks, hits[i].cached_chunks, hits[i].leading_chunks, hits[i].cached_tokens};
    return out;
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "segment lookup");
  }
}

Result<uint32_t> KdnChunkCache::store_segment(const SegmentRef& seg, const kdn_engine_layout& src) noexcept {
  const kdn_segment abi = to_abi({&seg, 1})[0];
  uint32_t stored = 0;
  KDN_RETURN_IF_ERROR(
      from_kdn(kdn_segment_store_from(client_, model_, &abi, &src, &stored), "kdn_segment_store_from failed"));
  return stored;
}

Status KdnChunkCache::retrieve_segments(std::span<const SegmentRef> segs, std::span<const int64_t> target,
                                        const kdn_engine_layout& dst, std::span<uint64_t> loaded) noexcept {
  if (target.size() != segs.size() || loaded.size() != segs.size())
    return Status(Code::kInvalidArgument, "segment: one target and one count per segment");
  try {
    const std::vector<kdn_segment> abi = to_abi(segs);
    return from_kdn(
        kdn_segment_retrieve_to(client_, model_, abi.data(), abi.size(), target.data(), &dst, loaded.data()),
        "kdn_segment_retrieve_to failed");
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "segment retrieve");
  }
}

Result<kdn_stats> KdnChunkCache::stats() noexcept {
  kdn_stats s{};
  s.struct_size = sizeof s;
  KDN_RETURN_IF_ERROR(from_kdn(kdn_get_stats(client_, &s), "kdn_get_stats failed"));
  return s;
}

}  // namespace kdn::llama
