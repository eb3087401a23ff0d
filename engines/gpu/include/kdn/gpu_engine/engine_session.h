// EngineSession: one engine's connection to kdnd with its paged KV cache registered on one
// device — what a GPU serving engine holds while it runs.
//
//   open():     connect, register the model, allocate the cache (DeviceKv), create a stream
//               and an interprocess event, kdn_gpu_register, open kdnd's done event.
//   fill():     the pattern kernel over the whole cache (tokens where `owners` says, canaries
//               elsewhere), on the session's stream.
//   store():    records the engine event after the fill, then kdn_gpu_store.
//   retrieve(): waits for the session's stream (kdnd's copies must land after our own writes),
//               kdn_gpu_retrieve, then cudaStreamWaitEvent(done event) on the stream.
//   verify():   the verify kernel after the retrieve, bounded wait, kdn_gpu_check (kdnd says
//               whether its copies landed whole), the mismatch count.
//
// Every wait on the device is bounded (wait_ms): a stream that does not drain in time is
// KDN_ERR_TIMEOUT, never a hang.
//
// Ownership: the session owns its client, registration, cache, stream and events; destroying
// it unregisters (if still registered) before freeing the memory. Thread safety: none, except
// that retrieve()/wait() may run on one thread while another thread only launches work on its
// own streams (the bench's decode steps).
#pragma once

#include <kdn/gpu_engine/device_kv.h>
#include <kdn/gpu_engine/engine_status.h>
#include <kdn/gpu_engine/kv_kernels.h>
#include <kdn/gpu_engine/paged_kv.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kdn::gpu_engine {

struct SessionOptions {
  std::string socket_path;          // "" = libkdn's default
  std::string name_space;           // "" = default
  std::string model = "llama3-8b";  // a preset of kdn/common/model_presets.h
  int device = 0;
  AllocKind alloc = AllocKind::kIpc;
  uint64_t kv_bytes = 0;  // cache size; rounded down to whole blocks (at least one)
  uint32_t block_size = 16;
  uint32_t timeout_ms = 60000;  // connection default, and the bound of every device wait
};

class EngineSession {
 public:
  static EngineStatus open(const SessionOptions& options, std::unique_ptr<EngineSession>* out);
  ~EngineSession();
  EngineSession(const EngineSession&) = delete;
  EngineSession& operator=(const EngineSession&) = delete;

  EngineStatus fill(uint64_t seed, const std::vector<int32_t>& owners);
  EngineStatus store(const std::vector<int32_t>& tokens, const EngineLayout& layout, uint32_t first_chunk,
                     uint32_t n_chunks, uint32_t* stored);
  EngineStatus retrieve(const std::vector<int32_t>& tokens, const EngineLayout& layout, uint32_t max_chunks,
                        uint32_t* loaded);
  // Verifies the whole cache against `seed` and `owners` (after a retrieve); waits.
  EngineStatus verify(uint64_t seed, const std::vector<int32_t>& owners, uint64_t* mismatches);
  // Bounded wait for everything queued on the session's stream (kdnd's copies included).
  EngineStatus wait();
  EngineStatus unregister();
  // Registers the cache again (after unregister()).
  EngineStatus reregister();

  // cudaIpcGetEventHandle of the engine event (KDN_GPU_HANDLE_BYTES bytes to `out`).
  EngineStatus engine_event_handle(uint8_t* out) const;
  // A layout over this cache for `slots` (fp16, the model's dtype).
  std::unique_ptr<EngineLayout> layout(std::vector<int64_t> slots) const;

  kdn_client* client() const noexcept { return client_; }
  kdn_model* model() const noexcept { return model_; }
  const kdn_model_desc& desc() const noexcept { return desc_; }
  const PagedKvShape& shape() const noexcept { return kv_->shape(); }
  const DeviceKv& kv() const noexcept { return *kv_; }
  uint32_t chunk_tokens() const noexcept;
  void* stream() const noexcept { return stream_; }
  uint32_t timeout_ms() const noexcept { return options_.timeout_ms; }
  bool registered() const noexcept { return gpu_kv_ != nullptr; }

 private:
  explicit EngineSession(const SessionOptions& o) : options_(o) {}
  EngineStatus start();
  EngineStatus register_kv();
  EngineStatus upload_owners(const std::vector<int32_t>& owners);
  PagedKvView view(uint64_t seed) const;

  SessionOptions options_;
  kdn_model_desc desc_{};
  kdn_client* client_ = nullptr;
  kdn_model* model_ = nullptr;
  std::unique_ptr<DeviceKv> kv_;
  void* stream_ = nullptr;                      // cudaStream_t
  void* engine_event_ = nullptr;                // cudaEvent_t (interprocess, ours)
  void* done_event_ = nullptr;                  // cudaEvent_t (kdnd's, opened)
  int32_t* owners_ = nullptr;                   // device: shape().slots()
  unsigned long long* counter_ = nullptr;       // device: one word for verify
  int32_t* host_owners_ = nullptr;              // pinned staging of owners_
  unsigned long long* host_counter_ = nullptr;  // pinned readback of counter_
  void* upload_done_ = nullptr;                 // cudaEvent_t: host_owners_ may be rewritten
  kdn_gpu_kv* gpu_kv_ = nullptr;
};

// Waits up to timeout_ms for `stream` (a cudaStream_t) to drain, polling; KDN_ERR_TIMEOUT if it
// does not, the stream's error if it failed.
EngineStatus wait_stream(void* stream, uint32_t timeout_ms);

// The same for an event (a cudaEvent_t; one never recorded counts as complete).
EngineStatus wait_event(void* event, uint32_t timeout_ms);

// Number of CUDA devices (0 without a driver or a device).
int device_count() noexcept;

}  // namespace kdn::gpu_engine
