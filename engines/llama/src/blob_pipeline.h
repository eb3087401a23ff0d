// Two-stage pipeline for loading chunks (private to kdn_llama): a helper thread builds blob
// i + 1 (copy + validation, memory-bound) while the calling thread hands blob i to llama.cpp
// (another copy). Two buffers are in flight, so the stages overlap and neither waits for
// memory the other is streaming.
#pragma once

#include <kdn/common/status.h>

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace kdn::llama {

using BlobBuilder = std::function<Status(uint32_t i, std::span<uint8_t> blob)>;
using BlobConsumer = std::function<Status(uint32_t i, std::span<const uint8_t> blob)>;

// Runs build(i, buffers[i % 2]) on a helper thread and consume(i, buffers[i % 2]) on this
// thread, for i = 0 .. n-1 in order; both buffers must already be sized. Stops at the first
// error of either stage and returns it; every consume call sees a successfully built blob.
// Without a helper thread (n == 1, or the thread cannot start) the stages run one after the
// other on this thread, with the same results.
Status run_blob_pipeline(uint32_t n, std::vector<uint8_t> (&buffers)[2], const BlobBuilder& build,
                         const BlobConsumer& consume) noexcept;

}  // namespace kdn::llama
