#include <kdn/llama/engine.h>

#include "engine_identity.h"
#include "engine_internal.h"
#include "eval_hooks.h"
#include "kv_cells.h"
#include "kv_restore.h"
#include "overlapped_load.h"

#include <llama.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <new>
#include <string>
#include <thread>

namespace kdn::llama {
namespace {

static_assert(static_cast<int>(KvType::kF16) == GGML_TYPE_F16);
static_assert(static_cast<int>(KvType::kF32) == GGML_TYPE_F32);
static_assert(static_cast<int>(KvType::kBF16) == GGML_TYPE_BF16);

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}
void verbose_log(ggml_log_level, const char* text, void*) { std::fputs(text, stderr); }

void init_backend_once() {
  static std::once_flag once;
  std::call_once(once, [] { llama_backend_init(); });
}

}  // namespace

const char* default_model_path() noexcept { return KDN_LLAMA_DEFAULT_MODEL; }

Result<std::string> f16_weights_model(const std::string& model_path) noexcept {
  try {
    const std::filesystem::path in(model_path);
    std::filesystem::path out = in;
    out.replace_extension(".f16.gguf");
    std::error_code ec;
    if (std::filesystem::exists(out, ec)) return out.string();
    if (!std::filesystem::exists(in, ec)) return Status(Code::kNotFound, "model file not found");
    init_backend_once();
    llama_log_set(quiet_log, nullptr);
    llama_model_quantize_params p = llama_model_quantize_default_params();
    p.ftype = LLAMA_FTYPE_MOSTLY_F16;
    p.allow_requantize = true;  // quantized tensors are dequantized, then stored as f16
    // A temporary of this process's own: processes that need the copy at the same time each
    // write theirs, and each rename puts a whole, identical file in place.
    const std::filesystem::path tmp = out.string() + ".tmp." + std::to_string(getpid());
    if (llama_model_quantize(in.c_str(), tmp.c_str(), &p) != 0) {
      std::filesystem::remove(tmp, ec);
      return Status(Code::kIo, "llama.cpp could not write the f16 model");
    }
    std::filesystem::rename(tmp, out);  // whole or absent: a concurrent reader never sees half
    return out.string();
  } catch (const std::exception&) {
    return Status(Code::kIo, "could not write the f16 model next to the model file");
  }
}

Result<std::unique_ptr<Engine>> Engine::open(const EngineOptions& opts) noexcept {
  std::unique_ptr<Engine> e(new (std::nothrow) Engine());
  if (!e) return Status(Code::kNoMemory, "engine allocation failed");
  KDN_RETURN_IF_ERROR(e->init(opts));
  return e;
}

Engine::~Engine() {
  if (overlap_) (void)overlap_->finish();  // its worker writes into the context's cache
  if (ctx_) llama_free(ctx_);
  if (model_) llama_model_free(model_);
}

