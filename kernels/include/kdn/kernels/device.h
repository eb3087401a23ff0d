// Minimal CUDA device-memory and stream helpers, so host code (tests, benchmarks, the sidecar's
// T0 tier glue) can drive the CUDA ops without including CUDA headers.
//
// Every function returns kUnsupported in a build without CUDA and kUnavailable when the runtime
// reports no usable device; other CUDA errors map to kInternal with the error's name in what().
// Memory from device_alloc is owned by the caller and freed with device_free.
#pragma once

#include <kdn/common/status.h>

#include <cstddef>

namespace kdn::kernels {

Status device_alloc(size_t bytes, void** out) noexcept;
void device_free(void* p) noexcept;
Status copy_to_device(void* dst, const void* src, size_t bytes) noexcept;
Status copy_to_host(void* dst, const void* src, size_t bytes) noexcept;
Status copy_device_to_device(void* dst, const void* src, size_t bytes, void* stream) noexcept;
Status device_memset(void* dst, int value, size_t bytes) noexcept;

Status stream_create(void** stream) noexcept;
void stream_destroy(void* stream) noexcept;
Status stream_sync(void* stream) noexcept;

// Milliseconds the work `enqueue(ctx)` puts on `stream` takes, measured with CUDA events recorded
// before and after it (enqueue is called once; its error, if any, is returned).
Status time_on_stream(void* stream, Status (*enqueue)(void* ctx), void* ctx, float* ms) noexcept;

}  // namespace kdn::kernels
