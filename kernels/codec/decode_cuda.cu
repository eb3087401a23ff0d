// KVC1 decoding on a CUDA device: the kernel around decode_warp.h (one warp per chunk, layer,
// plane and head) and its validating host entry points.
//
// The host validates every blob completely before the launch (validate.h); the device parses
// only to locate its segment and still checks every block's word count and end state.
#include <kdn/kernels/codec_cuda.h>

#include "decode_run.h"
#include "decode_transform.h"
#include "validate.h"

#include <cuda_runtime.h>

// Warp primitives of decode_warp.h: every lane of the warp takes part in every call.
#define KDN_WARP_FN __device__
namespace kdn::kernels::kvc1 {
__device__ __forceinline__ uint32_t warp_ballot(bool p) { return __ballot_sync(0xffffffffu, p); }
__device__ __forceinline__ bool warp_all(bool p) { return __all_sync(0xffffffffu, p); }
__device__ __forceinline__ bool warp_any(bool p) { return __any_sync(0xffffffffu, p); }
__device__ __forceinline__ uint32_t warp_broadcast0(uint32_t v) { return __shfl_sync(0xffffffffu, v, 0); }
__device__ __forceinline__ void warp_sync() { __syncwarp(); }
__device__ __forceinline__ void atomic_or(uint32_t* p, uint32_t v) { atomicOr(p, v); }
}  // namespace kdn::kernels::kvc1
#include "decode_warp.h"

