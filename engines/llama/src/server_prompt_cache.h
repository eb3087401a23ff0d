// kdn as llama-server's node-wide prompt cache (private to kdn-llama-server).
//
// engines/llama/patches/0002-server-prompt-hook.patch gives llama.cpp's server one seam,
// server_prompt_hook: `load` where a slot computes how much of its prompt it already holds
// (n_past), `store` once the prompt's first token is out. KdnPromptCache implements it over
// kdnd: a load leases the longest cached prefix of whole chunks, restores it into the slot's
// sequence through llama.cpp's own state reader (kv_restore.h, every element checked finite on
// the way) and reports the new n_past, so the response's timings.cache_n counts kdn's tokens;
// a store reserves the prompt's whole chunks that kdnd lacks, converts the slot's sequence
// blob into canonical chunks (state_blob.h) straight into the reserved slots, and commits.
//
// Chunks share kdn-llama's fingerprint (engine_identity.h): the same llama.cpp build, model
// file, K/V types and V layout give the same keys, so a prompt whose tokens kdn-llama stored is
// a hit here and the other way round. The KV stream count is not part of it: a chunk is
// canonical bytes, and the blob around it is written for this context's streams.
//
// What it refuses, per request (counted, logged the first time): prompts with media (their
// positions hold LLAMA_TOKEN_NULL, so two images would share keys) and requests with a LoRA
// adapter enabled (other KV for the same tokens). Per server (logged at start): a speculative
// decoder (its draft context would not get the KV), models with sliding-window or recurrent
// state, and contexts whose state blob is not the plain format (quantized KV types, cell
// extensions). kdnd down at start or going away later: requests are prefilled, connection
// attempts are retried at most once a second, and libkdn reconnects by itself once connected.
//
// Threading: every call comes from the server's update loop, one at a time.
#pragma once

#include <kdn/llama/chunk_cache.h>
#include <kdn/llama/engine.h>
#include <kdn/llama/state_blob.h>

#include "server-prompt-hook.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kdn::llama {

struct PromptCacheOptions {
  bool enabled = true;
  std::string socket;      // empty: libkdn's default
  std::string name_space;  // empty: libkdn's default; otherwise created if kdnd allows it
  std::string token;       // empty: none
};

// Why requests went without kdn, and what kdn did; logged when the server exits.
struct PromptCacheCounters {
  uint64_t loads = 0;  // requests that started from kdn's chunks
  uint64_t tokens_loaded = 0;
  uint64_t chunks_stored = 0;
  uint64_t skipped_media = 0;
  uint64_t skipped_lora = 0;
  uint64_t skipped_server = 0;  // kdn off for the whole server (speculative, model, format)
  uint64_t unavailable = 0;     // kdnd not reachable: prefilled
  uint64_t failures = 0;        // a load or store that failed for another reason
};

class KdnPromptCache final : public server_prompt_hook {
 public:
  // `opts` is read at attach(): llama-server parses its flags (ours among them) after this
  // object exists. It must outlive the cache.
  explicit KdnPromptCache(const PromptCacheOptions* opts) noexcept : opts_(opts) {}
  ~KdnPromptCache() override;

  void attach(llama_context* ctx, const common_params& params, bool speculative) override;
  int32_t load(llama_context* ctx, llama_seq_id seq, const llama_tokens& prompt, int32_t n_past, bool lora) override;
  void store(llama_context* ctx, llama_seq_id seq, const llama_tokens& prompt, bool lora) override;

  const PromptCacheCounters& counters() const noexcept { return counters_; }

 private:
  Status probe(llama_context* ctx, const std::string& model_path) noexcept;
  // Whether this request may use kdn; counts (and logs once) why not.
  bool admits(const llama_tokens& prompt, bool lora) noexcept;
  // The connection, opened on first use and retried at most once a second while kdnd is away.
  ChunkCache* connection() noexcept;
  // Notes a store or lease result: logs kdnd going away (once) and coming back.
  void note(const Status& st, const char* what) noexcept;
  Status restore(llama_context* ctx, llama_seq_id seq, const ChunkLease& lease, uint32_t n) noexcept;
  Result<uint32_t> store_chunks(llama_context* ctx, llama_seq_id seq, std::span<const int32_t> tokens) noexcept;
  // The slot's sequence blob (exactly the prompt's n_tokens cells, positions 0..), parsed.
  Result<SeqBlobView> read_sequence(llama_context* ctx, llama_seq_id seq, size_t n_tokens) noexcept;

  const PromptCacheOptions* opts_;
  Status support_ = Status(Code::kUnsupported, "not attached");
  EngineIdentity identity_{};  // fingerprint: kdn-llama's, for n_stream = 1
  KvGeometry geometry_{};      // the context's own blob layout (its stream count)
  std::unique_ptr<ChunkCache> cache_;
  uint64_t last_connect_ns_ = 0;
  bool connected_once_ = false;
  bool away_ = false;  // the last kdnd call failed with kUnavailable
  bool logged_media_ = false, logged_lora_ = false, logged_server_ = false;
  SeqBlobPieces pieces_;       // reused: a load's blob, as pieces
  std::vector<uint8_t> blob_;  // reused: a store's sequence blob
  PromptCacheCounters counters_;
};

}  // namespace kdn::llama
