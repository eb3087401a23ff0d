#include "server_prompt_cache.h"

#include <kdn/common/clock.h>
#include <kdn/llama/kdn_chunk_cache.h>

#include "engine_identity.h"
#include "kv_restore.h"

#include "log.h"  // llama.cpp common's log: our lines interleave with the server's own

#include <llama.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>

namespace kdn::llama {
namespace {

constexpr uint32_t kChunkTokens = 256;  // kdn-llama's: the two share chunks
constexpr uint64_t kRetryNs = 1'000'000'000;

bool has_media(const llama_tokens& prompt) {
  return std::find(prompt.begin(), prompt.end(), LLAMA_TOKEN_NULL) != prompt.end();
}

double ms_since(uint64_t t0) { return static_cast<double>(now_ns() - t0) * 1e-6; }

// One token decoded into sequence 0 of an empty context: the blob the probe inspects.
Status decode_probe_token(llama_context* ctx) {
  llama_batch b = llama_batch_init(1, 0, 1);
  b.n_tokens = 1;
  b.token[0] = 0;
  b.pos[0] = 0;
  b.n_seq_id[0] = 1;
  b.seq_id[0][0] = 0;
  b.logits[0] = true;
  const int rc = llama_decode(ctx, b);
  llama_batch_free(b);
  return rc == 0 ? OkStatus() : Status(Code::kInternal, "llama_decode of the probe token failed");
}

uint32_t read_u32(const std::vector<uint8_t>& blob, size_t at) {
  uint32_t v = 0;
  if (blob.size() >= at + 4) std::memcpy(&v, blob.data() + at, 4);
  return v;
}

}  // namespace

KdnPromptCache::~KdnPromptCache() {
  const PromptCacheCounters& c = counters_;
  if (c.loads + c.chunks_stored + c.skipped_media + c.skipped_lora + c.skipped_server + c.unavailable + c.failures == 0)
    return;
  // stderr, not llama.cpp's log: this runs while the process exits.
  std::fprintf(stderr,
               "kdn: %llu requests loaded %llu tokens from kdnd; %llu chunks stored; requests without kdn: "
               "%llu media, %llu LoRA, %llu server-wide, %llu kdnd unreachable; %llu failures\n",
               (unsigned long long)c.loads, (unsigned long long)c.tokens_loaded, (unsigned long long)c.chunks_stored,
               (unsigned long long)c.skipped_media, (unsigned long long)c.skipped_lora,
               (unsigned long long)c.skipped_server, (unsigned long long)c.unavailable, (unsigned long long)c.failures);
}

void KdnPromptCache::attach(llama_context* ctx, const common_params& params, bool speculative) {
  cache_.reset();
  last_connect_ns_ = 0;
  if (!opts_->enabled)
    support_ = Status(Code::kUnsupported, "turned off (--no-kdn)");
  else if (speculative)
    support_ =
        Status(Code::kUnsupported, "a speculative decoder runs beside the model (its context would not get the KV)");
  else
    support_ = probe(ctx, params.model.path);
  if (!support_.ok()) {
    LOG_WRN("kdn: the node-wide prompt cache is off for this server: %s\n", support_.what());
    return;
  }
  LOG_INF("kdn: node-wide prompt cache on: chunks of %u tokens, kdnd at %s, namespace %s\n", geometry_.chunk_tokens,
          opts_->socket.empty() ? "libkdn's default socket" : opts_->socket.c_str(),
          opts_->name_space.empty() ? "default" : opts_->name_space.c_str());
  (void)connection();
}

// Checks, on one real token, that this context writes exactly the blob state_blob.h converts
// and restores it bit for bit (kv_restore.h's check_state_round_trip, as kdn-llama's engine
// does); anything else keeps kdn off rather than risk a bad load. The context is emptied again
// afterwards.
Status KdnPromptCache::probe(llama_context* ctx, const std::string& model_path) noexcept {
  const llama_model* model = llama_get_model(ctx);
  if (llama_model_n_swa(model) > 0) return Status(Code::kUnsupported, "the model uses sliding-window attention");
  if (llama_model_is_recurrent(model) || llama_model_is_hybrid(model))
    return Status(Code::kUnsupported, "the model keeps recurrent state");
  llama_memory_t mem = llama_get_memory(ctx);
  if (mem == nullptr) return Status(Code::kUnsupported, "the context has no KV memory");
  if (llama_memory_seq_pos_max(mem, 0) != -1) return Status(Code::kInternal, "the KV cache is not empty at start");
  EngineOptions eo;
  eo.model_path = model_path;
  eo.chunk_tokens = kChunkTokens;
  Result<EngineIdentity> id = make_identity(model, eo);
  if (!id.ok()) return id.status();
  KDN_RETURN_IF_ERROR(decode_probe_token(ctx));
  // The blob's header says how this context lays out V and how many streams it has; the
  // fingerprint follows the V layout, the conversion both.
  Status st;
  std::vector<uint8_t> blob;
  try {
    blob.resize(llama_state_seq_get_size(ctx, 0));
  } catch (const std::bad_alloc&) {
    st = Status(Code::kNoMemory, "no memory for the probe blob");
  }
  if (st.ok() && llama_state_seq_get_data(ctx, blob.data(), blob.size(), 0) != blob.size())
    st = Status(Code::kUnsupported, "llama.cpp did not write its state blob");
  // magic, seq_id, n_stream, stream 0's cell count, one cell {pos, n_seq_id, seq_id}, v_trans
  KvGeometry g{};
  if (st.ok() && read_u32(blob, 28) != 0) {
    eo.flash_attn = false;
    id = make_identity(model, eo);
  }
  if (st.ok() && !id.ok()) st = id.status();
  if (st.ok()) {
    g = id->geometry;
    g.n_stream = read_u32(blob, 8);
    st = g.n_stream == 0 ? Status(Code::kUnsupported, "llama.cpp state blob has no stream")
                         : check_state_round_trip(ctx, 0, g);
  }
  if (st.ok()) {
    identity_ = std::move(id.value());
    geometry_ = g;
  }
  llama_memory_clear(mem, true);
  return st;
}

bool KdnPromptCache::admits(const llama_tokens& prompt, bool lora) noexcept {
  if (!support_.ok()) {
    ++counters_.skipped_server;
    return false;
  }
  if (has_media(prompt)) {
    ++counters_.skipped_media;
    if (!logged_media_)
      LOG_WRN("kdn: prompts with media skip kdn: their media positions have no tokens to key them by (counted)\n");
    logged_media_ = true;
    return false;
  }
  if (lora) {
    ++counters_.skipped_lora;
    if (!logged_lora_)
      LOG_WRN("kdn: requests with a LoRA adapter enabled skip kdn: their KV is another model's (counted)\n");
    logged_lora_ = true;
    return false;
  }
  return true;
}

ChunkCache* KdnPromptCache::connection() noexcept {
  if (cache_) return cache_.get();
  const uint64_t now = now_ns();
  if (last_connect_ns_ != 0 && now - last_connect_ns_ < kRetryNs) return nullptr;
  last_connect_ns_ = now;
  auto c = KdnChunkCache::connect(identity_.desc, opts_->socket, opts_->name_space, !opts_->name_space.empty(),
                                  opts_->token);
  if (!c.ok()) {
    if (!away_) LOG_WRN("kdn: cannot reach kdnd (%s): prefilling, retrying at most once a second\n", c.status().what());
    away_ = true;
    return nullptr;
  }
  LOG_INF("kdn: connected to kdnd\n");
  away_ = false;
  cache_ = std::move(c.value());
  return cache_.get();
}

void KdnPromptCache::note(const Status& st, const char* what) noexcept {
  if (st.code() == Code::kUnavailable) {
    ++counters_.unavailable;
    if (!away_) LOG_WRN("kdn: kdnd went away (%s): prefilling until libkdn reconnects\n", what);
    away_ = true;
    return;
  }
  if (!st.ok()) {
    ++counters_.failures;
    LOG_WRN("kdn: %s failed: %s\n", what, st.what());
  }
  if (away_) LOG_INF("kdn: kdnd is back\n");
  away_ = false;
}

Status KdnPromptCache::restore(llama_context* ctx, llama_seq_id seq, const ChunkLease& lease, uint32_t n) noexcept {
  std::vector<std::span<const uint8_t>> chunks;
  try {
    chunks.resize(n);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "no memory for the chunk list");
  }
  for (uint32_t i = 0; i < n; ++i) chunks[i] = lease.chunk(i);
  Status st = pieces_.describe(geometry_, chunks, 0);
  // Like set_data, the restore replaces whatever the slot's sequence held.
  if (st.ok()) st = restore_seq_pieces(ctx, seq, geometry_.type, pieces_.pieces());
  llama_memory_t mem = llama_get_memory(ctx);
  const llama_pos last = static_cast<llama_pos>(uint64_t{n} * geometry_.chunk_tokens - 1);
  if (st.ok() && (llama_memory_seq_pos_min(mem, seq) != 0 || llama_memory_seq_pos_max(mem, seq) != last))
    st = Status(Code::kCorrupt, "restored cells are not the chunks' positions");
  if (!st.ok()) llama_memory_seq_rm(mem, seq, -1, -1);  // all or nothing
  return st;
}

