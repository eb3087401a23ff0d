// KVC1 encoding on a CUDA device: one kernel per stage of encode_device.h and the host entry
// points. The stages are the ones the CPU emulation test runs; only the mapping of units onto
// threads is here.
#include <kdn/kernels/codec_cuda.h>

#include "encode_device_plan.h"

#include <cuda_runtime.h>

#include <vector>

namespace kdn::kernels {
namespace kvc1 {
namespace {

constexpr uint32_t kUnitThreads = 64;    // units (planes, segments) per block of the unit kernels
constexpr uint32_t kPlaceThreads = 256;  // threads copying one plane

__device__ __forceinline__ uint64_t global_unit() { return uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; }

__global__ void params_kernel(EncodeJob j) {
  const uint64_t u = global_unit();
  if (u >= uint64_t{j.n_chunks} * 2 * j.layers) return;
  enc_params(j, static_cast<uint32_t>(u / (2 * j.layers)), static_cast<uint32_t>(u % (2 * j.layers)));
}

__global__ void segment_kernel(EncodeJob j) {
  const uint64_t u = global_unit();
  const uint64_t per_chunk = uint64_t{2} * j.layers * j.kv_heads;
  if (u >= j.n_chunks * per_chunk) return;
  const uint32_t c = static_cast<uint32_t>(u / per_chunk);
  const uint32_t r = static_cast<uint32_t>(u % per_chunk);
  enc_segment(j, c, r / j.kv_heads, r % j.kv_heads);
}

__global__ void layout_kernel(EncodeJob j) {
  const uint64_t u = global_unit();
  if (u < j.n_chunks) enc_layout(j, static_cast<uint32_t>(u));
}

__global__ void place_kernel(EncodeJob j) {
  const uint32_t c = blockIdx.x / (2 * j.layers), lp = blockIdx.x % (2 * j.layers);
  enc_place(j, c, lp, threadIdx.x, blockDim.x);
}

__device__ void load_crc_table(uint32_t* table) {
  for (uint32_t b = threadIdx.x; b < 256; b += blockDim.x) table[b] = crc32c_table_entry(b);
  __syncthreads();
}

__global__ void crc_kernel(EncodeJob j) {
  __shared__ uint32_t table[256];
  load_crc_table(table);
  const uint64_t u = global_unit();
  if (u < uint64_t{j.n_chunks} * j.layers) enc_layer_crc(j, table, static_cast<uint32_t>(u / j.layers), u % j.layers);
}

__global__ void header_kernel(EncodeJob j) {
  __shared__ uint32_t table[256];
  load_crc_table(table);
  const uint64_t u = global_unit();
  if (u < j.n_chunks) enc_header(j, table, static_cast<uint32_t>(u));
}

Status cuda_status(cudaError_t err) {
  if (err == cudaSuccess) return OkStatus();
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
    return Status(Code::kUnavailable, cudaGetErrorName(err));
  return Status(Code::kInternal, cudaGetErrorName(err));
}

unsigned blocks_for(uint64_t units, uint32_t per_block) {
  return static_cast<unsigned>((units + per_block - 1) / per_block);
}

Status check_encode_batch(const Kvc1CudaEncodeBatch& b, void* scratch) {
  if (b.n == 0 || !b.device_chunks || !b.device_outputs || !scratch)
    return Status(Code::kInvalidArgument, "null or empty batch");
  for (uint32_t i = 0; i < b.n; ++i)
    if (!b.device_chunks[i] || !b.device_outputs[i] || reinterpret_cast<uintptr_t>(b.device_outputs[i]) % kAlign != 0)
      return Status(Code::kInvalidArgument, "null chunk or output, or output not 16-byte aligned");
  return OkStatus();
}

Status enqueue_stages(const EncodeJob& j, uint64_t out_cap, const Kvc1CudaEncodeBatch& b, cudaStream_t s) {
  const uint64_t planes = uint64_t{j.n_chunks} * 2 * j.layers, segs = planes * j.kv_heads;
  if (planes > 0x7fffffffu || blocks_for(segs, kUnitThreads) > 0x7fffffffu)
    return Status(Code::kInvalidArgument, "batch too large for one launch");
  for (uint32_t i = 0; i < b.n; ++i)
    KDN_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(b.device_outputs[i], 0, out_cap, s)));
  params_kernel<<<blocks_for(planes, kUnitThreads), kUnitThreads, 0, s>>>(j);
  segment_kernel<<<blocks_for(segs, kUnitThreads), kUnitThreads, 0, s>>>(j);
  layout_kernel<<<blocks_for(j.n_chunks, kUnitThreads), kUnitThreads, 0, s>>>(j);
  place_kernel<<<static_cast<unsigned>(planes), kPlaceThreads, 0, s>>>(j);
  crc_kernel<<<blocks_for(uint64_t{j.n_chunks} * j.layers, kUnitThreads), kUnitThreads, 0, s>>>(j);
  header_kernel<<<blocks_for(j.n_chunks, kUnitThreads), kUnitThreads, 0, s>>>(j);
  return cuda_status(cudaGetLastError());
}

}  // namespace
}  // namespace kvc1

