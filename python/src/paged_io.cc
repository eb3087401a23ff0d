#include "paged_io.h"

#include <algorithm>
#include <vector>

namespace kdn::python {
namespace {

void check_ranges(const Model& model, const PagedKV& kv, std::span<const int32_t> tokens,
                  std::span<const int64_t> blocks, uint64_t end_chunk) {
  const PagedGeometry& g = kv.geometry();
  if (model.chunk_tokens() != g.chunk_tokens || model.chunk_bytes() != kv.chunk_bytes())
    throw Error(KDN_ERR_MODEL_MISMATCH, "the model's chunks do not match the paged KV geometry");
  if (end_chunk * g.chunk_tokens > tokens.size())
    throw Error(KDN_ERR_INVALID_ARGUMENT, "fewer tokens than the chunks named");
  if (end_chunk * kv.blocks_per_chunk() > blocks.size())
    throw Error(KDN_ERR_INVALID_ARGUMENT, "fewer block ids than the chunks named");
  for (size_t j = 0; j < end_chunk * kv.blocks_per_chunk(); ++j)
    if (blocks[j] < 0 || uint64_t(blocks[j]) >= g.num_blocks)
      throw Error(KDN_ERR_INVALID_ARGUMENT, "block id outside the KV cache");
}

std::span<const int64_t> chunk_blocks(const PagedKV& kv, std::span<const int64_t> blocks, uint32_t c) {
  const uint32_t k = kv.blocks_per_chunk();
  return blocks.subspan(size_t{c} * k, k);
}

}  // namespace

LoadOutcome load_chunks(const Model& model, PagedKV& kv, std::span<const int32_t> tokens,
                        std::span<const int64_t> blocks, uint32_t first_chunk, uint32_t end_chunk,
                        int64_t first_block) {
  if (first_chunk >= end_chunk) throw Error(KDN_ERR_INVALID_ARGUMENT, "no chunk to load");
  check_ranges(model, kv, tokens, blocks, end_chunk);
  const size_t n_tokens = size_t{end_chunk} * kv.geometry().chunk_tokens;

  LoadOutcome out;
  kdn_lease* lease = nullptr;
  const int rc = model.client().status_call(
      [&](kdn_client* c) { return kdn_retrieve_lease(c, model.handle(), tokens.data(), n_tokens, end_chunk, &lease); });
  if (rc != KDN_OK) {
    out.status = rc;
    return out;
  }
  const uint32_t leased = kdn_lease_chunks(lease);
  const uint32_t last = std::min(leased, end_chunk);

  // Blocks before first_block hold what the engine computed itself: leave them alone.
  std::vector<int64_t> ids(blocks.begin(), blocks.begin() + size_t{end_chunk} * kv.blocks_per_chunk());
  for (int64_t j = 0; j < std::min<int64_t>(first_block, int64_t(ids.size())); ++j) ids[j] = -1;

  std::vector<ChunkCopy> copies;
  for (uint32_t c = first_chunk; c < last; ++c)
    copies.push_back({static_cast<const uint8_t*>(kdn_lease_chunk_data(lease, c)),
                      chunk_blocks(kv, std::span<const int64_t>(ids), c)});
  std::vector<uint8_t> ok(copies.size(), 0);
  Status st = copies.empty() ? OkStatus() : kv.scatter(copies, ok);

  const int release_rc = model.client().call_to_finish([&](kdn_client* c) { return kdn_lease_release(c, lease); });
  (void)release_rc;  // the bytes are copied; a dead connection drops the lease by itself
  if (!st.ok()) {
    out.status = st.raw();
    return out;
  }
  while (out.loaded < ok.size() && ok[out.loaded]) ++out.loaded;
  out.corrupt = uint32_t(std::count(ok.begin(), ok.end(), uint8_t{0}));
  out.bytes = uint64_t{out.loaded} * kv.chunk_bytes();
  if (out.loaded < ok.size()) {
    out.status = KDN_ERR_CORRUPT;
  } else if (last < end_chunk) {
    out.status = KDN_ERR_NOT_FOUND;
  }
  return out;
}

SaveOutcome save_chunks(const Model& model, PagedKV& kv, std::span<const int32_t> tokens,
                        std::span<const int64_t> blocks, uint32_t first_chunk, uint32_t n_chunks) {
  SaveOutcome out;
  if (n_chunks == 0) return out;
  const uint64_t end_chunk = uint64_t{first_chunk} + n_chunks;
  check_ranges(model, kv, tokens, blocks, end_chunk);
  const size_t n_tokens = size_t(end_chunk) * kv.geometry().chunk_tokens;
  uint32_t round = 0;
  out.status = model.client().status_call([&](kdn_client* c) {
    round = kdn_store_max_chunks(c, model.handle());
    return round == 0 ? int(KDN_ERR_LIMIT) : int(KDN_OK);  // 0: a read-only session
  });
  if (out.status != KDN_OK) return out;
  for (uint32_t done = 0; done < n_chunks;) {
    const uint32_t n = std::min(round, n_chunks - done);
    kdn_store* store = nullptr;
    int rc = model.client().status_call([&](kdn_client* c) {
      return kdn_store_reserve(c, model.handle(), tokens.data(), n_tokens, first_chunk + done, n, &store);
    });
    if (rc != KDN_OK) {
      out.status = rc;
      return out;
    }
    std::vector<std::span<const int64_t>> src;
    std::vector<uint8_t*> dst;
    for (uint32_t i = 0; i < n; ++i) {
      auto* slot = static_cast<uint8_t*>(kdn_store_chunk_data(store, i));
      if (slot == nullptr) {
        ++out.present;
        continue;
      }
      src.push_back(chunk_blocks(kv, blocks, first_chunk + done + i));
      dst.push_back(slot);
    }
    const Status st = dst.empty() ? OkStatus() : kv.gather(src, dst);
    if (!st.ok()) {
      model.client().call_to_finish([&](kdn_client* c) { return kdn_store_abort(c, store); });
      out.status = st.raw();
      return out;
    }
    rc = model.client().call_to_finish([&](kdn_client* c) { return kdn_store_commit(c, store); });
    if (rc != KDN_OK) {
      out.status = rc;
      return out;
    }
    out.stored += uint32_t(dst.size());
    out.bytes += uint64_t(dst.size()) * kv.chunk_bytes();
    done += n;
  }
  return out;
}

}  // namespace kdn::python
