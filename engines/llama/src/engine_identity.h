// How an engine context becomes a kdn model descriptor (private to kdn_llama).
#pragma once

#include <kdn/common/status.h>
#include <kdn/llama/engine.h>

#include <string>

namespace kdn::llama {

// The identity of a context created from `model` with `opts` (flash attention decides
// v_trans; the context always uses one unified KV stream of f16 K and V). The engine salt is
// XXH3-128 of the model file followed by XXH3-128 of everything else that changes KV bytes:
// llama.cpp build, compiled CPU features, K/V types, V transposition, stream count and layer
// geometry. Any difference gives another fingerprint, hence other keys: a miss, never a bad load.
Result<EngineIdentity> make_identity(const llama_model* model, const EngineOptions& opts) noexcept;

// XXH3-128 of a file's contents.
Result<kdn_key> hash_file(const std::string& path) noexcept;

}  // namespace kdn::llama