Status Engine::init(const EngineOptions& opts) noexcept {
  opts_ = opts;
  if (opts.chunk_tokens == 0 || opts.n_ctx < opts.chunk_tokens)
    return Status(Code::kInvalidArgument, "n_ctx must hold at least one chunk");
  llama_log_set(opts.verbose ? verbose_log : quiet_log, nullptr);
  init_backend_once();

  llama_model_params mp = llama_model_default_params();
  model_ = llama_model_load_from_file(opts.model_path.c_str(), mp);
  if (!model_) return Status(Code::kIo, "llama.cpp could not load the model file");

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = opts.n_ctx;
  cp.n_batch = opts.chunk_tokens;  // one chunk per llama_decode, one ubatch per chunk
  cp.n_ubatch = opts.chunk_tokens;
  cp.n_seq_max = kSeqMax;  // the request's sequence and the scratch
  cp.kv_unified = true;    // so seq_cp to the scratch sequence copies no data
  cp.flash_attn_type = opts.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.type_k = GGML_TYPE_F16;
  cp.type_v = GGML_TYPE_F16;
  const int32_t cores = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  const int32_t threads = opts.n_threads > 0 ? opts.n_threads : cores;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.no_perf = true;
  // A transposed V passes through a buffer the next chunk's describe() reuses, so only V rows
  // (flash attention) can be left for the worker to copy from the chunks themselves.
  if (opts.flash_attn &&
      (opts.load_overlap == LoadOverlap::kOn || (opts.load_overlap == LoadOverlap::kAuto && threads < cores))) {
    overlap_.reset(new (std::nothrow) OverlappedLoad());
    if (!overlap_) return Status(Code::kNoMemory, "engine allocation failed");
    overlap_->set_test_delay_us(opts.overlap_test_delay_us);
  }
  // One eval callback for everything that needs it (eval_hooks.h); with nothing armed or
  // pending it answers at once and the graph is computed as one range.
  hooks_.reset(new (std::nothrow) EvalHooks());
  if (!hooks_) return Status(Code::kNoMemory, "engine allocation failed");
  hooks_->set_overlap(overlap_.get());
  cp.cb_eval = &EvalHooks::callback;
  cp.cb_eval_user_data = hooks_.get();
  ctx_ = llama_init_from_model(model_, cp);
  if (!ctx_) return Status(Code::kInternal, "llama.cpp could not create a context");

  Result<EngineIdentity> id = make_identity(model_, opts);
  if (!id.ok()) {
    cache_support_ = id.status();
    return OkStatus();
  }
  identity_ = std::move(id.value());
  Result<ModelInfo> info = ModelInfo::from_desc(identity_.desc);
  if (!info.ok()) {
    cache_support_ = info.status();
    return OkStatus();
  }
  model_info_ = info.value();
  cache_support_ = probe_state_format();
  // A load's buffers, allocated now rather than in the first request's load: for the whole
  // context with V rows (loaded as one blob), for one chunk with V transposed (chunk by chunk).
  if (!cache_support_.ok()) return OkStatus();
  const KvGeometry& g = identity_.geometry;
  // The cache tensors, for blending (segments are scattered straight into them).
  KvTensors kv;
  blend_support_ = kv_tensors(ctx_, g.n_layer, &kv);
  kv_k_ = std::move(kv.k);
  kv_v_ = std::move(kv.v);
  kv_cells_ = kv.cells;
  try {
    layout_k_.assign(g.n_layer, nullptr);
    layout_v_.assign(g.n_layer, nullptr);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "engine allocation failed");
  }
  return pieces_.reserve(g, g.v_trans ? 1 : std::max<uint64_t>(1, opts.n_ctx / g.chunk_tokens));
}

Status Engine::size_blob(uint64_t bytes) noexcept {
  try {
    blob_.resize(bytes);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "no memory for the KV blob");
  }
  return OkStatus();
}

// One real token decoded, then kv_restore.h's check: without it the engine runs uncached.
Status Engine::probe_state_format() noexcept {
  reset();
  KDN_RETURN_IF_ERROR(decode_one(0, 0));
  const Status st = check_state_round_trip(ctx_, kSeq, identity_.geometry);
  reset();
  return st;
}

uint32_t Engine::context_size() const noexcept { return llama_n_ctx(ctx_); }

uint32_t Engine::n_vocab() const noexcept {
  return static_cast<uint32_t>(llama_vocab_n_tokens(llama_model_get_vocab(model_)));
}

void Engine::reset() noexcept {
  if (overlap_) (void)overlap_->finish();  // nothing may still be writing into the cache
  llama_memory_clear(llama_get_memory(ctx_), true);
  last_logits_index_ = -1;
}

uint32_t Engine::sequence_length() const noexcept {
  const llama_pos p = llama_memory_seq_pos_max(llama_get_memory(ctx_), kSeq);
  return p < 0 ? 0 : static_cast<uint32_t>(p) + 1;
}

Status Engine::decode_one(int32_t token, uint32_t pos) noexcept {
  Batch batch(1);
  batch.add(token, pos, true);
  if (llama_decode(ctx_, batch.get()) != 0) return Status(Code::kInternal, "llama_decode failed");
  last_logits_index_ = 0;
  return OkStatus();
}

