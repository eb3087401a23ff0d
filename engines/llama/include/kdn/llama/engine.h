// A llama.cpp engine that uses kdn: before prefill it loads the longest cached prefix of the
// prompt from a ChunkCache into its (empty) KV cache, prefills only the rest, and stores the
// whole chunks it computed.
//
// Exactness. Chunks are loaded in position order into an empty cache, so every cell lands
// where a fresh prefill would put it; prefill always runs in chunk-sized batches aligned to
// chunk boundaries, so the suffix after a hit is computed in exactly the batches a miss would
// use. Together these make a hit produce bit-identical logits and tokens to a miss on CPU.
//
// Safety. A chunk is loaded only if the store's key (which covers the engine fingerprint,
// see identity()) matches, it has the exact canonical size, holds only finite values (checked
// as it is copied into the cache) and llama.cpp's state reader accepts the fields around it.
// If anything fails (store error, bad chunk, llama.cpp refusing the blob, cells not where
// expected), the sequence is cleared and the whole prompt is prefilled: a fault costs time,
// never output.
//
// Ownership and threads: an Engine owns its llama.cpp model and context; it is not
// thread-safe. One Engine per thread.
#pragma once

#include <kdn/common/status.h>
#include <kdn/kdn.h>
#include <kdn/llama/blend.h>
#include <kdn/llama/chunk_cache.h>
#include <kdn/llama/state_blob.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

struct llama_context;
struct llama_model;

namespace kdn::llama {

class OverlappedLoad;
class EvalHooks;
struct KvCopy;

// The SmolLM2-135M-Instruct GGUF scripts/setup-llama.sh unpacked for this build.
const char* default_model_path() noexcept;

// The same model with every weight tensor stored as f16 (dequantized by llama.cpp's own
// quantizer), written once next to `model_path` as NAME.f16.gguf and reused afterwards; its
// path. For measurements that must not see weight quantization: llama.cpp runs quantized
// weights against 8-bit activations, which hides small KV differences in rounding noise.
Result<std::string> f16_weights_model(const std::string& model_path) noexcept;

// Whether a hit's KV copy runs beside the suffix prefill (see overlapped_load.h): layer L's
// bytes are copied on a worker thread while layers before L compute, and each layer's
// attention waits for its own bytes. kAuto: when the engine's compute threads leave a
// hardware thread free for the copy. Only with flash attention (V rows): a transposed V is
// always copied before the prefill.
enum class LoadOverlap { kAuto, kOn, kOff };

struct EngineOptions {
  std::string model_path;
  uint32_t n_ctx = 8192 + 512;  // KV cells: prompt + generated tokens must fit
  uint32_t chunk_tokens = 256;  // kdn chunk size, also the prefill batch size
  int32_t n_threads = 0;        // 0: every hardware thread
  bool flash_attn = true;       // false: llama.cpp keeps V transposed (part of the fingerprint)
  LoadOverlap load_overlap = LoadOverlap::kAuto;
  bool verbose = false;                // let llama.cpp log to stderr
  uint32_t overlap_test_delay_us = 0;  // tests: the load worker sleeps this long per tensor
  // Called on the prefilling thread after every batch a prefill computes: tokens done and
  // tokens in that prefill (a long prompt's progress; empty: not called).
  std::function<void(uint64_t done, uint64_t total)> on_prefill_batch;
};

// What makes this engine's KV bytes interchangeable with another's.
struct EngineIdentity {
  KvGeometry geometry;
  kdn_model_desc desc;   // registered with kdn; its fingerprint keys every chunk
  std::string build_id;  // llama.cpp version this engine was built from
};

struct RequestStats {
  double ttft_s = 0;       // prompt tokens in -> first token chosen (retrieve + load + prefill)
  double retrieve_s = 0;   // store lookup and lease
  double load_s = 0;       // leased canonical chunks -> KV cache (with overlap: cells placed, copy started)
  double load_copy_s = 0;  // overlapped load: the worker's copy, beside the prefill
  double load_wait_s = 0;  // overlapped load: how long the prefill waited for it
  double prefill_s = 0;    // computing the uncached tokens
  double store_s = 0;      // extracting and storing new chunks (after the first token)
  uint32_t tokens_reused = 0;
  uint32_t tokens_computed = 0;
  uint32_t chunks_loaded = 0;
  uint32_t chunks_stored = 0;
  uint64_t bytes_loaded = 0;
  uint64_t bytes_stored = 0;
  Status cache_status;  // why the cache was not (fully) used; ok if it was or was not needed
  BlendStats blend;     // generate_blend / prefill_blend
};

struct Generation {
  std::vector<int32_t> tokens;      // greedy tokens after the prompt (stops early at end of turn)
  std::vector<float> first_logits;  // the logits that chose tokens[0]
  RequestStats stats;
};

// Called with the logits of prompt token i (predicting token i + 1) while prefilling.
using LogitsSink = std::function<void(uint32_t i, std::span<const float> logits)>;

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> open(const EngineOptions& opts) noexcept;
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineIdentity& identity() const noexcept { return identity_; }
  // Ok if KV can move between this engine and kdn; otherwise why not (the engine still runs,
  // without a cache).
  const Status& cache_support() const noexcept { return cache_support_; }
  uint32_t n_vocab() const noexcept;
  uint32_t context_size() const noexcept;  // KV cells: prompt + answer must fit

