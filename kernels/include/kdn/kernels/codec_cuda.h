// KVC1 decoding and encoding on a CUDA device (the CPU side is kdn/kernels/codec.h).
//
// A batch of blobs of one model is decoded in one launch (two with transform planes: the
// bands, then the rows; docs/codec.md §10.6): one warp per (chunk, layer, plane, head)
// segment, the 32 rANS lanes on the 32 threads, words shared through ballot/popc, dequantized
// in fp32 with the same bodies as the CPU decoder, so the output is bit-identical to
// kvc1_decode's.
//
// Division of labour. The host holds a copy of every blob (the sidecar reads blobs into host
// memory before moving them to the device) and validates it completely first: CRCs, lengths,
// offsets, tables. The device only decodes, and still checks every rANS block's end state; a
// failure there sets an error word in `device_scratch`, which kvc1_cuda_result reports.
//
// Memory: host_blobs and the three pointer arrays are host memory owned by the caller and
// only read during the call; device_blobs, device_outputs and device_scratch are device
// memory that must stay valid until the stream has run the launch. Nothing is allocated.
// No CUDA types appear here: `stream` is a cudaStream_t (nullptr: the legacy default stream).
// Without KDN_WITH_CUDA every function returns kUnsupported.
#pragma once

#include <kdn/common/status.h>
#include <kdn/kdn.h>
#include <kdn/kernels/codec.h>
#include <kdn/kernels/layout.h>

#include <cstddef>
#include <cstdint>

