// What the GPU tier needs to keep KVC1 blobs in T0 (tier.gpu.codec, docs/gpu.md "T0 with a
// codec"): the codec's id, how a decode launch lays out the bounce buffer, the host copies of the
// blobs a device's T0 holds, and the encode job that makes a blob on a worker thread.
//
// With a codec, a chunk enters T0 as a blob: the event loop posts a T0EncodeJob (the chunk's host
// copy pinned meanwhile), a worker encodes and validates it once (kvc1_validate_batch), and the
// loop copies the blob into a T0 slot sized to it. T0BlobStore keeps the host copy for as long as
// the slot holds the blob: the CUDA decoder reads the headers of host copies at every launch.
//
// Pure C++ (no CUDA); everything here but T0EncodeJob::run is for the event loop only.
#pragma once

#include "t0_index.h"

#include "aligned_buffer.h"
#include "chunk_codec.h"

#include <kdn/common/status.h>
#include <kdn/kernels/layout.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace kdn::sidecar {
struct Entry;
struct Namespace;
}  // namespace kdn::sidecar

namespace kdn::sidecar::gpu {

// The tier codec id (chunk_codec.h: 0 none, 1 lossless, 2 int8, 3 kivi4) of a tier.gpu.codec
// value, or nullopt for a name that is none of those.
std::optional<uint8_t> t0_codec_id(std::string_view name) noexcept;

// How one decode launch uses the bounce buffer [0, bounce_bytes): output i (a canonical chunk) at
// i * stride, then the decoder's device scratch at scratch_offset. chunks is the most chunks one
// launch may decode (at most max_chunks); 0 when not even one chunk and its scratch fit.
struct DecodeArea {
  uint32_t chunks = 0;
  uint64_t stride = 0;
  uint64_t scratch_offset = 0;
  uint64_t scratch_bytes = 0;
};
constexpr uint64_t kDecodeAlign = 256;
constexpr uint32_t kMaxDecodeChunks = 64;  // one launch decodes at most this many chunks
// scratch_of: the decoder's scratch for n chunks (kernels::kvc1_cuda_scratch_bytes).
DecodeArea plan_decode_area(uint64_t bounce_bytes, uint64_t chunk_bytes, uint32_t max_chunks,
                            size_t (*scratch_of)(uint32_t)) noexcept;

// The T0 slot size for a blob of `blob_bytes`: rounded up to 1/16 of its power of two (at least
// 4 KiB), so blobs of one model share a few slab size classes and at most about 6% is wasted.
uint64_t t0_slot_bytes(uint64_t blob_bytes) noexcept;

// A blob one T0 slot holds, and the size of the chunk it encodes.
struct T0Blob {
  AlignedBuffer blob;  // the blob in its first `bytes` bytes
  uint64_t bytes = 0;
  uint64_t raw_bytes = 0;
  bool pinned = false;  // page-locked by its owner, who unlocks it before it is freed
};

// Host copies of the blobs in one device's T0, and the chunks whose encode is in flight.
// The T0 slot of a blob is the caller's: erase() when the slot goes.
class T0BlobStore {
 public:
  // Marks `k` as being encoded; false when it is already (or its blob is here): no second job.
  // May throw std::bad_alloc.
  bool begin_encode(const T0Key& k);
  void end_encode(const T0Key& k) noexcept;
  bool encoding(const T0Key& k) const noexcept { return encoding_.count(k) != 0; }
  // Keeps the blob of `k` (replacing none: `k` must have no blob). May throw std::bad_alloc.
  void put(const T0Key& k, T0Blob b);
  const T0Blob* find(const T0Key& k) const noexcept;
  void erase(const T0Key& k) noexcept;
  // Calls fn on every blob, then drops them all (the owner unlocks pinned ones in fn).
  template <class Fn>
  void drop_all(Fn fn) noexcept {
    for (auto& [k, b] : blobs_) fn(b);
    blobs_.clear();
    raw_bytes_ = stored_bytes_ = 0;
  }

  uint64_t blobs() const noexcept { return blobs_.size(); }
  uint64_t in_flight() const noexcept { return encoding_.size(); }
  uint64_t raw_bytes() const noexcept { return raw_bytes_; }        // chunks the blobs encode
  uint64_t stored_bytes() const noexcept { return stored_bytes_; }  // the blobs themselves

 private:
  std::unordered_map<T0Key, T0Blob, T0KeyHash> blobs_;
  std::unordered_set<T0Key, T0KeyHash> encoding_;
  uint64_t raw_bytes_ = 0, stored_bytes_ = 0;
};

// One chunk on its way into T0. The loop fills the inputs (the chunk's host copy stays pinned and
// its namespace attached until the job is back), a worker runs run(), the loop applies the result.
struct T0EncodeJob {
  // inputs, for the worker
  kernels::ChunkGeometry geo;
  kdn_key fingerprint{};
  const std::byte* chunk = nullptr;  // chunk_bytes(geo) bytes, the pinned host copy
  uint8_t codec = 0;                 // tier codec id, 1..3
  // A blob the device made from the chunk (t0_device_encode.h): run() validates it instead of
  // encoding; `chunk` is then null and `keep` holds the landing it lies in.
  const std::byte* device_blob = nullptr;
  uint64_t device_blob_bytes = 0;
  std::shared_ptr<const void> keep;
  // the loop's own (the worker never touches them)
  T0Key key;
  int device = -1;
  Namespace* ns = nullptr;
  Entry* entry = nullptr;
  // results
  ChunkEncoding encoding;  // on success, its blob buffer is no larger than the blob (rounded to 4 KiB)
  Status status;
  bool pinned = false;  // the worker page-locked the blob (the GPU tier's, not run()'s)

  // Encodes the chunk (or takes the device's blob), validates the blob as the CUDA decoder will
  // read it, and moves it into a buffer of its own size (the encoder's holds the codec's worst
  // case). Any thread.
  void run() noexcept;
};

}  // namespace kdn::sidecar::gpu
