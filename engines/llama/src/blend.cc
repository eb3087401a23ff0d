// Engine: RAG prompts blended from cached segments (docs/blend.md).
//
// A blended prefill, in order:
//   1. look up every segment (one round trip);
//   2. prefill the segments that are not cached whole right after the head, in the scratch
//      sequence, and store them (their first use);
//   3. place the prompt's cells [0, E) (head and segments): a decode whose graph stops after
//      its first node, or, for hkvd, after the check layer's K and V (the check pass: those
//      layers are then a full prefill's);
//   4. load every segment into its cells, K re-rotated to its position (kdn's fused RoPE
//      scatter into the cache tensors); hkvd sends the check layers' cached rows to a scratch
//      buffer instead, keeping the fresh ones; every loaded element is checked finite;
//   5. select the tokens to recompute (the policy);
//   6. recompute the head, the selected tokens and the question through every layer, in place:
//      their cells are removed and they are decoded at their own positions (the llama.cpp patch
//      lets a batch fill gaps below a sequence's last position), in position order, in batches
//      that end on chunk boundaries as a prefill's do.
#include <kdn/llama/engine.h>

#include <kdn/common/clock.h>
#include <kdn/kernels/blend.h>
#include <kdn/kernels/executor.h>

#include "engine_internal.h"
#include "eval_hooks.h"
#include "kv_cells.h"
#include "overlapped_load.h"

#include <llama.h>

#include <algorithm>
#include <cstring>
#include <numeric>

namespace kdn::llama {
namespace {

double seconds_between(uint64_t t0, uint64_t t1) { return static_cast<double>(t1 - t0) * 1e-9; }

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Status invalid(const char* what) { return Status(Code::kInvalidArgument, what); }

// Undoes what a blend step switched on, on every path out of it.
class BlendGuard {
 public:
  BlendGuard(llama_context* ctx, EvalHooks* hooks) noexcept : ctx_(ctx), hooks_(hooks) {}
  ~BlendGuard() {
    hooks_->disarm();
    llama_set_batch_pos_gaps(ctx_, false);
  }
  BlendGuard(const BlendGuard&) = delete;
  BlendGuard& operator=(const BlendGuard&) = delete;

