// Restoring a sequence straight from blob pieces (private to kdn_llama_core).
#pragma once

#include <kdn/common/status.h>
#include <kdn/llama/state_blob.h>

#include <cstdint>
#include <span>
#include <vector>

struct llama_context;
struct ggml_tensor;

namespace kdn::llama {

// Restores the one-sequence blob `pieces` describe into sequence `seq` of ctx, as
// llama_state_seq_set_data does with the concatenated blob, but without the blob: llama.cpp's
// own state reader walks the pieces, and each KV range it asks for is copied from the chunk
// straight into the cache tensor, checked finite in the same pass. One copy instead of two.
// Like set_data it replaces whatever the sequence held. Errors: kCorrupt (a non-finite KV
// element, or llama.cpp refused the blob: the sequence is then empty again), kInternal.
// This is the one place that uses llama.cpp's internal state-reader interface; the engine
// checks at open that it restores exactly what set_data restores.
//
// With `deferred` non-null, KV ranges bound for host-memory tensors are not copied: each is
// appended to *deferred (unchecked) and the cells are placed as if it had been. The caller
// must then copy them, checked finite, before anything reads the cache (OverlappedLoad), and
// keep the pieces' bytes alive until it has.
struct KvCopy {
  const ggml_tensor* base;  // the cache tensor the range belongs to (the viewed one, for a view)
  uint8_t* dst;
  const uint8_t* src;
  uint64_t bytes;
};
Status restore_seq_pieces(llama_context* ctx, int32_t seq, KvType type, std::span<const BlobPiece> pieces,
                          std::vector<KvCopy>* deferred = nullptr) noexcept;

// The start-up probe of kdn-llama's engine and of kdn-llama-server: sequence `seq` of ctx holds
// exactly one decoded token. Checks that llama.cpp writes exactly the blob state_blob.h converts
// for `g` (its n_stream included) and that restoring it through restore_seq_pieces gives back
// the same blob; anything else (another state version, a quantized KV type, a cell extension,
// another reader interface) is kUnsupported, and kdn stays off rather than risk a bad load.
// The sequence holds the restored token afterwards.
Status check_state_round_trip(llama_context* ctx, int32_t seq, const KvGeometry& g) noexcept;

}  // namespace kdn::llama