namespace kdn::kernels {
namespace kvc1 {
namespace {

__global__ void decode_kernel(Job job) {
  extern __shared__ __align__(16) uint8_t smem[];
  const uint32_t lane = threadIdx.x % 32, warp_in_block = threadIdx.x / 32;
  const uint64_t warp = uint64_t{blockIdx.x} * kWarpsPerBlock + warp_in_block;
  decode_warp(job, warp, lane, smem + warp_in_block * job.smem_per_warp);
}

// Transform planes' rows, once every band of the batch was parked (the kernel boundary orders it).
__global__ void rebuild_kernel(Job job) {
  extern __shared__ __align__(16) uint8_t smem[];
  const uint32_t lane = threadIdx.x % 32, warp_in_block = threadIdx.x / 32;
  const uint64_t warp = uint64_t{blockIdx.x} * kWarpsPerBlock + warp_in_block;
  rebuild_warp(job, warp, lane, smem + warp_in_block * job.smem_per_warp);
}

Status cuda_status(cudaError_t err) {
  if (err == cudaSuccess) return OkStatus();
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
    return Status(Code::kUnavailable, cudaGetErrorName(err));
  return Status(Code::kInternal, cudaGetErrorName(err));
}

// Host-side checks of the batch arguments; each blob is then validated like kvc1_decode does.
Status check_batch(const Kvc1CudaBatch& b, void* scratch, size_t scratch_bytes) {
  if (b.n == 0 || !b.host_blobs || !b.blob_bytes || !b.device_blobs || !b.device_outputs || !scratch)
    return Status(Code::kInvalidArgument, "null or empty batch");
  if (scratch_bytes < kvc1_cuda_scratch_bytes(b.n)) return Status(Code::kInvalidArgument, "device scratch too small");
  for (uint32_t i = 0; i < b.n; ++i) {
    // 16-byte aligned device blobs keep every word array 16-byte aligned for the 16-bit loads.
    if (!b.host_blobs[i] || !b.device_blobs[i] || !b.device_outputs[i] ||
        reinterpret_cast<uintptr_t>(b.device_blobs[i]) % kAlign != 0)
      return Status(Code::kInvalidArgument, "null blob or output, or device blob not 16-byte aligned");
  }
  return OkStatus();
}

}  // namespace
}  // namespace kvc1

size_t kvc1_cuda_scratch_bytes(uint32_t n) noexcept { return 16 + 3 * sizeof(uint64_t) * size_t{n}; }

namespace {

// Opens every blob's header (and, with `full`, validates its layers) and returns the layer range.
// A blob that names a calibration needs opts.calibration to be that one (kNotFound otherwise, a
// miss) and, to be decoded (`launching`), its bytes on the device; *calibrated says if any does.
Status open_batch(const Kvc1CudaBatch& batch, const ChunkGeometry& expected, const kdn_key& fingerprint,
                  const DecodeOptions& opts, bool full, bool launching, LayerRange* layers, bool* calibrated) {
  using namespace kvc1;
  *calibrated = false;
  for (uint32_t i = 0; i < batch.n; ++i) {
    Header h;
    KDN_RETURN_IF_ERROR(
        open_for_decode(batch.host_blobs[i], batch.blob_bytes[i], expected, fingerprint, opts, &h, layers));
    if (h.calibration_id.lo || h.calibration_id.hi) {
      KDN_RETURN_IF_ERROR(match_calibration(h, fingerprint, opts));
      if (launching && !batch.device_calibration)
        return Status(Code::kInvalidArgument, "KVC1 blob names a calibration: device_calibration is needed");
      *calibrated = true;
    }
    if (full) KDN_RETURN_IF_ERROR(validate_layers(batch.host_blobs[i], h, *layers, opts));
  }
  return OkStatus();
}

Status launch(const Kvc1CudaBatch& batch, const ChunkGeometry& expected, const kdn_key& fingerprint,
              void* device_scratch, size_t scratch_bytes, void* stream, const DecodeOptions& opts, bool validate);

}  // namespace

Status kvc1_validate_batch(const Kvc1CudaBatch& batch, const ChunkGeometry& expected, const kdn_key& fingerprint,
                           const DecodeOptions& opts) noexcept {
  if (batch.n == 0 || !batch.host_blobs || !batch.blob_bytes)
    return Status(Code::kInvalidArgument, "null or empty batch");
  for (uint32_t i = 0; i < batch.n; ++i) {
    if (!batch.host_blobs[i]) return Status(Code::kInvalidArgument, "null blob");
  }
  LayerRange layers;
  bool calibrated = false;
  return open_batch(batch, expected, fingerprint, opts, true, false, &layers, &calibrated);
}

Status kvc1_decode_cuda(const Kvc1CudaBatch& batch, const ChunkGeometry& expected, const kdn_key& fingerprint,
                        void* device_scratch, size_t scratch_bytes, void* stream, const DecodeOptions& opts) noexcept {
  return launch(batch, expected, fingerprint, device_scratch, scratch_bytes, stream, opts, true);
}

Status kvc1_decode_cuda_validated(const Kvc1CudaBatch& batch, const ChunkGeometry& expected, const kdn_key& fingerprint,
                                  void* device_scratch, size_t scratch_bytes, void* stream,
                                  const DecodeOptions& opts) noexcept {
  return launch(batch, expected, fingerprint, device_scratch, scratch_bytes, stream, opts, false);
}

namespace {

Status launch(const Kvc1CudaBatch& batch, const ChunkGeometry& expected, const kdn_key& fingerprint,
              void* device_scratch, size_t scratch_bytes, void* stream, const DecodeOptions& opts, bool validate) {
  using namespace kvc1;
  static_assert(sizeof(size_t) == sizeof(uint64_t) && sizeof(void*) == sizeof(uint64_t));
  KDN_RETURN_IF_ERROR(check_batch(batch, device_scratch, scratch_bytes));
  LayerRange layers;
  bool calibrated = false;
  KDN_RETURN_IF_ERROR(open_batch(batch, expected, fingerprint, opts, validate, true, &layers, &calibrated));
  auto* base = static_cast<uint8_t*>(device_scratch);
  Job job;
  job.error = reinterpret_cast<uint32_t*>(base);
  job.blobs = reinterpret_cast<const uint8_t* const*>(base + 16);
  job.lens = reinterpret_cast<const uint64_t*>(base + 16 + 8 * size_t{batch.n});
  job.outs = reinterpret_cast<uint8_t* const*>(base + 16 + 16 * size_t{batch.n});
  job.n_chunks = batch.n;
  job.layer_begin = layers.begin;
  job.layers = layers.end - layers.begin;
  job.kv_heads = expected.kv_heads;
  job.head_dim = expected.head_dim;
  job.tokens = expected.tokens;
  job.dtype = static_cast<uint32_t>(expected.dtype);
  job.cols = calibrated ? expected.kv_heads * expected.head_dim : expected.head_dim;
  job.cal = calibrated ? static_cast<const uint8_t*>(batch.device_calibration) : nullptr;
  job.smem_per_warp = smem_bytes_per_warp(job.cols);
  const size_t smem = size_t{kWarpsPerBlock} * job.smem_per_warp;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const size_t n8 = 8 * size_t{batch.n};
  KDN_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(base, 0, 16, s)));
  // Pageable sources: each copy returns once the bytes are staged, so the caller's arrays
  // need not outlive the call.
  KDN_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(base + 16, batch.device_blobs, n8, cudaMemcpyHostToDevice, s)));
  KDN_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(base + 16 + n8, batch.blob_bytes, n8, cudaMemcpyHostToDevice, s)));
  KDN_RETURN_IF_ERROR(
      cuda_status(cudaMemcpyAsync(base + 16 + 2 * n8, batch.device_outputs, n8, cudaMemcpyHostToDevice, s)));
  if (smem > 48 * 1024) {
    KDN_RETURN_IF_ERROR(cuda_status(
        cudaFuncSetAttribute(decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem))));
    if (calibrated)
      KDN_RETURN_IF_ERROR(cuda_status(
          cudaFuncSetAttribute(rebuild_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem))));
  }
  const uint64_t warps = uint64_t{batch.n} * job.layers * 2 * job.kv_heads;
  const uint64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7fffffffu) return Status(Code::kInvalidArgument, "batch too large for one launch");
  decode_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, smem, s>>>(job);
  if (calibrated) rebuild_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, smem, s>>>(job);
  return cuda_status(cudaGetLastError());
}

}  // namespace

Status kvc1_cuda_result(const void* device_scratch, void* stream) noexcept {
  if (!device_scratch) return Status(Code::kInvalidArgument, "null scratch");
  KDN_RETURN_IF_ERROR(kvc1::cuda_status(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))));
  uint32_t flag = 0;
  KDN_RETURN_IF_ERROR(
      kvc1::cuda_status(cudaMemcpy(&flag, device_scratch, kKvc1CudaResultBytes, cudaMemcpyDeviceToHost)));
  return kvc1_cuda_result_of(flag);
}

Status kvc1_cuda_result_of(uint32_t word) noexcept {
  static_assert(sizeof word == kKvc1CudaResultBytes);
  if (word & kvc1::kErrorStructure) return Status(Code::kInternal, "KVC1 blob changed between validation and decode");
  if (word) return Status(Code::kCorrupt, "KVC1 entropy-coded stream is corrupt");
  return OkStatus();
}

}  // namespace kdn::kernels
