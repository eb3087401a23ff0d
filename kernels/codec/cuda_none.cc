// Builds without CUDA: the GPU decoder and encoder report that they are not there.
#include <kdn/kernels/codec_cuda.h>

namespace kdn::kernels {

size_t kvc1_cuda_scratch_bytes(uint32_t) noexcept { return 0; }

Status kvc1_decode_cuda(const Kvc1CudaBatch&, const ChunkGeometry&, const kdn_key&, void*, size_t, void*,
                        const DecodeOptions&) noexcept {
  return Status(Code::kUnsupported, "kdn was built without CUDA");
}

Status kvc1_validate_batch(const Kvc1CudaBatch&, const ChunkGeometry&, const kdn_key&, const DecodeOptions&) noexcept {
  return Status(Code::kUnsupported, "kdn was built without CUDA");
}

Status kvc1_decode_cuda_validated(const Kvc1CudaBatch&, const ChunkGeometry&, const kdn_key&, void*, size_t, void*,
                                  const DecodeOptions&) noexcept {
  return Status(Code::kUnsupported, "kdn was built without CUDA");
}

Status kvc1_cuda_result(const void*, void*) noexcept {
  return Status(Code::kUnsupported, "kdn was built without CUDA");
}

Status kvc1_cuda_result_of(uint32_t) noexcept { return Status(Code::kUnsupported, "kdn was built without CUDA"); }

size_t kvc1_cuda_encode_scratch_bytes(const ChunkGeometry&, const CodecConfig&, uint32_t) noexcept { return 0; }

Status kvc1_encode_cuda(const Kvc1CudaEncodeBatch&, const ChunkGeometry&, const kdn_key&, const CodecConfig&, void*,
                        size_t, void*) noexcept {
  return Status(Code::kUnsupported, "kdn was built without CUDA");
}

Status kvc1_cuda_encode_result(const void*, uint32_t, void*, uint64_t*) noexcept {
  return Status(Code::kUnsupported, "kdn was built without CUDA");
}

}  // namespace kdn::kernels
