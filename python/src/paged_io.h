// Loads and stores of a request's chunks between kdnd and an engine's paged KV cache: one
// call per request, all layers, so an engine calls kdn once per request and step.
//
// Block ids. `blocks[j]` is the engine block holding the request's tokens
// [j * block_tokens, (j + 1) * block_tokens); chunk c covers blocks [c * k, (c + 1) * k) with
// k = chunk_tokens / block_tokens.
//
// Failures are results, not exceptions: a load reports how many chunks it loaded and why it
// stopped, so the engine recomputes exactly the rest. Only invalid arguments throw.
#pragma once

#include "client.h"
#include "paged_kv.h"

#include <cstdint>
#include <span>

namespace kdn::python {

struct LoadOutcome {
  uint32_t loaded = 0;   // chunks [first_chunk, first_chunk + loaded) are in the cache
  int32_t status = 0;    // why the load stopped short: KDN_ERR_NOT_FOUND (not cached, e.g.
                         // evicted since the lookup), KDN_ERR_CORRUPT (a chunk failed its
                         // check), or the libkdn error; 0 when every chunk loaded
  uint32_t corrupt = 0;  // chunks that failed their check (their blocks were zeroed)
  uint64_t bytes = 0;    // chunk bytes copied into the cache
};

// Loads chunks [first_chunk, end_chunk) of tokens into `blocks`, skipping blocks before
// `first_block` (the engine computed them already). Leases the prefix from chunk 0, copies,
// releases. tokens must hold at least end_chunk whole chunks.
LoadOutcome load_chunks(const Model& model, PagedKV& kv, std::span<const int32_t> tokens,
                        std::span<const int64_t> blocks, uint32_t first_chunk, uint32_t end_chunk, int64_t first_block);

struct SaveOutcome {
  uint32_t stored = 0;   // chunks gathered and published
  uint32_t present = 0;  // chunks kdnd had already (or another engine was storing)
  int32_t status = 0;    // the libkdn error that ended the store early; 0 if none
  uint64_t bytes = 0;
};

// Stores chunks [first_chunk, first_chunk + n_chunks) of tokens from `blocks`; chunks kdnd
// already holds are not gathered. Reserves, gathers and commits in rounds of what the
// session's staging area holds.
SaveOutcome save_chunks(const Model& model, PagedKV& kv, std::span<const int32_t> tokens,
                        std::span<const int64_t> blocks, uint32_t first_chunk, uint32_t n_chunks);

}  // namespace kdn::python