 private:
  llama_context* ctx_;
  EvalHooks* hooks_;
};

// Removes the cells of `positions` (ascending) from seq, one call per run of neighbours.
void remove_positions(llama_memory_t mem, std::span<const uint32_t> positions) {
  for (size_t i = 0; i < positions.size();) {
    size_t j = i + 1;
    while (j < positions.size() && positions[j] == positions[j - 1] + 1) ++j;
    llama_memory_seq_rm(mem, kSeq, static_cast<llama_pos>(positions[i]), static_cast<llama_pos>(positions[j - 1] + 1));
    i = j;
  }
}

}  // namespace

std::string_view blend_policy_name(BlendPolicy p) noexcept {
  switch (p) {
    case BlendPolicy::kNone:
      return "none";
    case BlendPolicy::kHkvd:
      return "hkvd";
    case BlendPolicy::kBoundary:
      return "boundary";
    case BlendPolicy::kAll:
      return "all";
  }
  return "unknown";
}

std::string_view blend_deviation_name(BlendDeviation d) noexcept {
  switch (d) {
    case BlendDeviation::kK:
      return "k";
    case BlendDeviation::kV:
      return "v";
    case BlendDeviation::kKV:
      return "kv";
  }
  return "unknown";
}

bool parse_blend_deviation(std::string_view name, BlendDeviation* out) noexcept {
  for (BlendDeviation d : {BlendDeviation::kK, BlendDeviation::kV, BlendDeviation::kKV})
    if (blend_deviation_name(d) == name) {
      *out = d;
      return true;
    }
  return false;
}

bool parse_blend_policy(std::string_view name, BlendPolicy* out) noexcept {
  for (BlendPolicy p : {BlendPolicy::kNone, BlendPolicy::kHkvd, BlendPolicy::kBoundary, BlendPolicy::kAll})
    if (blend_policy_name(p) == name) {
      *out = p;
      return true;
    }
  return false;
}

uint64_t RagPrompt::size() const noexcept {
  uint64_t n = head.size() + tail.size();
  for (const auto& s : segments) n += s.size();
  return n;
}

std::vector<int32_t> RagPrompt::tokens() const {
  std::vector<int32_t> t;
  t.reserve(size());
  t.insert(t.end(), head.begin(), head.end());
  for (const auto& s : segments) t.insert(t.end(), s.begin(), s.end());
  t.insert(t.end(), tail.begin(), tail.end());
  return t;
}

uint64_t RagPrompt::segment_pos(size_t i) const noexcept {
  uint64_t p = head.size();
  for (size_t j = 0; j < i && j < segments.size(); ++j) p += segments[j].size();
  return p;
}

uint32_t Engine::partial_decodes() const noexcept { return hooks_ ? hooks_->stops() : 0; }

Status Engine::perturb_kv_ulp(uint32_t first_pos, uint32_t n) noexcept {
  if (!blend_support_.ok()) return blend_support_;
  KDN_RETURN_IF_ERROR(seq_cells(ctx_, kSeq, first_pos + n, &cells_));
  const KvGeometry& g = identity_.geometry;
  if (g.elem_bytes() != 2) return Status(Code::kUnsupported, "the control perturbs 16-bit KV");
  const uint64_t width = uint64_t{g.n_kv_heads} * g.head_dim;
  uint64_t state = 0x9E3779B97F4A7C15ull;
  const auto coin = [&] {  // xorshift64: a fixed sequence, the same every run
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (state & 1) != 0;
  };
  for (uint32_t l = 0; l < g.n_layer; ++l)
    for (uint32_t t = first_pos; t < first_pos + n; ++t) {
      const uint64_t cell = static_cast<uint64_t>(cells_[t]);
      auto* k = reinterpret_cast<uint16_t*>(kv_k_[l]) + cell * width;
      for (uint64_t c = 0; c < width; ++c)
        if (coin()) k[c] ^= 1;
      for (uint64_t c = 0; c < width; ++c) {
        uint16_t* v = reinterpret_cast<uint16_t*>(kv_v_[l]) + (g.v_trans ? c * kv_cells_ + cell : cell * width + c);
        if (coin()) *v ^= 1;
      }
    }
  return OkStatus();
}

Result<RagPrompt> Engine::rag_prompt(std::span<const std::string> documents, std::string_view question) const {
  if (documents.empty()) return invalid("a RAG prompt needs at least one document");
  try {
    std::string docs;
    for (const std::string& d : documents) docs += d + "\n\n";
    const std::string message = docs + std::string(question);
    const char* tmpl = llama_model_chat_template(model_, nullptr);
    const llama_chat_message msg{"user", message.c_str()};
    std::string chat(message.size() + 256, '\0');
    int32_t n = llama_chat_apply_template(tmpl, &msg, 1, true, chat.data(), static_cast<int32_t>(chat.size()));
    if (n > static_cast<int32_t>(chat.size())) {
      chat.resize(static_cast<size_t>(n));
      n = llama_chat_apply_template(tmpl, &msg, 1, true, chat.data(), n);
    }
    if (n < 0) return Status(Code::kUnsupported, "the model's chat template is not supported");
    chat.resize(static_cast<size_t>(n));
    const size_t at = chat.find(message);
    if (at == std::string::npos) return Status(Code::kUnsupported, "chat template rewrites the message");
    // Every part is tokenized alone, so a document's tokens never depend on its neighbours.
    RagPrompt p;
    const bool add_bos = llama_vocab_get_add_bos(llama_model_get_vocab(model_));
    Result<std::vector<int32_t>> head = tokenize(std::string_view(chat).substr(0, at), add_bos, true);
    Result<std::vector<int32_t>> tail = tokenize(std::string_view(chat).substr(at + docs.size()), false, true);
    if (!head.ok() || !tail.ok()) return Status(Code::kInternal, "tokenization failed");
    p.head = std::move(head.value());
    p.tail = std::move(tail.value());
    for (const std::string& d : documents) {
      Result<std::vector<int32_t>> seg = tokenize(d + "\n\n", false, false);
      if (!seg.ok()) return seg.status();
      p.segments.push_back(std::move(seg.value()));
    }
    return p;
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "building the RAG prompt");
  }
}

