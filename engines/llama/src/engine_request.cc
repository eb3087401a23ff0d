// Engine::generate: one request through the cache (load prefix, prefill rest, store new chunks).
#include <kdn/llama/engine.h>

#include <kdn/common/clock.h>

#include "kv_restore.h"
#include "overlapped_load.h"

#include <llama.h>

#include <algorithm>

namespace kdn::llama {
namespace {

double seconds_between(uint64_t t0, uint64_t t1) { return static_cast<double>(t1 - t0) * 1e-9; }

// Greedy choice; ties go to the lowest token id so every run picks the same one.
int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Keeps the first failure: it is the one that explains why the cache was not used.
void note(RequestStats& stats, const Status& st) {
  if (stats.cache_status.ok() && !st.ok()) stats.cache_status = st;
}

}  // namespace

uint32_t Engine::load_cached_prefix(std::span<const int32_t> prompt, ChunkCache& store, RequestStats& stats,
                                    std::unique_ptr<ChunkLease>& held) noexcept {
  const uint32_t t = identity_.geometry.chunk_tokens;
  // The last prompt token is always computed: its logits choose the first new token.
  const uint32_t max_chunks = static_cast<uint32_t>((prompt.size() - 1) / t);
  if (max_chunks == 0) return 0;
  const uint64_t t0 = now_ns();
  Result<std::unique_ptr<ChunkLease>> lease = store.retrieve(prompt, max_chunks);
  const uint64_t t1 = now_ns();
  stats.retrieve_s = seconds_between(t0, t1);
  if (!lease.ok()) {
    note(stats, lease.status());
    return 0;
  }
  const uint32_t n = std::min((*lease)->chunks(), max_chunks);
  if (n == 0) return 0;
  std::vector<std::span<const uint8_t>> chunks(n);
  for (uint32_t i = 0; i < n; ++i) chunks[i] = (*lease)->chunk(i);
  // Overlapped: the cells are placed now and the bytes copied beside the prefill (the lease
  // outlives the copy: generate() finishes it before the lease goes back).
  Status st = load_chunks_into(chunks, overlap_ ? &overlap_->staging() : nullptr);
  if (st.ok() && overlap_) {
    st = overlap_->start(identity_.geometry.type);
    if (!st.ok()) reset();  // the cells placed for the bytes that will not come
  }
  stats.load_s = seconds_between(t1, now_ns());
  if (!st.ok()) {
    note(stats, st);
    return 0;  // the lease goes back here
  }
  held = std::move(lease.value());
  stats.chunks_loaded = n;
  stats.bytes_loaded = uint64_t{n} * identity_.geometry.chunk_bytes();
  return n * t;
}

void Engine::store_new_chunks(std::span<const int32_t> prompt, uint32_t first_chunk, ChunkCache& store,
                              RequestStats& stats) noexcept {
  const uint32_t total = static_cast<uint32_t>(prompt.size() / identity_.geometry.chunk_tokens);
  if (first_chunk >= total) return;
  const uint64_t t0 = now_ns();
  // In batches of what one reservation may hold (kdnd: the session's staging area).
  const uint32_t batch = std::max<uint32_t>(1, store.max_reserve_chunks());
  for (uint32_t first = first_chunk; first < total;) {
    const uint32_t n = std::min(batch, total - first);
    Result<std::unique_ptr<ChunkReservation>> res = store.reserve(prompt, first, n);
    if (!res.ok()) {
      note(stats, res.status());
      break;
    }
    ChunkReservation& r = *res.value();
    std::vector<std::span<uint8_t>> slots(r.chunks());
    uint32_t wanted = 0;
    for (uint32_t i = 0; i < r.chunks(); ++i) {
      slots[i] = r.slot(i);
      wanted += !slots[i].empty();
    }
    Status st = wanted ? extract_chunks(first, slots) : OkStatus();
    if (st.ok()) st = r.commit();
    // On failure the reservation's destructor aborts it: no partial chunk is ever published.
    note(stats, st);
    if (!st.ok()) break;
    stats.chunks_stored += wanted;
    stats.bytes_stored += uint64_t{wanted} * identity_.geometry.chunk_bytes();
    first += n;
  }
  stats.store_s = seconds_between(t0, now_ns());
}

Result<Generation> Engine::generate(std::span<const int32_t> prompt, uint32_t n_predict, ChunkCache* store) noexcept {
  if (prompt.empty() || n_predict == 0) return Status(Code::kInvalidArgument, "empty prompt or nothing to predict");
  if (prompt.size() + n_predict > llama_n_ctx(ctx_))
    return Status(Code::kInvalidArgument, "prompt and answer do not fit in the context");
  reset();
  Generation gen;
  RequestStats& stats = gen.stats;
  const bool use_cache = store != nullptr && cache_support_.ok();
  if (store != nullptr) note(stats, cache_support_);

  const uint64_t t0 = now_ns();
  std::unique_ptr<ChunkLease> lease;
  uint32_t reused = use_cache ? load_cached_prefix(prompt, *store, stats, lease) : 0;
  uint64_t t1 = now_ns();
  Status computed = prefill(prompt.subspan(reused), reused, {});
  if (overlap_ && overlap_->pending()) {
    const Status copied = overlap_->finish();
    stats.load_copy_s = overlap_->copy_s();
    stats.load_wait_s = overlap_->waited_s();
    if (!copied.ok()) {
      // The prefill ran on bytes that failed their check: throw it away and compute it all.
      note(stats, copied);
      reset();
      lease.reset();
      reused = 0;
      stats.chunks_loaded = 0;
      stats.bytes_loaded = 0;
      t1 = now_ns();
      computed = prefill(prompt, 0, {});
    }
  }
  KDN_RETURN_IF_ERROR(computed);
  std::span<const float> logits = last_logits();
  int32_t token = argmax(logits);
  const uint64_t t2 = now_ns();
  stats.prefill_s = seconds_between(t1, t2);
  stats.ttft_s = seconds_between(t0, t2);
  stats.tokens_reused = reused;
  stats.tokens_computed = static_cast<uint32_t>(prompt.size()) - reused;
  gen.first_logits.assign(logits.begin(), logits.end());
  gen.tokens.push_back(token);
  lease.reset();  // the bytes have been in the KV cache since the load; the first token is out

  if (use_cache) store_new_chunks(prompt, reused / identity_.geometry.chunk_tokens, *store, stats);

  KDN_RETURN_IF_ERROR(decode_greedy(gen.tokens, n_predict));
  return gen;
}

Status Engine::decode_greedy(std::vector<int32_t>& tokens, uint32_t n_predict) noexcept {
  if (tokens.empty()) return Status(Code::kInvalidArgument, "no first token to continue from");
  const llama_vocab* vocab = llama_model_get_vocab(model_);
  uint32_t pos = sequence_length();
  while (tokens.size() < n_predict && !llama_vocab_is_eog(vocab, tokens.back())) {
    KDN_RETURN_IF_ERROR(decode_one(tokens.back(), pos++));
    tokens.push_back(argmax(last_logits()));
  }
  return OkStatus();
}

}  // namespace kdn::llama
