// The runtime half of cuda_api.h: devices, host registration, the T0 region, legacy IPC,
// streams, events, copies and completions. The driver's VMM calls live in cuda_driver.cc.
// Without KDN_GPU_WITH_CUDA every call answers kUnsupported; CompletionQueue is plain eventfd
// and mutex and works in both builds.
#include "cuda_api.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#if KDN_GPU_WITH_CUDA
#include <set>
#include <string>

#include "cuda_internal.h"
#endif

namespace kdn::sidecar::gpu {

// ---- CompletionQueue (both builds) -------------------------------------------------------------

CompletionQueue::CompletionQueue() noexcept : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

CompletionQueue::~CompletionQueue() {
  if (fd_ >= 0) ::close(fd_);
}

// The eventfd is read before the list is taken: a token pushed after the read is either taken
// with the list or followed by its own write, so no token is ever left behind a cleared fd
// (at worst fd() wakes the loop once with nothing to drain).
size_t CompletionQueue::drain(std::vector<Done>* out) noexcept {
  if (out == nullptr) return 0;
  uint64_t count = 0;
  while (fd_ >= 0 && ::read(fd_, &count, sizeof count) < 0 && errno == EINTR) {}
  kdn::MutexLock lock(mu_);
  const size_t n = ready_.size();
  out->insert(out->end(), ready_.begin(), ready_.end());  // out of memory ends the process
  ready_.clear();
  return n;
}

// Runs on CUDA's callback thread: no CUDA call, nothing that waits on device work.
void CompletionQueue::push(Done d) noexcept {
  {
    kdn::MutexLock lock(mu_);
    ready_.push_back(d);  // out of memory ends the process
  }
  const uint64_t one = 1;
  while (fd_ >= 0 && ::write(fd_, &one, sizeof one) < 0 && errno == EINTR) {}
}

#if KDN_GPU_WITH_CUDA

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes);
static_assert(sizeof(cudaIpcEventHandle_t) == kIpcHandleBytes);

namespace detail {

const char* error_message(const char* call, const char* name, const char* description) noexcept {
  static kdn::Mutex mu;
  static auto* messages GUARDED_BY(mu) = new std::set<std::string>;  // never freed: Statuses may outlive main
  try {
    std::string text = std::string(call) + ": " + name + " (" + description + ")";
    kdn::MutexLock lock(mu);
    return messages->insert(std::move(text)).first->c_str();
  } catch (...) {
    return call;
  }
}

Status cuda_status(const char* call, cudaError_t err) noexcept {
  if (err == cudaSuccess) return OkStatus();
  cudaGetLastError();  // the Status carries it now
  const char* what = error_message(call, cudaGetErrorName(err), cudaGetErrorString(err));
  switch (err) {
    case cudaErrorMemoryAllocation:
      return Status(Code::kNoMemory, what);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      return Status(Code::kUnavailable, what);
    case cudaErrorNotSupported:
    case cudaErrorNotPermitted:
      return Status(Code::kUnsupported, what);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle:
      return Status(Code::kInvalidArgument, what);
    default:
      return Status(Code::kInternal, what);
  }
}

Status require_device() noexcept {
  if (available()) return OkStatus();
  return Status(Code::kUnsupported, "no CUDA device: the driver is missing or reports no device");
}

Status use_device(int device) noexcept {
  KDN_RETURN_IF_ERROR(require_device());
  KDN_RETURN_IF_ERROR(cuda_status("cudaSetDevice", cudaSetDevice(device)));
  return cuda_status("cudaFree(0)", cudaFree(nullptr));
}

}  // namespace detail

using detail::cuda_status;
using detail::require_device;
using detail::use_device;

Status set_device(int device) noexcept { return use_device(device); }

namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