kdn_engine_layout Engine::cache_layout(const int64_t* slots, uint32_t scratch_layers) noexcept {
  const KvGeometry& g = identity_.geometry;
  const int64_t row = int64_t{g.n_kv_heads} * g.head_dim;
  for (uint32_t l = 0; l < g.n_layer; ++l) {
    layout_k_[l] = l < scratch_layers ? scratch_[2 * l].data() : kv_k_[l];
    layout_v_[l] = l < scratch_layers ? scratch_[2 * l + 1].data() : kv_v_[l];
  }
  kdn_engine_layout L{};
  L.struct_size = sizeof L;
  L.engine_dtype = KDN_DTYPE_F16;
  L.layer_base = layout_k_.data();
  L.stride_block = row;
  L.stride_offset = row;
  L.stride_head = g.head_dim;
  L.stride_dim = 1;
  L.block_size = 1;
  L.slot_mapping = slots;
  L.v_layer_base = layout_v_.data();
  if (!g.v_trans) {  // V rows like K
    L.v_stride_block = row;
    L.v_stride_offset = row;
    L.v_stride_head = g.head_dim;
    L.v_stride_dim = 1;
  } else {  // V transposed: element (cell, channel c) at c * cells + cell
    L.v_stride_block = 1;
    L.v_stride_offset = 1;
    L.v_stride_head = int64_t{g.head_dim} * kv_cells_;
    L.v_stride_dim = kv_cells_;
  }
  return L;
}

// Every K and V element the segments put into cells (in the cache, and in the scratch rows of
// the check layers) must be finite: a corrupted segment is never computed on.
Status Engine::check_loaded_finite(std::span<const int64_t> cells, uint32_t scratch_layers) const noexcept {
  const KvGeometry& g = identity_.geometry;
  const uint64_t row = g.row_bytes(), elem = g.elem_bytes();
  for (uint32_t l = 0; l < g.n_layer; ++l) {
    const uint8_t* k = l < scratch_layers ? scratch_[2 * l].data() : kv_k_[l];
    const uint8_t* v = l < scratch_layers ? scratch_[2 * l + 1].data() : kv_v_[l];
    for (size_t i = 0; i < cells.size();) {  // runs of neighbouring cells: one check each
      size_t j = i + 1;
      while (j < cells.size() && cells[j] == cells[j - 1] + 1) ++j;
      const uint64_t c0 = uint64_t(cells[i]), n = j - i;
      if (!copy_finite(g.type, nullptr, k + c0 * row, n * row))
        return Status(Code::kCorrupt, "a segment holds a non-finite value");
      if (!g.v_trans) {
        if (!copy_finite(g.type, nullptr, v + c0 * row, n * row))
          return Status(Code::kCorrupt, "a segment holds a non-finite value");
      } else {
        for (uint64_t ch = 0; ch < row / elem; ++ch)
          if (!copy_finite(g.type, nullptr, v + (ch * kv_cells_ + c0) * elem, n * elem))
            return Status(Code::kCorrupt, "a segment holds a non-finite value");
      }
      i = j;
    }
  }
  return OkStatus();
}