  // Text <-> tokens. `special` parses/prints control tokens such as <|im_start|>.
  Result<std::vector<int32_t>> tokenize(std::string_view text, bool add_bos, bool special) const;
  std::string detokenize(std::span<const int32_t> tokens) const;

  // The chat prompt for one user turn: the model's chat template around
  // `document` + "\n\n" + `question`. If context_tokens > 0, the document is cut so that the
  // prompt up to the end of the document is exactly context_tokens long (chunk-aligned reuse),
  // or an error if the document is too short.
  Result<std::vector<int32_t>> chat_prompt(std::string_view document, std::string_view question,
                                           uint32_t context_tokens) const;
  // The tokens of chat_prompt() up to the end of the document: what no question changes, and
  // so what a cache can bring close (ChunkCache::prefetch) before the question is tokenized.
  Result<std::vector<int32_t>> document_prefix(std::string_view document, uint32_t context_tokens) const;

  // The chat prompt around `documents` (in prompt order, each followed by "\n\n") and
  // `question`, as the spans blending needs (blend.h).
  Result<RagPrompt> rag_prompt(std::span<const std::string> documents, std::string_view question) const;

  // One RAG request, blended (docs/blend.md): each document's KV is loaded from `store` at its
  // position in this prompt (prefilled after the head and stored first if it is not cached),
  // the policy's tokens are recomputed, then the question is prefilled and n_predict tokens
  // chosen greedily. Any failure falls back to a full prefill of the whole prompt (same output
  // as without a cache; stats.cache_status says why, stats.blend.used is false).
  Result<Generation> generate_blend(const RagPrompt& prompt, uint32_t n_predict, ChunkCache* store,
                                    const BlendOptions& options) noexcept;
  // The prefill part of generate_blend, without the fallback, from an empty cache (emptied
  // first if it is not): on success the engine stands after the prompt (last_logits() predicts
  // the first answer token); on failure the cache is left empty and the error says why. For
  // quality measurements.
  Status prefill_blend(const RagPrompt& prompt, ChunkCache& store, const BlendOptions& options,
                       RequestStats& stats) noexcept;
  // Graphs stopped early by the blend's partial decodes since the last one started (tests).
  uint32_t partial_decodes() const noexcept;
  // The positions the last blended prefill recomputed, ascending within each policy's order (tests).
  const std::vector<uint32_t>& last_blend_selection() const noexcept { return last_selection_; }
  // The quality measurements' control: flips the lowest bit of a fixed pseudo-random half of
  // the K and V elements (every layer) of positions [first_pos, first_pos + n) of the sequence,
  // a change of at most one unit in the last place.
  Status perturb_kv_ulp(uint32_t first_pos, uint32_t n) noexcept;

  // One request from an empty cache: load the cached prefix from `store` (null: no cache),
  // prefill the rest, choose n_predict tokens greedily, then store the prompt's new whole
  // chunks. Errors only for bad arguments or an engine failure; cache trouble is reported in
  // stats.cache_status.
  Result<Generation> generate(std::span<const int32_t> prompt, uint32_t n_predict, ChunkCache* store) noexcept;