// Pool memory with a POSIX-fd handle type needs both pools and that handle type.
bool pool_exports_posix_fd(int device) noexcept {
  int pools = 0, handle_types = 0;
  if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&handle_types, cudaDevAttrMemoryPoolSupportedHandleTypes, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return pools != 0 && (handle_types & cudaMemHandleTypePosixFileDescriptor) != 0;
}

// cudaMallocFromPoolAsync on a stream of its own, waited for; the pool keeps what it holds.
Status allocate_from_pool(cudaMemPool_t pool, uint64_t bytes, void** out) noexcept {
  uint64_t keep = UINT64_MAX;
  KDN_RETURN_IF_ERROR(cuda_status("cudaMemPoolSetAttribute(ReleaseThreshold)",
                                  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep)));
  cudaStream_t s = nullptr;
  KDN_RETURN_IF_ERROR(cuda_status("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
  Status st = cuda_status("cudaMallocFromPoolAsync", cudaMallocFromPoolAsync(out, bytes, pool, s));
  if (st.ok()) st = cuda_status("cudaStreamSynchronize", cudaStreamSynchronize(s));
  if (!st.ok() && *out != nullptr) {
    cudaFreeAsync(*out, s);
    cudaStreamSynchronize(s);
    *out = nullptr;
  }
  cudaStreamDestroy(s);
  return st;
}

// The pool region; `*unsupported` when the device refuses an IPC pool (the caller falls back).
Status create_pool_region(DeviceRegion* r, bool* unsupported) noexcept {
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = r->device;
  cudaMemPool_t pool = nullptr;
  const cudaError_t err = cudaMemPoolCreate(&pool, &props);
  *unsupported = err == cudaErrorNotSupported;
  KDN_RETURN_IF_ERROR(cuda_status("cudaMemPoolCreate", err));
  const Status st = allocate_from_pool(pool, r->bytes, &r->base);
  if (!st.ok()) {
    cudaMemPoolDestroy(pool);
    return st;
  }
  r->pool = pool;
  r->ipc_capable = true;
  return OkStatus();
}

struct PendingNotify {
  CompletionQueue* queue;
  uint64_t token;
};

// cudaStreamAddCallback, not cudaLaunchHostFunc: a callback runs exactly once even after a
// device error (with that error as `status`), so a failed stream still completes its tokens.
void CUDART_CB notify_callback(cudaStream_t, cudaError_t status, void* data) {
  auto* n = static_cast<PendingNotify*>(data);
  n->queue->push({n->token, status != cudaSuccess});
  delete n;
}

}  // namespace

bool available() noexcept {
  static const bool answer = [] {
    int n = 0;
    const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    cudaGetLastError();  // "no driver" is an answer here, not an error to report later
    return ok;
  }();
  return answer;
}

bool can_access_peer(int from, int to) noexcept {
  if (!available()) return false;
  int yes = 0;
  if (cudaDeviceCanAccessPeer(&yes, from, to) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return yes != 0;
}

Status enable_peer_access(int from, int to) noexcept {
  KDN_RETURN_IF_ERROR(use_device(from));
  const cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return OkStatus();
  }
  return cuda_status("cudaDeviceEnablePeerAccess", err);
}

Status host_register(void* p, size_t bytes) noexcept {
  if (p == nullptr || bytes == 0) return Status(Code::kInvalidArgument, "host_register: null or empty range");
  KDN_RETURN_IF_ERROR(require_device());
  const cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (err == cudaErrorHostMemoryAlreadyRegistered) {
    cudaGetLastError();
    return OkStatus();
  }
  return cuda_status("cudaHostRegister", err);
}

void host_unregister(void* p) noexcept {
  if (p != nullptr && available()) cudaHostUnregister(p);
}

