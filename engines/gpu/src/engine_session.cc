#include <kdn/gpu_engine/engine_session.h>

#include "cuda_check.h"

#include <kdn/common/model_presets.h>

#include <chrono>
#include <cstring>
#include <thread>

namespace kdn::gpu_engine {

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

EngineStatus wait_stream(void* stream, uint32_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto s = static_cast<cudaStream_t>(stream);
  // Spin first (copies of a chunk take tens of microseconds; a sleep would be the measurement),
  // then back off to short sleeps.
  for (uint64_t polls = 0;; ++polls) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return {};
    if (e != cudaErrorNotReady) return cuda_status(e, "cudaStreamQuery");
    if (std::chrono::steady_clock::now() > deadline) {
      return {KDN_ERR_TIMEOUT, "the engine stream did not drain in " + std::to_string(timeout_ms) +
                                   " ms (kdnd's copies or its done event never completed)"};
    }
    if (polls > 100000) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

EngineStatus wait_event(void* event, uint32_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (e == cudaSuccess) return {};
    if (e != cudaErrorNotReady) return cuda_status(e, "cudaEventQuery");
    if (std::chrono::steady_clock::now() > deadline) {
      return {KDN_ERR_TIMEOUT, "an event did not complete in " + std::to_string(timeout_ms) + " ms"};
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

EngineStatus EngineSession::open(const SessionOptions& options, std::unique_ptr<EngineSession>* out) {
  std::unique_ptr<EngineSession> s(new EngineSession(options));
  if (auto st = s->start(); !st.ok()) return st;
  *out = std::move(s);
  return {};
}

EngineStatus EngineSession::start() {
  const ModelPreset* preset = find_model_preset(options_.model);
  if (!preset) return {KDN_ERR_INVALID_ARGUMENT, "unknown model preset '" + options_.model + "'"};
  desc_ = preset_desc(*preset, preset->name);
  kdn_connect_opts co{};
  co.struct_size = sizeof(co);
  co.socket_path = options_.socket_path.empty() ? nullptr : options_.socket_path.c_str();
  co.name_space = options_.name_space.empty() ? nullptr : options_.name_space.c_str();
  co.timeout_ms = options_.timeout_ms;
  co.flags = KDN_CONNECT_CREATE_NAMESPACE;
  if (auto st = EngineStatus::from_kdn(kdn_connect(&co, &client_), "kdn_connect"); !st.ok()) return st;
  if (auto st = EngineStatus::from_kdn(kdn_register_model(client_, &desc_, &model_), "kdn_register_model"); !st.ok())
    return st;

  const PagedKvShape shape =
      shape_for(desc_, blocks_for_bytes(desc_, options_.kv_bytes, options_.block_size), options_.block_size);
  if (auto st = DeviceKv::create(options_.device, options_.alloc, shape, &kv_); !st.ok()) return st;
  KDN_CUDA_TRY(cudaSetDevice(options_.device));
  cudaStream_t stream = nullptr;
  KDN_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
  cudaEvent_t ev = nullptr;
  KDN_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
  engine_event_ = ev;
  KDN_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&owners_), shape.slots() * sizeof(int32_t)));
  KDN_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&counter_), sizeof(unsigned long long)));
  KDN_CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&host_owners_), shape.slots() * sizeof(int32_t)));
  KDN_CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&host_counter_), sizeof(unsigned long long)));
  cudaEvent_t upload = nullptr;
  KDN_CUDA_TRY(cudaEventCreateWithFlags(&upload, cudaEventDisableTiming));
  upload_done_ = upload;
  return register_kv();
}