Status Engine::blend_compute_segments(const RagPrompt& p, std::span<const SegmentRef> refs,
                                      std::span<const size_t> missing, ChunkCache& store,
                                      RequestStats& stats) noexcept {
  llama_memory_t mem = llama_get_memory(ctx_);
  const uint32_t b = static_cast<uint32_t>(p.head.size());
  llama_memory_seq_rm(mem, kScratch, -1, -1);
  Status st = prefill_seq(p.head, 0, kScratch, false);
  for (size_t k = 0; k < missing.size() && st.ok(); ++k) {
    const size_t i = missing[k];
    const uint64_t t0 = now_ns();
    st = prefill_seq(p.segments[i], b, kScratch, false);
    if (st.ok()) st = seq_cells(ctx_, kScratch, b + static_cast<uint32_t>(p.segments[i].size()), &cells_);
    const uint64_t t1 = now_ns();
    stats.blend.segment_prefill_s += seconds_between(t0, t1);
    if (st.ok()) {
      const kdn_engine_layout src = cache_layout(cells_.data() + b, 0);
      Result<uint32_t> stored = store.store_segment(refs[i], src);
      if (stored.ok())
        stats.blend.chunks_stored += *stored;
      else
        st = stored.status();
    }
    stats.blend.segment_store_s += seconds_between(t1, now_ns());
    llama_memory_seq_rm(mem, kScratch, static_cast<llama_pos>(b), -1);
  }
  // Empty again: the prompt's cells are placed from the first cell on.
  llama_memory_seq_rm(mem, kScratch, -1, -1);
  stats.blend.segments_computed = static_cast<uint32_t>(missing.size());
  return st;
}

Status Engine::blend_load(const RagPrompt& p, std::span<const SegmentRef> refs, ChunkCache& store,
                          const BlendOptions& o, RequestStats& stats) noexcept {
  const KvGeometry& g = identity_.geometry;
  const uint32_t b = static_cast<uint32_t>(p.head.size());
  const uint32_t end = static_cast<uint32_t>(p.size() - p.tail.size());
  std::vector<int32_t> tokens;
  try {
    tokens.reserve(end);
    tokens.insert(tokens.end(), p.head.begin(), p.head.end());
    for (const auto& s : p.segments) tokens.insert(tokens.end(), s.begin(), s.end());
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "blend");
  }
  // Place the cells: each decode's graph stops after its first node, or after the check layer.
  const bool hkvd = o.policy == BlendPolicy::kHkvd;
  const uint64_t t0 = now_ns();
  hooks_->stop_after_layer(hkvd ? static_cast<int32_t>(o.check_layer) : -1);
  Status st = prefill_seq(tokens, 0, kSeq, false);
  const uint32_t stops = hooks_->stops();
  hooks_->disarm();
  KDN_RETURN_IF_ERROR(st);
  if (stops == 0) return Status(Code::kInternal, "the partial decodes were not stopped");
  KDN_RETURN_IF_ERROR(seq_cells(ctx_, kSeq, end, &cells_));
  const uint64_t t1 = now_ns();
  stats.blend.place_s = seconds_between(t0, t1);
  if (hkvd) stats.blend.tokens_checked = end;

  // Load every segment at its position; the check layers' cached rows go to scratch_.
  const uint32_t scratch_layers = hkvd ? o.check_layer + 1 : 0;
  try {
    if (scratch_.size() < 2 * scratch_layers) scratch_.resize(2 * scratch_layers);
    for (auto& buf : scratch_) buf.resize(uint64_t{kv_cells_} * g.row_bytes());
    std::vector<int64_t> targets(refs.size());
    std::vector<uint64_t> loaded(refs.size());
    for (size_t i = 0; i < refs.size(); ++i) targets[i] = static_cast<int64_t>(p.segment_pos(i));
    const kdn_engine_layout dst = cache_layout(cells_.data() + b, scratch_layers);
    KDN_RETURN_IF_ERROR(store.retrieve_segments(refs, targets, dst, loaded));
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "blend");
  }
  KDN_RETURN_IF_ERROR(check_loaded_finite(std::span(cells_).subspan(b, end - b), scratch_layers));
  stats.blend.retrieve_s = seconds_between(t1, now_ns());
  stats.blend.tokens_loaded = end - b;
  stats.blend.segments_reused = static_cast<uint32_t>(refs.size()) - stats.blend.segments_computed;
  return OkStatus();
}