Result<DeviceRegion> region_create(int device, uint64_t bytes) noexcept {
  if (bytes == 0) return Status(Code::kInvalidArgument, "region_create: zero bytes");
  KDN_RETURN_IF_ERROR(use_device(device));
  DeviceRegion r;
  r.device = device;
  r.bytes = bytes;
  bool unsupported = !pool_exports_posix_fd(device);
  if (!unsupported) {
    const Status st = create_pool_region(&r, &unsupported);
    if (st.ok()) return r;
    if (!unsupported) return st;
  }
  // No IPC pool on this device: plain device memory, which kdnd alone uses (ipc_capable false).
  KDN_RETURN_IF_ERROR(cuda_status("cudaMalloc", cudaMalloc(&r.base, bytes)));
  return r;
}

void region_destroy(DeviceRegion& region) noexcept {
  if (region.base == nullptr && region.pool == nullptr) return;
  if (available() && cudaSetDevice(region.device) == cudaSuccess) {
    if (region.pool != nullptr) {
      // Pool memory is freed in stream order (here the legacy stream, waited for); a pool
      // destroyed with an allocation still out is released only once that allocation is freed.
      if (region.base != nullptr && cudaFreeAsync(region.base, nullptr) == cudaSuccess) cudaStreamSynchronize(nullptr);
      cudaMemPoolDestroy(static_cast<cudaMemPool_t>(region.pool));
    } else if (region.base != nullptr) {
      cudaFree(region.base);
    }
  }
  region = DeviceRegion{};
}

Result<void*> open_ipc_memory(int device, const IpcHandle& handle) noexcept {
  KDN_RETURN_IF_ERROR(use_device(device));
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.bytes, sizeof h);
  void* base = nullptr;
  KDN_RETURN_IF_ERROR(
      cuda_status("cudaIpcOpenMemHandle", cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess)));
  return base;
}

void close_ipc_memory(int device, void* base) noexcept {
  if (base == nullptr || !available()) return;
  if (cudaSetDevice(device) == cudaSuccess) cudaIpcCloseMemHandle(base);
}

Result<void*> stream_create(int device, bool low_priority) noexcept {
  KDN_RETURN_IF_ERROR(use_device(device));
  int least = 0, greatest = 0;  // numerically: least >= greatest
  KDN_RETURN_IF_ERROR(
      cuda_status("cudaDeviceGetStreamPriorityRange", cudaDeviceGetStreamPriorityRange(&least, &greatest)));
  cudaStream_t s = nullptr;
  KDN_RETURN_IF_ERROR(
      cuda_status("cudaStreamCreateWithPriority",
                  cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, low_priority ? least : greatest)));
  return static_cast<void*>(s);
}

void stream_destroy(void* stream) noexcept {
  if (stream != nullptr && available()) cudaStreamDestroy(as_stream(stream));
}

Result<void*> ipc_event_create(int device, IpcHandle* handle) noexcept {
  if (handle == nullptr) return Status(Code::kInvalidArgument, "ipc_event_create: null handle");
  KDN_RETURN_IF_ERROR(use_device(device));
  cudaEvent_t e = nullptr;
  KDN_RETURN_IF_ERROR(cuda_status("cudaEventCreateWithFlags",
                                  cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming)));
  cudaIpcEventHandle_t h;
  const Status st = cuda_status("cudaIpcGetEventHandle", cudaIpcGetEventHandle(&h, e));
  if (!st.ok()) {
    cudaEventDestroy(e);
    return st;
  }
  std::memcpy(handle->bytes, &h, sizeof h);
  return static_cast<void*>(e);
}

Result<void*> ipc_event_open(int device, const IpcHandle& handle) noexcept {
  KDN_RETURN_IF_ERROR(use_device(device));
  cudaIpcEventHandle_t h;
  std::memcpy(&h, handle.bytes, sizeof h);
  cudaEvent_t e = nullptr;
  KDN_RETURN_IF_ERROR(cuda_status("cudaIpcOpenEventHandle", cudaIpcOpenEventHandle(&e, h)));
  return static_cast<void*>(e);
}

void event_destroy(void* event) noexcept {
  if (event != nullptr && available()) cudaEventDestroy(as_event(event));
}

