// Host side of the device encoder (encode_device.h): the checked plan of a batch and the layout
// of its device scratch. The CUDA launcher (encode_cuda.cu) and the CPU emulation in tests use
// the same plan, so they run the same stages over the same memory layout.
#pragma once

#include "encode_device.h"

#include <kdn/common/status.h>
#include <kdn/kernels/codec.h>

#include <cstddef>
#include <cstdint>

namespace kdn::kernels::kvc1 {

// Plans an encode of n chunks of geometry g with cfg into scratch at `base` (device or host
// memory; only addresses are computed, nothing is touched). On success *job points into
// [base, base + *bytes) and specs[0, 2 * layers) holds the plane specs the caller copies to
// job->specs. base may be null to size the scratch only. Errors: kInvalidArgument (geometry,
// config), kUnsupported (a mode the device encoder does not run: raw and lossless).
Status plan_device_encode(const ChunkGeometry& g, const kdn_key& fingerprint, const CodecConfig& cfg, uint32_t n,
                          uint8_t* base, EncodeJob* job, DevicePlaneSpec* specs, uint64_t* bytes) noexcept;

// Bytes of device scratch an encode of n chunks needs; 0 for a geometry or config the device
// encoder refuses.
inline size_t device_encode_scratch_bytes(const ChunkGeometry& g, const CodecConfig& cfg, uint32_t n) noexcept {
  EncodeJob job;
  uint64_t bytes = 0;
  if (!plan_device_encode(g, kdn_key{}, cfg, n, nullptr, &job, nullptr, &bytes).ok()) return 0;
  return static_cast<size_t>(bytes);
}

// Start of the scratch's pointer arrays (chunks, outs: n each) and result words, which the
// launcher fills: the error word at offset 0, then written[n], chunks[n], outs[n].
constexpr uint64_t kDeviceEncodeHeadBytes = 16;

}  // namespace kdn::kernels::kvc1