int32_t KdnPromptCache::load(llama_context* ctx, llama_seq_id seq, const llama_tokens& prompt, int32_t n_past,
                             bool lora) {
  if (prompt.empty() || !admits(prompt, lora)) return n_past;
  const uint32_t t = geometry_.chunk_tokens;
  // The last prompt token is always computed: its logits choose the first new token.
  const uint32_t max_chunks = static_cast<uint32_t>((prompt.size() - 1) / t);
  if (uint64_t{max_chunks} * t <= static_cast<uint64_t>(std::max(n_past, 0))) return n_past;
  ChunkCache* c = connection();
  if (c == nullptr) {
    ++counters_.unavailable;
    return n_past;
  }
  const uint64_t t0 = now_ns();
  Result<std::unique_ptr<ChunkLease>> lease = c->retrieve({prompt.data(), prompt.size()}, max_chunks);
  note(lease.status(), "lease");
  if (!lease.ok()) return n_past;
  const uint32_t n = std::min((*lease)->chunks(), max_chunks);
  if (uint64_t{n} * t <= static_cast<uint64_t>(std::max(n_past, 0))) return n_past;
  const Status st = restore(ctx, seq, **lease, n);
  if (!st.ok()) {
    ++counters_.failures;
    LOG_WRN("kdn: slot %d: %u cached chunks not loaded (%s): prefilling the prompt\n", seq, n, st.what());
    return 0;
  }
  ++counters_.loads;
  counters_.tokens_loaded += uint64_t{n} * t;
  LOG_INF("kdn: slot %d: %u of %zu prompt tokens loaded from kdnd (%u chunks) in %.2f ms\n", seq, n * t, prompt.size(),
          n, ms_since(t0));
  return static_cast<int32_t>(n * t);
}