Status Engine::prefill(std::span<const int32_t> tokens, uint32_t first_pos, const LogitsSink& sink) noexcept {
  if (!sink) return prefill_seq(tokens, first_pos, kSeq, true);
  const uint32_t t = opts_.chunk_tokens;
  if (uint64_t{first_pos} + tokens.size() > llama_n_ctx(ctx_))
    return Status(Code::kInvalidArgument, "prompt does not fit in the context");
  Batch batch(t);
  const uint32_t vocab = n_vocab();
  for (size_t done = 0; done < tokens.size();) {
    // Batches end on chunk boundaries, so a suffix after a hit is split like a miss.
    const uint32_t pos = first_pos + static_cast<uint32_t>(done);
    const size_t n = std::min<size_t>(tokens.size() - done, t - pos % t);
    batch.clear();
    for (size_t i = 0; i < n; ++i) batch.add(tokens[done + i], pos + static_cast<uint32_t>(i), true);
    if (llama_decode(ctx_, batch.get()) != 0) return Status(Code::kInternal, "llama_decode failed");
    last_logits_index_ = static_cast<int32_t>(n) - 1;
    for (size_t i = 0; i < n; ++i)
      sink(static_cast<uint32_t>(done + i), {llama_get_logits_ith(ctx_, static_cast<int32_t>(i)), vocab});
    done += n;
    if (opts_.on_prefill_batch) opts_.on_prefill_batch(done, tokens.size());
  }
  return OkStatus();
}

Status Engine::prefill_seq(std::span<const int32_t> tokens, uint32_t first_pos, int32_t seq,
                           bool logits_last) noexcept {
  const uint32_t t = opts_.chunk_tokens;
  if (uint64_t{first_pos} + tokens.size() > llama_n_ctx(ctx_))
    return Status(Code::kInvalidArgument, "prompt does not fit in the context");
  Batch batch(t);
  for (size_t done = 0; done < tokens.size();) {
    // Batches end on chunk boundaries, so a suffix after a hit is split like a miss.
    const uint32_t pos = first_pos + static_cast<uint32_t>(done);
    const size_t n = std::min<size_t>(tokens.size() - done, t - pos % t);
    batch.clear();
    for (size_t i = 0; i < n; ++i)
      batch.add(tokens[done + i], pos + static_cast<uint32_t>(i), logits_last && done + i + 1 == tokens.size(), seq);
    if (llama_decode(ctx_, batch.get()) != 0) return Status(Code::kInternal, "llama_decode failed");
    last_logits_index_ = logits_last ? static_cast<int32_t>(n) - 1 : -1;
    done += n;
    if (opts_.on_prefill_batch) opts_.on_prefill_batch(done, tokens.size());
  }
  return OkStatus();
}

std::span<const float> Engine::last_logits() const noexcept {
  if (last_logits_index_ < 0) return {};
  return {llama_get_logits_ith(ctx_, last_logits_index_), n_vocab()};
}

// The chunks are described as a blob whose KV pieces point into the chunks themselves and
// restored through llama.cpp's own state reader, which pulls each KV range straight from the
// chunk into the cache tensor, checked finite on the way. With V rows that is one blob for all
// chunks, restored into the request's sequence; with V transposed it is chunk by chunk, each
// restored into the scratch sequence and handed over with seq_cp (a unified cache moves no
// data). Cells are taken in order from an empty cache, so they land where a fresh prefill
// puts them. With `deferred` the cells are placed the same way and the KV ranges are gathered
// there for OverlappedLoad.
Status Engine::load_chunks(std::span<const std::span<const uint8_t>> chunks) noexcept {
  return load_chunks_into(chunks, nullptr);
}

