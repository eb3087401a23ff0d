// Writes an engine's real KV as canonical chunk files (the kernels benchmark's --kv-dir input;
// format in docs/kernels.md: STEM.kv raw canonical chunk + STEM.json geometry).
#pragma once

#include <kdn/common/status.h>
#include <kdn/llama/engine.h>

#include <string>

namespace kdn::llama {

// Extracts chunks [0, n_chunks) of the engine's current sequence and writes them to
// dir/chunk-NNNN.{kv,json} (dir is created if missing). The sequence must hold at least
// n_chunks whole chunks.
Status dump_kv_chunks(Engine& engine, uint32_t n_chunks, const std::string& dir) noexcept;

}  // namespace kdn::llama
