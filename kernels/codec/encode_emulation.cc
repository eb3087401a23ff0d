// The device encoder's result head and its CPU emulation (codec_cuda.h): both read or run the
// stages of encode_device.h over the scratch layout of encode_device_plan.h, without CUDA.
#include <kdn/kernels/codec_cuda.h>

#include "encode_device_plan.h"

#include <cstring>

namespace kdn::kernels {

size_t kvc1_cuda_encode_head_bytes(uint32_t n) noexcept { return kvc1::kDeviceEncodeHeadBytes + 8 * size_t{n}; }

Status kvc1_cuda_encode_result_of(const void* head, uint32_t n, uint64_t* sizes) noexcept {
  if (!head || !sizes || n == 0) return Status(Code::kInvalidArgument, "null head or sizes");
  uint32_t word = 0;
  std::memcpy(&word, head, 4);
  if (word & kvc1::kEncErrorNonFinite) return Status(Code::kInvalidArgument, "NaN or Inf in a chunk to quantize");
  if (word & kvc1::kEncErrorRange)
    return Status(Code::kInvalidArgument, "chunk values span more than fp32 scales can hold");
  if (word) return Status(Code::kInternal, "device encoder failed");
  std::memcpy(sizes, static_cast<const uint8_t*>(head) + kvc1::kDeviceEncodeHeadBytes, 8 * size_t{n});
  return OkStatus();
}

size_t kvc1_encode_emulated_scratch_bytes(const ChunkGeometry& g, const CodecConfig& cfg, uint32_t n) noexcept {
  return kvc1::device_encode_scratch_bytes(g, cfg, n);
}

Status kvc1_encode_emulated(const Kvc1CudaEncodeBatch& batch, const ChunkGeometry& g, const kdn_key& fingerprint,
                            const CodecConfig& cfg, void* scratch, size_t scratch_bytes,
                            uint32_t place_threads) noexcept {
  using namespace kvc1;
  if (batch.n == 0 || !batch.device_chunks || !batch.device_outputs || !scratch || place_threads == 0)
    return Status(Code::kInvalidArgument, "null or empty batch");
  EncodeJob job;
  uint64_t bytes = 0;
  auto* base = static_cast<uint8_t*>(scratch);
  DevicePlaneSpec specs[2 * kMaxLayers];
  KDN_RETURN_IF_ERROR(plan_device_encode(g, fingerprint, cfg, batch.n, base, &job, specs, &bytes));
  if (scratch_bytes < bytes) return Status(Code::kInvalidArgument, "scratch too small");
  // What the launcher's copies and memsets do before the first stage.
  std::memset(base, 0, kDeviceEncodeHeadBytes);
  std::memcpy(const_cast<const uint8_t**>(job.chunks), batch.device_chunks, 8 * size_t{batch.n});
  std::memcpy(const_cast<uint8_t**>(job.outs), batch.device_outputs, 8 * size_t{batch.n});
  std::memcpy(const_cast<DevicePlaneSpec*>(job.specs), specs, sizeof(DevicePlaneSpec) * 2 * g.layers);
  const uint64_t cap = kvc1_max_encoded_size(g, cfg);
  for (uint32_t c = 0; c < batch.n; ++c) std::memset(batch.device_outputs[c], 0, cap);
  const uint32_t planes = 2 * g.layers;
  for (uint32_t c = 0; c < batch.n; ++c)
    for (uint32_t lp = 0; lp < planes; ++lp) enc_params(job, c, lp);
  for (uint32_t c = 0; c < batch.n; ++c)
    for (uint32_t lp = 0; lp < planes; ++lp)
      for (uint32_t h = 0; h < g.kv_heads; ++h) enc_segment(job, c, lp, h);
  for (uint32_t c = 0; c < batch.n; ++c) enc_layout(job, c);
  for (uint32_t c = 0; c < batch.n; ++c)
    for (uint32_t lp = 0; lp < planes; ++lp)
      for (uint32_t t = 0; t < place_threads; ++t) enc_place(job, c, lp, t, place_threads);
  uint32_t table[256];
  for (uint32_t b = 0; b < 256; ++b) table[b] = crc32c_table_entry(b);
  for (uint32_t c = 0; c < batch.n; ++c)
    for (uint32_t l = 0; l < g.layers; ++l) enc_layer_crc(job, table, c, l);
  for (uint32_t c = 0; c < batch.n; ++c) enc_header(job, table, c);
  return OkStatus();
}

}  // namespace kdn::kernels