// Adds to dev[t] the deviation of segment token t's K (or V) rows at `layer`: fresh (the check
// pass, in the cache) against cached (re-rotated K, in scratch_), rows gathered by position.
Status Engine::add_deviation(const RagPrompt& p, uint32_t layer, bool v, std::span<float> dev) noexcept {
  const KvGeometry& g = identity_.geometry;
  const uint64_t row = g.row_bytes(), elem = g.elem_bytes();
  const uint32_t b = static_cast<uint32_t>(p.head.size());
  const uint32_t n = static_cast<uint32_t>(dev.size());
  const uint8_t* live = v ? kv_v_[layer] : kv_k_[layer];
  const uint8_t* loaded = scratch_[2 * layer + (v ? 1 : 0)].data();
  try {
    std::vector<uint8_t> fresh(uint64_t{n} * row), cached(uint64_t{n} * row);
    for (uint32_t t = 0; t < n; ++t) {
      const uint64_t cell = static_cast<uint64_t>(cells_[b + t]);
      if (!v || !g.v_trans) {
        std::memcpy(fresh.data() + t * row, live + cell * row, row);
        std::memcpy(cached.data() + t * row, loaded + cell * row, row);
      } else {  // V transposed: channel c of a cell at c * cells + cell
        for (uint64_t c = 0; c < row / elem; ++c) {
          std::memcpy(fresh.data() + t * row + c * elem, live + (c * kv_cells_ + cell) * elem, elem);
          std::memcpy(cached.data() + t * row + c * elem, loaded + (c * kv_cells_ + cell) * elem, elem);
        }
      }
    }
    const uint32_t width = g.n_kv_heads * g.head_dim;
    const kernels::TokenRows f{fresh.data(), kernels::DType::kF16, width, width};
    const kernels::TokenRows c{cached.data(), kernels::DType::kF16, width, width};
    std::vector<float> d(n);
    KDN_RETURN_IF_ERROR(kernels::kv_deviation(f, c, n, nullptr, d.data(), kernels::Executor::cpu()));
    for (uint32_t t = 0; t < n; ++t) dev[t] += d[t];
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "blend selection");
  }
  return OkStatus();
}

Result<std::vector<uint32_t>> Engine::blend_select(const RagPrompt& p, const BlendOptions& o) noexcept {
  const uint32_t b = static_cast<uint32_t>(p.head.size());
  const uint32_t end = static_cast<uint32_t>(p.size() - p.tail.size());
  std::vector<uint32_t> sel;
  try {
    switch (o.policy) {
      case BlendPolicy::kNone:
        break;
      case BlendPolicy::kAll:
        sel.resize(end - b);
        std::iota(sel.begin(), sel.end(), b);
        break;
      case BlendPolicy::kBoundary:
        for (size_t i = 1; i < p.segments.size(); ++i) {
          const uint32_t at = static_cast<uint32_t>(p.segment_pos(i));
          const uint32_t n = std::min<uint32_t>(o.boundary_tokens, static_cast<uint32_t>(p.segments[i].size()));
          for (uint32_t t = 0; t < n; ++t) sel.push_back(at + t);
        }
        break;
      case BlendPolicy::kHkvd: {
        const uint32_t n = end - b;
        std::vector<float> dev(n, 0.0f);
        if (o.deviation != BlendDeviation::kV) KDN_RETURN_IF_ERROR(add_deviation(p, o.check_layer, false, dev));
        if (o.deviation != BlendDeviation::kK) KDN_RETURN_IF_ERROR(add_deviation(p, o.check_layer, true, dev));
        const kernels::Executor cpu = kernels::Executor::cpu();
        const uint32_t k = kernels::recompute_count(n, o.recompute_ratio);
        Result<size_t> bytes = kernels::top_k_scratch_bytes(n, cpu);
        if (!bytes.ok()) return bytes.status();
        std::vector<uint8_t> scratch(*bytes);
        std::vector<int32_t> picked(std::min(k, n));
        uint32_t n_picked = 0;
        KDN_RETURN_IF_ERROR(kernels::select_top_k(dev.data(), nullptr, n, k, picked.data(), &n_picked, scratch.data(),
                                                  scratch.size(), cpu));
        for (uint32_t i = 0; i < n_picked; ++i) sel.push_back(b + static_cast<uint32_t>(picked[i]));
        break;
      }
    }
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "blend selection");
  }
  return sel;
}

