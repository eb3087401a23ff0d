// The CUDA side of kdn_kernels in a build without CUDA: every op reports kUnsupported.
#include <kdn/kernels/device.h>

#include "copy_impl.h"

namespace kdn::kernels {
namespace {
Status unsupported() { return Status(Code::kUnsupported, "built without CUDA"); }
}  // namespace

namespace detail {
bool cuda_is_built() { return false; }
int cuda_devices() { return 0; }
Status scatter_cuda(const void*, const ChunkGeometry&, const EngineView&, Layers, void*) { return unsupported(); }
Status gather_cuda(const EngineView&, void*, const ChunkGeometry&, Layers, void*) { return unsupported(); }
Status rope_scatter_cuda(const void*, const ChunkGeometry&, const EngineView&, const RopeTable&, Layers, void*) {
  return unsupported();
}
Status rope_chunk_cuda(void*, const ChunkGeometry&, const RopeTable&, Layers, void*) { return unsupported(); }
Status kv_deviation_cuda(const TokenRows&, const TokenRows&, uint32_t, const uint8_t*, float*, void*) {
  return unsupported();
}
Result<size_t> top_k_scratch_cuda(uint32_t) { return unsupported(); }
Status select_top_k_cuda(const float*, const uint8_t*, uint32_t, uint32_t, int32_t*, uint32_t*, void*, size_t, void*) {
  return unsupported();
}
Status merge_rows_cuda(const TokenRows&, const int32_t*, uint32_t, const MutableTokenRows&, uint32_t, void*) {
  return unsupported();
}
}  // namespace detail

Status device_alloc(size_t, void** out) noexcept {
  if (out) *out = nullptr;
  return unsupported();
}
void device_free(void*) noexcept {}
Status copy_to_device(void*, const void*, size_t) noexcept { return unsupported(); }
Status copy_to_host(void*, const void*, size_t) noexcept { return unsupported(); }
Status copy_device_to_device(void*, const void*, size_t, void*) noexcept { return unsupported(); }
Status device_memset(void*, int, size_t) noexcept { return unsupported(); }
Status stream_create(void** stream) noexcept {
  if (stream) *stream = nullptr;
  return unsupported();
}
void stream_destroy(void*) noexcept {}
Status stream_sync(void*) noexcept { return unsupported(); }
Status time_on_stream(void*, Status (*)(void*), void*, float*) noexcept { return unsupported(); }

}  // namespace kdn::kernels