void KdnPromptCache::store(llama_context* ctx, llama_seq_id seq, const llama_tokens& prompt, bool lora) {
  // Refused requests were counted by load().
  if (!support_.ok() || lora || has_media(prompt) || prompt.size() < geometry_.chunk_tokens) return;
  ChunkCache* c = connection();
  if (c == nullptr) return;
  const uint64_t t0 = now_ns();
  Result<uint32_t> stored = store_chunks(ctx, seq, {prompt.data(), prompt.size()});
  note(stored.status(), "store");
  if (!stored.ok() || *stored == 0) return;
  counters_.chunks_stored += *stored;
  LOG_INF("kdn: slot %d: %u chunks stored in kdnd in %.2f ms\n", seq, *stored, ms_since(t0));
}

// Reserves the prompt's whole chunks (kdnd hands out slots only for those it lacks) and fills
// the slots from the sequence's blob, read once and only if some slot wants it.
Result<uint32_t> KdnPromptCache::store_chunks(llama_context* ctx, llama_seq_id seq,
                                              std::span<const int32_t> tokens) noexcept {
  const KvGeometry& g = geometry_;
  const uint32_t total = static_cast<uint32_t>(tokens.size() / g.chunk_tokens);
  const uint32_t batch = std::max<uint32_t>(1, cache_->max_reserve_chunks());
  Result<SeqBlobView> view = Status(Code::kNotFound, "not read yet");
  uint32_t stored = 0;
  for (uint32_t first = 0; first < total;) {
    const uint32_t n = std::min(batch, total - first);
    Result<std::unique_ptr<ChunkReservation>> res = cache_->reserve(tokens, first, n);
    if (!res.ok()) return res.status();
    ChunkReservation& r = *res.value();
    for (uint32_t i = 0; i < r.chunks(); ++i) {
      const std::span<uint8_t> slot = r.slot(i);
      if (slot.empty()) continue;
      if (!view.ok()) view = read_sequence(ctx, seq, tokens.size());
      if (!view.ok()) return view.status();  // the reservation's destructor aborts it
      KDN_RETURN_IF_ERROR(blob_chunk_to_canonical(g, view.value(), first + i, slot));
      ++stored;
    }
    KDN_RETURN_IF_ERROR(r.commit());
    first += n;
  }
  return stored;
}

Result<SeqBlobView> KdnPromptCache::read_sequence(llama_context* ctx, llama_seq_id seq, size_t n_tokens) noexcept {
  const uint64_t size = llama_state_seq_get_size(ctx, seq);
  if (size != seq_blob_bytes(geometry_, n_tokens))
    return Status(Code::kInternal, "the slot's sequence does not hold exactly the prompt");
  try {
    blob_.resize(size);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "no memory for the sequence blob");
  }
  if (llama_state_seq_get_data(ctx, blob_.data(), size, seq) != size)
    return Status(Code::kInternal, "llama.cpp did not write the sequence blob");
  Result<SeqBlobView> view = parse_seq_blob(geometry_, blob_);
  if (view.ok() && (view->first_pos != 0 || view->n_cells != n_tokens))
    return Status(Code::kInternal, "the slot's cells are not the prompt's positions");
  return view;
}

}  // namespace kdn::llama