EngineStatus EngineSession::register_kv() {
  if (gpu_kv_) return {KDN_ERR_INVALID_ARGUMENT, "already registered"};
  KDN_CUDA_TRY(cudaSetDevice(options_.device));  // the done event opens in this device's context
  kdn_gpu_kv_desc d;
  kv_->describe(&d);
  static_assert(sizeof(cudaIpcEventHandle_t) == KDN_GPU_HANDLE_BYTES);
  if (auto st = engine_event_handle(d.engine_event); !st.ok()) return st;
  if (auto st = EngineStatus::from_kdn(kdn_gpu_register(client_, &d, &gpu_kv_), "kdn_gpu_register"); !st.ok()) {
    gpu_kv_ = nullptr;
    return st;
  }
  const uint8_t* done = kdn_gpu_kv_done_event(gpu_kv_);
  if (!done) return {KDN_ERR_INTERNAL, "kdn_gpu_kv_done_event: no event handle"};
  cudaIpcEventHandle_t dh;
  std::memcpy(&dh, done, sizeof(dh));
  cudaEvent_t ev = nullptr;
  if (EngineStatus st = cuda_status(cudaIpcOpenEventHandle(&ev, dh), "cudaIpcOpenEventHandle(kdnd's done event)");
      !st.ok()) {
    // Registered but unusable: without the event no retrieve could be ordered. Take it back.
    (void)kdn_gpu_unregister(client_, gpu_kv_);
    gpu_kv_ = nullptr;
    return st;
  }
  done_event_ = ev;
  return {};
}

EngineStatus EngineSession::engine_event_handle(uint8_t* out) const {
  cudaIpcEventHandle_t eh;
  KDN_CUDA_TRY(cudaIpcGetEventHandle(&eh, static_cast<cudaEvent_t>(engine_event_)));
  std::memcpy(out, &eh, sizeof(eh));
  return {};
}

EngineStatus EngineSession::reregister() { return register_kv(); }

EngineStatus EngineSession::unregister() {
  if (!gpu_kv_) return {};
  // Nothing of ours may still wait on kdnd's event when it goes.
  EngineStatus st = wait();
  if (done_event_) {
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(done_event_));
    done_event_ = nullptr;
  }
  const int rc = kdn_gpu_unregister(client_, gpu_kv_);
  gpu_kv_ = nullptr;
  if (!st.ok()) return st;
  return EngineStatus::from_kdn(rc, "kdn_gpu_unregister");
}