Status event_record(void* event, void* stream) noexcept {
  if (event == nullptr) return Status(Code::kInvalidArgument, "event_record: null event");
  KDN_RETURN_IF_ERROR(require_device());
  return cuda_status("cudaEventRecord", cudaEventRecord(as_event(event), as_stream(stream)));
}

Status stream_wait_event(void* stream, void* event) noexcept {
  if (event == nullptr) return Status(Code::kInvalidArgument, "stream_wait_event: null event");
  KDN_RETURN_IF_ERROR(require_device());
  return cuda_status("cudaStreamWaitEvent", cudaStreamWaitEvent(as_stream(stream), as_event(event), 0));
}

Status copy_async(void* dst, const void* src, size_t bytes, void* stream) noexcept {
  if (bytes == 0) return OkStatus();
  if (dst == nullptr || src == nullptr) return Status(Code::kInvalidArgument, "copy_async: null pointer");
  KDN_RETURN_IF_ERROR(require_device());
  return cuda_status("cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)));
}

Status stream_sync(void* stream) noexcept {
  KDN_RETURN_IF_ERROR(require_device());
  return cuda_status("cudaStreamSynchronize", cudaStreamSynchronize(as_stream(stream)));
}

Status notify_after(void* stream, CompletionQueue* queue, uint64_t token) noexcept {
  if (queue == nullptr || !queue->ok()) return Status(Code::kInvalidArgument, "notify_after: no usable queue");
  KDN_RETURN_IF_ERROR(require_device());
  auto* pending = new (std::nothrow) PendingNotify{queue, token};
  if (pending == nullptr) return Status(Code::kNoMemory, "notify_after: out of memory");
  const cudaError_t err = cudaStreamAddCallback(as_stream(stream), notify_callback, pending, 0);
  if (err != cudaSuccess) delete pending;  // never enqueued: nothing will push the token
  return cuda_status("cudaStreamAddCallback", err);
}

const char* last_error() noexcept { return cudaGetErrorString(cudaGetLastError()); }

#else  // !KDN_GPU_WITH_CUDA

namespace {
constexpr Status kNoCuda(Code::kUnsupported, "kdn was built without CUDA (KDN_WITH_CUDA=OFF)");
}  // namespace

bool available() noexcept { return false; }
bool can_access_peer(int, int) noexcept { return false; }
Status enable_peer_access(int, int) noexcept { return kNoCuda; }
Status host_register(void*, size_t) noexcept { return kNoCuda; }
void host_unregister(void*) noexcept {}
Result<DeviceRegion> region_create(int, uint64_t) noexcept { return kNoCuda; }
void region_destroy(DeviceRegion& region) noexcept { region = DeviceRegion{}; }
Result<void*> open_ipc_memory(int, const IpcHandle&) noexcept { return kNoCuda; }
void close_ipc_memory(int, void*) noexcept {}
Status set_device(int) noexcept { return kNoCuda; }
Result<void*> stream_create(int, bool) noexcept { return kNoCuda; }
void stream_destroy(void*) noexcept {}
Result<void*> ipc_event_create(int, IpcHandle*) noexcept { return kNoCuda; }
Result<void*> ipc_event_open(int, const IpcHandle&) noexcept { return kNoCuda; }
void event_destroy(void*) noexcept {}
Status event_record(void*, void*) noexcept { return kNoCuda; }
Status stream_wait_event(void*, void*) noexcept { return kNoCuda; }
Status copy_async(void*, const void*, size_t, void*) noexcept { return kNoCuda; }
Status stream_sync(void*) noexcept { return kNoCuda; }
Status notify_after(void*, CompletionQueue*, uint64_t) noexcept { return kNoCuda; }
const char* last_error() noexcept { return "kdn was built without CUDA"; }

#endif  // KDN_GPU_WITH_CUDA

}  // namespace kdn::sidecar::gpu