namespace kdn::kernels {

struct Kvc1CudaBatch {
  uint32_t n = 0;
  const uint8_t* const* host_blobs = nullptr;    // n host copies, validated before launch
  const size_t* blob_bytes = nullptr;            // n lengths
  const uint8_t* const* device_blobs = nullptr;  // n device copies of the same bytes
  void* const* device_outputs = nullptr;         // n canonical chunks (chunk_bytes(expected) each)
  // Transform-coded blobs (docs/codec.md §10): the bytes of the calibration object they name
  // (opts.calibration, which the host checks) in device memory, 4-byte aligned, uploaded once
  // per model by the caller. Null: such blobs are refused (kInvalidArgument).
  const void* device_calibration = nullptr;
};

// Device scratch a batch of n chunks needs.
size_t kvc1_cuda_scratch_bytes(uint32_t n) noexcept;

// Validates every host blob (as kvc1_decode does; opts.verify_crc and opts.layers apply,
// cpu_threads parallelizes the validation) and enqueues the decode on `stream`.
Status kvc1_decode_cuda(const Kvc1CudaBatch& batch, const ChunkGeometry& expected, const kdn_key& fingerprint,
                        void* device_scratch, size_t scratch_bytes, void* stream,
                        const DecodeOptions& opts = {}) noexcept;

// Validates every host blob of a batch as kvc1_decode_cuda does (CRCs, lengths, offsets,
// tables), once. A tier that validated its blobs when they arrived, and that no one else can
// write, decodes them with kvc1_decode_cuda_validated: only the headers are read again on each
// launch (the device still checks every rANS end state and the structure it parses).
Status kvc1_validate_batch(const Kvc1CudaBatch& batch, const ChunkGeometry& expected, const kdn_key& fingerprint,
                           const DecodeOptions& opts = {}) noexcept;
Status kvc1_decode_cuda_validated(const Kvc1CudaBatch& batch, const ChunkGeometry& expected, const kdn_key& fingerprint,
                                  void* device_scratch, size_t scratch_bytes, void* stream,
                                  const DecodeOptions& opts = {}) noexcept;

// Waits for `stream` and reports the device-side result of the last kvc1_decode_cuda that
// used `device_scratch`: OK, kCorrupt (a rANS stream failed its end-state check) or kInternal
// (a CUDA error).
Status kvc1_cuda_result(const void* device_scratch, void* stream) noexcept;

// The same result without waiting. The device-side result of a launch is the 32-bit word at the
// start of its device_scratch (zero before the launch's kernel runs, set by the kernel on a
// failure). A caller that must not block copies those kKvc1CudaResultBytes bytes to host memory
// on the same stream after the launch (before the next launch on that scratch) and passes the
// word to kvc1_cuda_result_of once the copy has landed: OK, kCorrupt or kInternal as above.
constexpr size_t kKvc1CudaResultBytes = 4;
Status kvc1_cuda_result_of(uint32_t word) noexcept;

// ---- encoding -----------------------------------------------------------------------------------
//
// A batch of canonical chunks already in device memory is encoded on the device into blobs
// byte-identical to kvc1_encode's with the same geometry, fingerprint and config (the same
// per-element bodies run on both sides: docs/codec.md §8.1). Quantized modes only (int8, kivi4,
// kivi2, with any of their options); raw and lossless answer kUnsupported. The config applies to
// every chunk of the batch.
//
// Memory: device_chunks[i] holds chunk_bytes(g) bytes, device_outputs[i] has room for
// kvc1_max_encoded_size(g, cfg) bytes (16-byte aligned); both and device_scratch must stay valid
// until the stream has run the launch. The pointer arrays are host memory, read during the call.
struct Kvc1CudaEncodeBatch {
  uint32_t n = 0;
  const void* const* device_chunks = nullptr;
  uint8_t* const* device_outputs = nullptr;
};

// Device scratch an encode of n chunks of g with cfg needs; 0 if g or cfg is invalid or the mode
// is not a device mode.
size_t kvc1_cuda_encode_scratch_bytes(const ChunkGeometry& g, const CodecConfig& cfg, uint32_t n) noexcept;

// Enqueues the encode on `stream`. Errors before the launch: kInvalidArgument (arguments,
// geometry, config, scratch too small), kUnsupported (mode, or built without CUDA).
Status kvc1_encode_cuda(const Kvc1CudaEncodeBatch& batch, const ChunkGeometry& g, const kdn_key& fingerprint,
                        const CodecConfig& cfg, void* device_scratch, size_t scratch_bytes, void* stream) noexcept;

// Waits for `stream` and reports the device-side result of the last kvc1_encode_cuda on
// device_scratch: OK with sizes[0, n) the blob sizes, kInvalidArgument (NaN or Inf in a chunk,
// or values beyond fp32 scales) or kInternal (a CUDA error).
Status kvc1_cuda_encode_result(const void* device_scratch, uint32_t n, void* stream, uint64_t* sizes) noexcept;

// The same result without waiting. The first kvc1_cuda_encode_head_bytes(n) bytes of an encode's
// device_scratch hold its result (an error word, then the n blob sizes). A caller that must not
// block copies them to host memory on the same stream after the launch and passes that copy here
// once it landed: OK with sizes[0, n), kInvalidArgument or kInternal as above.
size_t kvc1_cuda_encode_head_bytes(uint32_t n) noexcept;
Status kvc1_cuda_encode_result_of(const void* head, uint32_t n, uint64_t* sizes) noexcept;

// The device encoder's stages run on the CPU, one unit after another, over host memory laid out
// as kvc1_encode_cuda lays out device memory (batch pointers, outputs and scratch are host
// memory here): the same blobs and the same result head. For checks of the device data flow on
// machines without a device. `place_threads` is how many threads the copy stage pretends to run
// per plane (the device runs 256). Errors before the stages: as kvc1_encode_cuda.
size_t kvc1_encode_emulated_scratch_bytes(const ChunkGeometry& g, const CodecConfig& cfg, uint32_t n) noexcept;
Status kvc1_encode_emulated(const Kvc1CudaEncodeBatch& batch, const ChunkGeometry& g, const kdn_key& fingerprint,
                            const CodecConfig& cfg, void* scratch, size_t scratch_bytes,
                            uint32_t place_threads = 3) noexcept;

}  // namespace kdn::kernels