Status Engine::blend_finish(const RagPrompt& p, std::span<const uint32_t> selected) noexcept {
  const uint32_t t = opts_.chunk_tokens;
  const uint32_t b = static_cast<uint32_t>(p.head.size());
  const uint32_t end = static_cast<uint32_t>(p.size() - p.tail.size());
  const uint32_t n = static_cast<uint32_t>(p.size());
  std::vector<uint32_t> pos;
  std::vector<int32_t> tok;
  try {
    const std::vector<int32_t> all = p.tokens();
    pos.reserve(b + selected.size() + p.tail.size());
    for (uint32_t i = 0; i < b; ++i) pos.push_back(i);
    pos.insert(pos.end(), selected.begin(), selected.end());
    for (uint32_t i = end; i < n; ++i) pos.push_back(i);
    tok.reserve(pos.size());
    for (uint32_t q : pos) tok.push_back(all[q]);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "blend");
  }
  llama_memory_t mem = llama_get_memory(ctx_);
  remove_positions(mem, std::span(pos).first(b + selected.size()));
  // In position order, in batches of whole chunk groups (the tokens of one chunk of positions),
  // as many groups as fit in one batch: a sparse selection fills batches of up to T tokens
  // (small batches compute far fewer tokens a second), and with every token selected each
  // group is a whole chunk, so the batches are exactly a prefill's.
  llama_set_batch_pos_gaps(ctx_, true);
  Batch batch(t);
  for (size_t i = 0; i < pos.size();) {
    size_t j = i;
    while (j < pos.size()) {  // add the next chunk group if it fits
      size_t k = j;
      while (k < pos.size() && pos[k] / t == pos[j] / t) ++k;
      if (k - i > t && j > i) break;
      j = k;
      if (j - i >= t) break;
    }
    batch.clear();
    for (size_t q = i; q < j; ++q) batch.add(tok[q], pos[q], q + 1 == pos.size());
    if (llama_decode(ctx_, batch.get()) != 0) return Status(Code::kInternal, "llama_decode failed");
    last_logits_index_ = static_cast<int32_t>(j - i) - 1;
    i = j;
  }
  llama_set_batch_pos_gaps(ctx_, false);
  // Every position of the prompt has exactly one cell again.
  return seq_cells(ctx_, kSeq, n, &cells_);
}