size_t kvc1_cuda_encode_scratch_bytes(const ChunkGeometry& g, const CodecConfig& cfg, uint32_t n) noexcept {
  return kvc1::device_encode_scratch_bytes(g, cfg, n);
}

Status kvc1_encode_cuda(const Kvc1CudaEncodeBatch& batch, const ChunkGeometry& g, const kdn_key& fingerprint,
                        const CodecConfig& cfg, void* device_scratch, size_t scratch_bytes, void* stream) noexcept {
  using namespace kvc1;
  KDN_RETURN_IF_ERROR(check_encode_batch(batch, device_scratch));
  EncodeJob job;
  uint64_t bytes = 0;
  auto* base = static_cast<uint8_t*>(device_scratch);
  DevicePlaneSpec host_specs[2 * kMaxLayers];  // 32 KiB: staged by the copy below before the call returns
  KDN_RETURN_IF_ERROR(plan_device_encode(g, fingerprint, cfg, batch.n, base, &job, host_specs, &bytes));
  if (scratch_bytes < bytes) return Status(Code::kInvalidArgument, "device scratch too small");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const size_t n8 = 8 * size_t{batch.n};
  // Pageable sources: each copy returns once the bytes are staged, so the caller's arrays and
  // the specs on this stack need not outlive the call.
  KDN_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(base, 0, kDeviceEncodeHeadBytes, s)));
  KDN_RETURN_IF_ERROR(cuda_status(
      cudaMemcpyAsync(const_cast<const uint8_t**>(job.chunks), batch.device_chunks, n8, cudaMemcpyHostToDevice, s)));
  KDN_RETURN_IF_ERROR(cuda_status(
      cudaMemcpyAsync(const_cast<uint8_t**>(job.outs), batch.device_outputs, n8, cudaMemcpyHostToDevice, s)));
  KDN_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(const_cast<DevicePlaneSpec*>(job.specs), host_specs,
                                                  sizeof(DevicePlaneSpec) * 2 * g.layers, cudaMemcpyHostToDevice, s)));
  return enqueue_stages(job, kvc1_max_encoded_size(g, cfg), batch, s);
}

Status kvc1_cuda_encode_result(const void* device_scratch, uint32_t n, void* stream, uint64_t* sizes) noexcept {
  if (!device_scratch || !sizes || n == 0) return Status(Code::kInvalidArgument, "null scratch or sizes");
  KDN_RETURN_IF_ERROR(kvc1::cuda_status(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))));
  std::vector<uint8_t> head(kvc1_cuda_encode_head_bytes(n));
  KDN_RETURN_IF_ERROR(kvc1::cuda_status(cudaMemcpy(head.data(), device_scratch, head.size(), cudaMemcpyDeviceToHost)));
  return kvc1_cuda_encode_result_of(head.data(), n, sizes);
}

}  // namespace kdn::kernels