Status Engine::load_chunks_into(std::span<const std::span<const uint8_t>> chunks,
                                std::vector<KvCopy>* deferred) noexcept {
  const KvGeometry& g = identity_.geometry;
  llama_memory_t mem = llama_get_memory(ctx_);
  if (!cache_support_.ok()) return cache_support_;
  if (llama_memory_seq_pos_max(mem, kSeq) != -1 || llama_memory_seq_pos_max(mem, kScratch) != -1)
    return Status(Code::kInvalidArgument, "chunks load only into an empty sequence");
  const uint64_t cells = uint64_t{chunks.size()} * g.chunk_tokens;
  if (cells == 0 || cells > llama_n_ctx(ctx_))
    return Status(Code::kInvalidArgument, "chunks do not fit in the context");
  Status st;
  if (!g.v_trans) {
    // V rows: every piece but the small fields points into the chunks, so all of them go in
    // as one blob, straight into the request's sequence (one cell placement, as set_data).
    st = pieces_.describe(g, chunks, 0);
    if (st.ok()) st = restore_seq_pieces(ctx_, kSeq, g.type, pieces_.pieces(), deferred);
  } else {
    // A transposed V is staged in a buffer: one chunk at a time bounds it.
    for (size_t i = 0; i < chunks.size() && st.ok(); ++i) {
      st = pieces_.describe(g, chunks.subspan(i, 1), static_cast<int32_t>(uint64_t{i} * g.chunk_tokens));
      if (!st.ok()) break;
      st = restore_seq_pieces(ctx_, kScratch, g.type, pieces_.pieces(), deferred);
      if (st.ok()) llama_memory_seq_cp(mem, kScratch, kSeq, -1, -1);
      llama_memory_seq_rm(mem, kScratch, -1, -1);
    }
  }
  if (st.ok() && (llama_memory_seq_pos_min(mem, kSeq) != 0 ||
                  llama_memory_seq_pos_max(mem, kSeq) != static_cast<llama_pos>(cells - 1)))
    st = Status(Code::kCorrupt, "restored cells are not the chunks' positions");
  // All or nothing: a chunk that fails takes the ones before it out again.
  if (!st.ok()) {
    llama_memory_seq_rm(mem, kSeq, -1, -1);
    if (deferred != nullptr) deferred->clear();
  }
  return st;
}

Status Engine::extract_chunks(uint32_t first, std::span<const std::span<uint8_t>> out) noexcept {
  const KvGeometry& g = identity_.geometry;
  if (!cache_support_.ok()) return cache_support_;
  const uint64_t p0 = uint64_t{first} * g.chunk_tokens;
  const uint64_t cells = uint64_t{out.size()} * g.chunk_tokens;
  if (cells == 0 || p0 + cells > sequence_length())
    return Status(Code::kInvalidArgument, "chunks beyond the prefilled sequence");
  llama_memory_t mem = llama_get_memory(ctx_);
  llama_memory_seq_rm(mem, kScratch, -1, -1);
  llama_memory_seq_cp(mem, kSeq, kScratch, static_cast<llama_pos>(p0), static_cast<llama_pos>(p0 + cells));
  const size_t size = llama_state_seq_get_size(ctx_, kScratch);
  Status st = size == seq_blob_bytes(g, cells) ? size_blob(size)
                                               : Status(Code::kInternal, "scratch sequence has an unexpected size");
  if (st.ok() && llama_state_seq_get_data(ctx_, blob_.data(), size, kScratch) != size)
    st = Status(Code::kInternal, "llama.cpp did not write the KV blob");
  llama_memory_seq_rm(mem, kScratch, -1, -1);
  KDN_RETURN_IF_ERROR(st);
  Result<SeqBlobView> view = parse_seq_blob(g, {blob_.data(), size});
  if (!view.ok()) return view.status();
  if (view->first_pos != static_cast<int32_t>(p0) || view->n_cells != cells)
    return Status(Code::kInternal, "extracted cells are not the requested range");
  for (size_t i = 0; i < out.size(); ++i)
    if (!out[i].empty())
      KDN_RETURN_IF_ERROR(blob_chunk_to_canonical(g, view.value(), static_cast<uint32_t>(i), out[i]));
  return OkStatus();
}

}  // namespace kdn::llama