Status Engine::prefill_blend(const RagPrompt& p, ChunkCache& store, const BlendOptions& o,
                             RequestStats& stats) noexcept {
  if (!cache_support_.ok()) return cache_support_;
  if (!blend_support_.ok()) return blend_support_;
  if (p.segments.empty()) return invalid("a blended prompt needs at least one segment");
  for (const auto& s : p.segments)
    if (s.empty()) return invalid("an empty segment");
  if (p.tail.empty()) return invalid("a blended prompt needs a question after its segments");
  if (p.size() > llama_n_ctx(ctx_)) return invalid("the prompt is longer than the context");
  if (!(o.recompute_ratio >= 0.0 && o.recompute_ratio <= 1.0)) return invalid("recompute ratio must be in [0, 1]");
  if (o.policy == BlendPolicy::kHkvd && o.check_layer >= identity_.geometry.n_layer)
    return invalid("check layer beyond the model's layers");
  BlendStats& bs = stats.blend;
  bs = BlendStats{};
  bs.segments = static_cast<uint32_t>(p.segments.size());
  // From an empty cache (generate_blend empties it before its clock starts).
  llama_memory_t mem = llama_get_memory(ctx_);
  if (llama_memory_seq_pos_max(mem, kSeq) != -1 || llama_memory_seq_pos_max(mem, kScratch) != -1) reset();
  BlendGuard guard(ctx_, hooks_.get());
  Status st;
  try {
    const kdn_key base_key = context_key(model_info_, p.head);
    std::vector<SegmentRef> refs;
    for (const auto& s : p.segments) refs.push_back(SegmentRef{s, base_key, static_cast<int64_t>(p.head.size())});
    const uint64_t t0 = now_ns();
    Result<std::vector<SegmentHits>> hits = store.lookup_segments(refs);
    bs.lookup_s = seconds_between(t0, now_ns());
    if (!hits.ok()) {
      reset();
      return hits.status();
    }
    std::vector<size_t> missing;
    for (size_t i = 0; i < refs.size(); ++i)
      if (!(*hits)[i].whole(refs[i])) missing.push_back(i);
    if (!missing.empty()) st = blend_compute_segments(p, refs, missing, store, stats);
    if (st.ok()) st = blend_load(p, refs, store, o, stats);
    const uint64_t ts = now_ns();
    Result<std::vector<uint32_t>> sel = st.ok() ? blend_select(p, o) : Result<std::vector<uint32_t>>(st);
    bs.select_s = seconds_between(ts, now_ns());
    if (sel.ok()) {
      const uint64_t t1 = now_ns();
      st = blend_finish(p, *sel);
      bs.recompute_s = seconds_between(t1, now_ns());
      bs.tokens_recomputed = sel->size();
      last_selection_ = std::move(*sel);
    } else {
      st = sel.status();
    }
  } catch (const std::bad_alloc&) {
    st = Status(Code::kNoMemory, "blend");
  }
  if (!st.ok()) {
    reset();
    return st;
  }
  bs.used = true;
  return OkStatus();
}

Result<Generation> Engine::generate_blend(const RagPrompt& prompt, uint32_t n_predict, ChunkCache* store,
                                          const BlendOptions& options) noexcept {
  std::vector<int32_t> tokens;
  try {
    tokens = prompt.tokens();
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "blend");
  }
  if (tokens.empty() || n_predict == 0) return invalid("empty prompt or nothing to predict");
  if (tokens.size() + n_predict > llama_n_ctx(ctx_)) return invalid("prompt and answer do not fit in the context");
  Generation gen;
  RequestStats& stats = gen.stats;
  reset();
  const uint64_t t0 = now_ns();
  Status st = store != nullptr ? prefill_blend(prompt, *store, options, stats)
                               : Status(Code::kUnavailable, "no cache to blend from");
  if (!st.ok()) {
    // Any failure: the whole prompt, as without a cache.
    stats.cache_status = st;
    stats.blend.used = false;
    reset();
    KDN_RETURN_IF_ERROR(prefill(tokens, 0, {}));
  }
  std::span<const float> logits = last_logits();
  const int32_t token = argmax(logits);
  const uint64_t t1 = now_ns();
  stats.ttft_s = seconds_between(t0, t1);
  const BlendStats& bs = stats.blend;
  stats.tokens_reused = bs.used ? static_cast<uint32_t>(bs.tokens_loaded - bs.tokens_recomputed) : 0;
  stats.tokens_computed = static_cast<uint32_t>(tokens.size()) - stats.tokens_reused;
  stats.retrieve_s = bs.lookup_s + bs.retrieve_s;
  stats.prefill_s =
      bs.used ? bs.segment_prefill_s + bs.place_s + bs.select_s + bs.recompute_s : seconds_between(t0, t1);
  gen.first_logits.assign(logits.begin(), logits.end());
  gen.tokens.push_back(token);
  KDN_RETURN_IF_ERROR(decode_greedy(gen.tokens, n_predict));
  return gen;
}

}  // namespace kdn::llama
