// The CUDA calls kdnd's GPU tier makes, behind a header with no CUDA types, so that the rest of
// kdnd (and every CPU-only test) builds without the toolkit. Streams, events and pools are
// opaque pointers. In a build without KDN_WITH_CUDA, or on a machine without a driver or a
// device, available() is false and every other call returns kUnsupported (or does nothing).
//
// The CUDA runtime is linked statically: it loads libcuda.so.1 on the first call, so kdnd
// starts on a machine without the driver.
//
// Thread safety: every function may be called from any thread; each sets the device it works
// on itself (cudaSetDevice), so callers never track the current device.
#pragma once

#include <kdn/common/mutex.h>
#include <kdn/common/status.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kdn::sidecar::gpu {

constexpr size_t kIpcHandleBytes = 64;  // cudaIpcMemHandle_t and cudaIpcEventHandle_t
struct IpcHandle {
  uint8_t bytes[kIpcHandleBytes] = {};
};

struct DeviceInfo {
  int ordinal = -1;
  char name[96] = {};
  uint8_t uuid[16] = {};
  int pci_domain = 0, pci_bus = 0, pci_device = 0;
  uint64_t memory_bytes = 0;
  int sm_major = 0, sm_minor = 0;
  bool vmm_supported = false;     // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  bool posix_fd_handles = false;  // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
};

// True when this build has CUDA and a driver with at least one device answers.
bool available() noexcept;
// Every visible device, in ordinal order (empty when !available()).
std::vector<DeviceInfo> devices() noexcept;
// The ordinal whose uuid is `uuid`, or kNotFound.
Result<int> device_by_uuid(const uint8_t uuid[16]) noexcept;
// Makes `device` this thread's current device (its primary context current), for launches
// that take no device: the kernels of kdn/kernels run on the current device.
Status set_device(int device) noexcept;
// cudaDeviceCanAccessPeer(from, to).
bool can_access_peer(int from, int to) noexcept;
// Lets `from` address `to`'s memory (idempotent: already-enabled is success).
Status enable_peer_access(int from, int to) noexcept;

// ---- T1: page-locks host memory so copies to and from devices run at DMA speed -------------
// cudaHostRegister(portable | mapped). `p` and `bytes` must stay as registered until unregister.
// A range already registered (by anyone in this process) is success; unregister undoes it for all.
Status host_register(void* p, size_t bytes) noexcept;
void host_unregister(void* p) noexcept;

// ---- T0: one device region per device, from an IPC-capable memory pool ----------------------
// A cudaMemPool created with POSIX-fd handle type, one allocation of `bytes` from it; kdnd
// sub-allocates chunk slots itself. Engines never map it (kdnd does every copy), the handle
// type keeps a read-only export possible. A device without POSIX-fd pools gets plain cudaMalloc
// memory instead: pool stays null and ipc_capable false. region_destroy frees either; no copy
// may still be in flight on the region.
struct DeviceRegion {
  int device = -1;
  void* base = nullptr;
  uint64_t bytes = 0;
  void* pool = nullptr;      // cudaMemPool_t
  bool ipc_capable = false;  // from a POSIX-fd pool (exportable)
};
Result<DeviceRegion> region_create(int device, uint64_t bytes) noexcept;
void region_destroy(DeviceRegion& region) noexcept;

// ---- engine memory, opened once per registration --------------------------------------------
// Legacy IPC (cudaIpcGetMemHandle in the engine): returns kdnd's address of the allocation's base.
Result<void*> open_ipc_memory(int device, const IpcHandle& handle) noexcept;
void close_ipc_memory(int device, void* base) noexcept;
// VMM (cuMemExportToShareableHandle with a POSIX fd in the engine): imports the fd, reserves
// `bytes` of address space, maps it and grants `device` read-write access. The fd stays the
// caller's (close it after). `bytes` is the exported allocation's size, a multiple of the
// device's allocation granularity (kInvalidArgument otherwise). The driver's VMM calls are
// looked up at first use; a driver without them answers kUnsupported.
Result<void*> import_vmm_memory(int device, int fd, uint64_t bytes) noexcept;
// Unmaps and frees the address range; `bytes` as given to import_vmm_memory.
void unmap_vmm_memory(void* base, uint64_t bytes) noexcept;

// ---- streams, events, copies -------------------------------------------------------------------
// A non-blocking stream; low priority for bulk copies (the engine's own work goes first).
Result<void*> stream_create(int device, bool low_priority) noexcept;
void stream_destroy(void* stream) noexcept;
// An interprocess event (cudaEventInterprocess | cudaEventDisableTiming) and its handle.
Result<void*> ipc_event_create(int device, IpcHandle* handle) noexcept;
// Opens an engine's interprocess event.
Result<void*> ipc_event_open(int device, const IpcHandle& handle) noexcept;
void event_destroy(void* event) noexcept;
Status event_record(void* event, void* stream) noexcept;
Status stream_wait_event(void* stream, void* event) noexcept;
// cudaMemcpyAsync(cudaMemcpyDefault): any of host (registered), device, peer device (UVA).
Status copy_async(void* dst, const void* src, size_t bytes, void* stream) noexcept;
Status stream_sync(void* stream) noexcept;

// ---- completions to kdnd's event loop -----------------------------------------------------------
// An eventfd plus a queue of tokens: notify_after(stream, token) pushes `token` and makes fd()
// readable once the work queued on `stream` so far has run (cudaStreamAddCallback; the host
// function only locks, pushes and writes the eventfd). A token whose stream failed is pushed
// with failed = true (the callback runs exactly once, with the stream's error). Each queue must
// outlive every notify_after still pending on it: destroy it only after its streams are synced.
class CompletionQueue {
 public:
  struct Done {
    uint64_t token = 0;
    bool failed = false;
  };
  CompletionQueue() noexcept;
  ~CompletionQueue();
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;
  bool ok() const noexcept { return fd_ >= 0; }
  int fd() const noexcept { return fd_; }
  // Takes every ready token (clears the eventfd); never blocks.
  size_t drain(std::vector<Done>* out) noexcept;
  void push(Done d) noexcept;  // any thread

 private:
  int fd_ = -1;
  kdn::Mutex mu_;
  std::vector<Done> ready_ GUARDED_BY(mu_);
};
// An error return means nothing was enqueued and the token will never be pushed.
Status notify_after(void* stream, CompletionQueue* queue, uint64_t token) noexcept;

// The last CUDA error of this thread in words (for logs), and clears it.
const char* last_error() noexcept;

}  // namespace kdn::sidecar::gpu