  // ---- steps of generate(), for tests, benchmarks and --dump-kv --------------------------
  // Empties the KV cache, zeroing its buffers.
  void reset() noexcept;
  // Loads canonical chunks as positions [0, n * chunk_tokens) into the empty sequence (all of
  // their bytes are in the cache when it returns).
  Status load_chunks(std::span<const std::span<const uint8_t>> chunks) noexcept;
  // Whether generate() overlaps a hit's KV copy with the suffix prefill.
  bool overlaps_load() const noexcept { return overlap_ != nullptr; }
  // Prefills tokens at positions first_pos.. in chunk-aligned batches; `sink` (may be empty)
  // gets the logits of every token, otherwise only the last token's are computed.
  Status prefill(std::span<const int32_t> tokens, uint32_t first_pos, const LogitsSink& sink) noexcept;
  // Decodes one token at `pos` after the sequence (last_logits() then predicts the next).
  Status decode_one(int32_t token, uint32_t pos) noexcept;
  // Logits of the last prefilled or decoded token.
  std::span<const float> last_logits() const noexcept;
  // Continues greedily after a prefill: `tokens` holds the tokens chosen so far (at least the
  // first, the argmax of last_logits()); appends until it holds n_predict tokens or ends
  // with an end-of-turn token.
  Status decode_greedy(std::vector<int32_t>& tokens, uint32_t n_predict) noexcept;
  // Canonical bytes of chunks [first, first + out.size()) of the sequence (must be prefilled).
  Status extract_chunks(uint32_t first, std::span<const std::span<uint8_t>> out) noexcept;
  // Position count of the sequence (pos_max + 1; 0 if empty).
  uint32_t sequence_length() const noexcept;

  llama_context* context() const noexcept { return ctx_; }

 private:
  Engine() = default;
  Status init(const EngineOptions& opts) noexcept;
  Status probe_state_format() noexcept;
  Result<std::vector<int32_t>> prompt_parts(std::string_view document, std::string_view question,
                                            uint32_t context_tokens, bool with_tail) const;
  Status size_blob(uint64_t bytes) noexcept;  // blob_ resized to `bytes`; kNoMemory if it cannot be
  // Loads the cached prefix; `lease` keeps the chunks pinned until the caller drops it (after
  // the first token, so the release round trip is not part of the time to first token).
  uint32_t load_cached_prefix(std::span<const int32_t> prompt, ChunkCache& store, RequestStats& stats,
                              std::unique_ptr<ChunkLease>& lease) noexcept;
  void store_new_chunks(std::span<const int32_t> prompt, uint32_t first_chunk, ChunkCache& store,
                        RequestStats& stats) noexcept;
  // prefill() into any sequence; `logits_last`: compute the last token's logits.
  Status prefill_seq(std::span<const int32_t> tokens, uint32_t first_pos, int32_t seq, bool logits_last) noexcept;
  // ---- blend steps (blend.cc) ----
  Status blend_compute_segments(const RagPrompt& p, std::span<const SegmentRef> refs, std::span<const size_t> missing,
                                ChunkCache& store, RequestStats& stats) noexcept;
  Status blend_load(const RagPrompt& p, std::span<const SegmentRef> refs, ChunkCache& store, const BlendOptions& o,
                    RequestStats& stats) noexcept;
  Result<std::vector<uint32_t>> blend_select(const RagPrompt& p, const BlendOptions& o) noexcept;
  Status add_deviation(const RagPrompt& p, uint32_t layer, bool v, std::span<float> dev) noexcept;
  Status blend_finish(const RagPrompt& p, std::span<const uint32_t> selected) noexcept;
  // The engine layout (kdn_engine_layout) of the KV cache's cells `slots`; layers below
  // `scratch_layers` point into scratch_ instead (the check layers' cached values land there).
  kdn_engine_layout cache_layout(const int64_t* slots, uint32_t scratch_layers) noexcept;
  Status check_loaded_finite(std::span<const int64_t> cells, uint32_t scratch_layers) const noexcept;
  // load_chunks; with `deferred`, the KV copies are left to the caller (restore_seq_pieces).
  Status load_chunks_into(std::span<const std::span<const uint8_t>> chunks, std::vector<KvCopy>* deferred) noexcept;

  EngineOptions opts_;
  EngineIdentity identity_{};
  Status cache_support_;
  llama_model* model_ = nullptr;
  llama_context* ctx_ = nullptr;
  int32_t last_logits_index_ = -1;
  std::vector<uint8_t> blob_;                // reused across requests: the state blob of a store
  SeqBlobPieces pieces_;                     // reused across requests: the blob of a load, as pieces
  std::unique_ptr<OverlappedLoad> overlap_;  // null: loads copy synchronously
  std::unique_ptr<EvalHooks> hooks_;         // the context's eval callback
  Status blend_support_ = Status(Code::kUnsupported, "no KV cache support");
  ModelInfo model_info_{};  // identity_.desc validated: keys, chunk size
  // Blend buffers, reused across requests: the cache tensors, the cell of each position, the
  // check layers' cached K and V (per layer and plane, one row per cell), deviations.
  std::vector<uint8_t*> kv_k_, kv_v_;
  uint32_t kv_cells_ = 0;
  std::vector<int64_t> cells_;
  std::vector<uint32_t> last_selection_;  // positions the last blended prefill recomputed
  std::vector<std::vector<uint8_t>> scratch_;
  std::vector<void*> layout_k_, layout_v_;
};

}  // namespace kdn::llama