EngineSession::~EngineSession() {
  if (client_) (void)unregister();
  if (options_.device >= 0) (void)cudaSetDevice(options_.device);
  if (stream_) {
    (void)wait_stream(stream_, options_.timeout_ms);
    (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
  if (engine_event_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(engine_event_));
  if (owners_) (void)cudaFree(owners_);
  if (counter_) (void)cudaFree(counter_);
  if (host_owners_) (void)cudaFreeHost(host_owners_);
  if (host_counter_) (void)cudaFreeHost(host_counter_);
  if (upload_done_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(upload_done_));
  kv_.reset();
  kdn_disconnect(client_);
}

uint32_t EngineSession::chunk_tokens() const noexcept { return kdn_model_chunk_tokens(model_); }

std::unique_ptr<EngineLayout> EngineSession::layout(std::vector<int64_t> slots) const {
  return std::make_unique<EngineLayout>(kv_->shape(), kv_->kv_base(), std::move(slots), desc_.dtype);
}

PagedKvView EngineSession::view(uint64_t seed) const {
  PagedKvView v;
  v.alloc = reinterpret_cast<uint8_t*>(kv_->alloc_base());
  v.alloc_bytes = kv_->alloc_bytes();
  v.shape = kv_->shape();
  v.seed = seed;
  v.owners = owners_;
  return v;
}

EngineStatus EngineSession::upload_owners(const std::vector<int32_t>& owners) {
  if (owners.size() != shape().slots()) return {KDN_ERR_INVALID_ARGUMENT, "owners: one entry per slot"};
  // The staging buffer is pinned (a copy from pageable memory may block the host on the
  // stream); its previous upload must have left it before it is overwritten.
  if (auto st = wait_event(upload_done_, options_.timeout_ms); !st.ok()) return st;
  std::memcpy(host_owners_, owners.data(), owners.size() * sizeof(int32_t));
  auto s = static_cast<cudaStream_t>(stream_);
  KDN_CUDA_TRY(cudaMemcpyAsync(owners_, host_owners_, owners.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s));
  KDN_CUDA_TRY(cudaEventRecord(static_cast<cudaEvent_t>(upload_done_), s));
  return {};
}

EngineStatus EngineSession::fill(uint64_t seed, const std::vector<int32_t>& owners) {
  // Kernels launch on the calling thread's current device: make it the cache's.
  KDN_CUDA_TRY(cudaSetDevice(options_.device));
  if (auto st = upload_owners(owners); !st.ok()) return st;
  return launch_fill(view(seed), stream_);
}

EngineStatus EngineSession::store(const std::vector<int32_t>& tokens, const EngineLayout& layout, uint32_t first_chunk,
                                  uint32_t n_chunks, uint32_t* stored) {
  if (!gpu_kv_) return {KDN_ERR_INVALID_ARGUMENT, "store: not registered"};
  KDN_CUDA_TRY(cudaSetDevice(options_.device));
  KDN_CUDA_TRY(cudaEventRecord(static_cast<cudaEvent_t>(engine_event_), static_cast<cudaStream_t>(stream_)));
  return EngineStatus::from_kdn(kdn_gpu_store(client_, model_, tokens.data(), tokens.size(), first_chunk, n_chunks,
                                              gpu_kv_, layout.get(), stored),
                                "kdn_gpu_store");
}

EngineStatus EngineSession::retrieve(const std::vector<int32_t>& tokens, const EngineLayout& layout,
                                     uint32_t max_chunks, uint32_t* loaded) {
  if (!gpu_kv_) return {KDN_ERR_INVALID_ARGUMENT, "retrieve: not registered"};
  KDN_CUDA_TRY(cudaSetDevice(options_.device));
  // kdnd's copies run on its own streams: what we queued before (a fill) must be done first.
  if (auto st = wait(); !st.ok()) return st;
  if (auto st = EngineStatus::from_kdn(
          kdn_gpu_retrieve(client_, model_, tokens.data(), tokens.size(), max_chunks, gpu_kv_, layout.get(), loaded),
          "kdn_gpu_retrieve");
      !st.ok())
    return st;
  KDN_CUDA_TRY(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), static_cast<cudaEvent_t>(done_event_), 0));
  return {};
}

EngineStatus EngineSession::verify(uint64_t seed, const std::vector<int32_t>& owners, uint64_t* mismatches) {
  KDN_CUDA_TRY(cudaSetDevice(options_.device));
  auto s = static_cast<cudaStream_t>(stream_);
  // Everything rides the stream behind the done-event wait, so nothing overtakes kdnd's copies.
  if (auto st = upload_owners(owners); !st.ok()) return st;
  KDN_CUDA_TRY(cudaMemsetAsync(counter_, 0, sizeof(*counter_), s));
  if (auto st = launch_verify(view(seed), counter_, s); !st.ok()) return st;
  *host_counter_ = ~0ull;
  KDN_CUDA_TRY(cudaMemcpyAsync(host_counter_, counter_, sizeof(*counter_), cudaMemcpyDeviceToHost, s));
  if (auto st = wait(); !st.ok()) return st;
  // kdnd answered the retrieves once their copies were queued: whether they landed whole is
  // asked now (nothing is sent when nothing was retrieved since the last check).
  if (gpu_kv_) {
    if (auto st = EngineStatus::from_kdn(kdn_gpu_check(client_, gpu_kv_), "kdn_gpu_check"); !st.ok()) return st;
  }
  *mismatches = *host_counter_;
  return {};
}

EngineStatus EngineSession::wait() { return wait_stream(stream_, options_.timeout_ms); }

}  // namespace kdn::gpu_engine
