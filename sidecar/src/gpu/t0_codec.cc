#include "t0_codec.h"

#include <kdn/kernels/codec_cuda.h>

#include <algorithm>
#include <cstring>

namespace kdn::sidecar::gpu {

std::optional<uint8_t> t0_codec_id(std::string_view name) noexcept {
  if (name == "none") return uint8_t{0};
  if (name == "lossless") return uint8_t{1};
  if (name == "int8") return uint8_t{2};
  if (name == "kivi4") return uint8_t{3};
  return std::nullopt;
}

DecodeArea plan_decode_area(uint64_t bounce_bytes, uint64_t chunk_bytes, uint32_t max_chunks,
                            size_t (*scratch_of)(uint32_t)) noexcept {
  DecodeArea a;
  if (chunk_bytes == 0 || max_chunks == 0) return a;
  a.stride = (chunk_bytes + kDecodeAlign - 1) / kDecodeAlign * kDecodeAlign;
  if (a.stride < chunk_bytes) return DecodeArea{};  // overflow
  // The scratch grows with n, so the largest n that fits is found from the top of a guess.
  uint64_t n = std::min<uint64_t>(max_chunks, bounce_bytes / a.stride);
  for (; n > 0; --n) {
    const uint64_t scratch = scratch_of(uint32_t(n));
    if (scratch == 0) return DecodeArea{};  // a build without the CUDA decoder
    if (n * a.stride + scratch <= bounce_bytes) break;
  }
  if (n == 0) return DecodeArea{};
  a.chunks = uint32_t(n);
  a.scratch_offset = n * a.stride;
  a.scratch_bytes = scratch_of(uint32_t(n));
  return a;
}

uint64_t t0_slot_bytes(uint64_t blob_bytes) noexcept {
  uint64_t top = 1;
  while (top < blob_bytes && top < (1ull << 62)) top <<= 1;
  const uint64_t granule = std::max<uint64_t>(4096, top / 16);
  return (blob_bytes + granule - 1) / granule * granule;
}

bool T0BlobStore::begin_encode(const T0Key& k) {
  if (blobs_.count(k)) return false;
  return encoding_.insert(k).second;
}

void T0BlobStore::end_encode(const T0Key& k) noexcept { encoding_.erase(k); }

void T0BlobStore::put(const T0Key& k, T0Blob b) {
  const uint64_t raw = b.raw_bytes, stored = b.bytes;
  if (!blobs_.emplace(k, std::move(b)).second) return;
  raw_bytes_ += raw;
  stored_bytes_ += stored;
}

const T0Blob* T0BlobStore::find(const T0Key& k) const noexcept {
  auto it = blobs_.find(k);
  return it == blobs_.end() ? nullptr : &it->second;
}

void T0BlobStore::erase(const T0Key& k) noexcept {
  auto it = blobs_.find(k);
  if (it == blobs_.end()) return;
  raw_bytes_ -= it->second.raw_bytes;
  stored_bytes_ -= it->second.bytes;
  blobs_.erase(it);
}

void T0EncodeJob::run() noexcept {
  if (device_blob) {
    // Made on the device: only checked and fitted here (below), never encoded on the host.
    encoding.blob = AlignedBuffer(device_blob_bytes);
    if (encoding.blob.data() == nullptr) {
      status = Status(Code::kNoMemory, "no memory for the host copy of a T0 blob");
      return;
    }
    std::memcpy(encoding.blob.data(), device_blob, device_blob_bytes);
    encoding.bytes = device_blob_bytes;
  } else if (!encode_chunk(geo, fingerprint, chunk, codec, /*min_saving=*/0, &encoding)) {
    status = Status(Code::kInvalidArgument,
                    "the chunk could not be encoded for T0 (NaN or Inf in a lossy codec, no memory, or no saving)");
    return;
  }
  // Validated once here; the decoder then reads only the headers again (kvc1_decode_cuda_validated).
  const uint8_t* blob = reinterpret_cast<const uint8_t*>(encoding.blob.data());
  const size_t len = encoding.bytes;
  kernels::Kvc1CudaBatch b;
  b.n = 1;
  b.host_blobs = &blob;
  b.blob_bytes = &len;
  status = kernels::kvc1_validate_batch(b, geo, fingerprint);
  if (!status.ok()) {
    encoding = ChunkEncoding{};
    return;
  }
  if (device_blob) return;  // already in a buffer of its own size
  // The host copy lives as long as the T0 slot: keep only the blob's own bytes.
  AlignedBuffer fitted(encoding.bytes);
  if (fitted.data() == nullptr) {
    encoding = ChunkEncoding{};
    status = Status(Code::kNoMemory, "no memory for the host copy of a T0 blob");
    return;
  }
  std::memcpy(fitted.data(), encoding.blob.data(), encoding.bytes);
  encoding.blob = std::move(fitted);
}

}  // namespace kdn::sidecar::gpu
