#include "gpu_service.h"
#include "gpu_service_internal.h"

#include "session.h"
#include "gpu/client_fd.h"
#include "gpu_rope.h"

#include <kdn/common/clock.h>
#include <kdn/kernels/blend.h>
#include <kdn/kernels/ops.h>

#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace kdn::sidecar::gpu {
namespace {

constexpr uint64_t kMetaAlign = 256;  // device pointers and slots stay aligned for the kernels
constexpr uint64_t kT0SlabBytes = 64ull << 20;

Status cuda_error(const char* what, const Status& st) {
  return Status(st.code() == Code::kOk ? Code::kInternal : st.code(), what);
}

// The engine sees only KDN_ERR_PERMISSION: the log says why, a line a second at most (an engine
// may retry in a loop). Only the event loop registers.
bool ptrace_warning_due() {
  static uint64_t last_ns = 0;
  const uint64_t now = now_ns();
  if (last_ns != 0 && now - last_ns < 1'000'000'000) return false;
  last_ns = now;
  return true;
}

std::string mapping_key(int device, const uint8_t* handle) {
  std::string k(sizeof(int) + kIpcHandleBytes, '\0');
  std::memcpy(k.data(), &device, sizeof device);
  std::memcpy(k.data() + sizeof device, handle, kIpcHandleBytes);
  return k;
}

bool all_zero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i]) return false;
  return true;
}

}  // namespace

// The fault seam of the GPU tier's tests: the batch of the N-th retrieve is reported failed
// when it lands (its copies ran), as a copy that failed on the device would be.
GpuService::GpuService(const GpuTierConfig& cfg, uint64_t fail_retrieve) : cfg_(cfg), fail_retrieve_(fail_retrieve) {}

bool GpuService::inject_failure() noexcept { return fail_retrieve_ != 0 && ++retrieves_seen_ == fail_retrieve_; }

Result<std::unique_ptr<GpuService>> GpuService::create(const GpuTierConfig& cfg, uint64_t fail_retrieve) {
  std::unique_ptr<GpuService> s(new GpuService(cfg, fail_retrieve));
  if (cfg.enable == "off") {
    s->off_reason_ = "tier.gpu.enable = off";
    s->off_status_ = "GPU tier off: " + s->off_reason_;
    return s;
  }
  if (!available()) {
    s->off_reason_ = "no CUDA device answers (no driver, no device, or a build without CUDA)";
    s->off_status_ = "GPU tier off: " + s->off_reason_;
    if (cfg.enable == "on")
      return Status(Code::kUnavailable,
                    "tier.gpu.enable = on but no CUDA device answers (no driver, no device, or a build without CUDA)");
    return s;
  }
  Status st = s->start();
  if (!st.ok()) {
    s->off_reason_ = std::string("setting up the GPU tier failed: ") + st.what();
    s->off_status_ = "GPU tier off: " + s->off_reason_;
    s->devices_.clear();
    s->cq_.reset();
    if (cfg.enable == "on")
      return Status(Code::kUnavailable, "tier.gpu.enable = on but setting up the GPU tier failed (see the log)");
    spdlog::warn("{}", s->off_reason_);
    return s;
  }
  s->enabled_ = true;
  return s;
}

Status GpuService::start() {
  cq_ = std::make_unique<CompletionQueue>();
  if (!cq_->ok()) return Status(Code::kUnavailable, "no eventfd for GPU completions");
  registry_ = std::make_unique<GpuRegistry>(cfg_.max_registrations, [this](Registration& r) { close(r); });
  const std::vector<DeviceInfo> infos = devices();
  if (infos.empty()) return Status(Code::kUnavailable, "no device listed");
  if (infos.size() > ipc::kGpuMaxDevices) return Status(Code::kUnavailable, "more devices than kdnd supports");
  for (const DeviceInfo& info : infos) {
    auto d = std::make_unique<Device>();
    d->info = info;
    KDN_RETURN_IF_ERROR(open_device(info.ordinal, *d));
    devices_.push_back(std::move(d));
  }
  for (auto& d : devices_) d->peer_enabled.assign(devices_.size(), 0);
  landings_ = PinnedLandings::create(PinSeam{host_register, host_unregister}, cfg_.staging_bytes);
  return start_codec();
}

Status GpuService::open_device(int ordinal, Device& d) {
  auto stream = stream_create(ordinal, /*low_priority=*/true);
  if (!stream.ok()) return cuda_error("creating a stream failed", stream.status());
  d.stream = *stream;
  auto scratch = region_create(ordinal, cfg_.staging_bytes);
  if (!scratch.ok()) return cuda_error("allocating the staging area failed", scratch.status());
  d.scratch = *scratch;
  d.bounce_bytes = cfg_.staging_bytes / 2;
  const uint64_t meta_bytes = cfg_.staging_bytes - d.bounce_bytes;
  d.host_meta = static_cast<std::byte*>(std::aligned_alloc(4096, (meta_bytes + 4095) / 4096 * 4096));
  if (d.host_meta == nullptr) return Status(Code::kNoMemory, "no host memory for GPU request metadata");
  Status pinned = host_register(d.host_meta, meta_bytes);
  if (!pinned.ok()) return cuda_error("page-locking the metadata area failed", pinned);
  d.host_meta_pinned = true;
  d.meta = std::make_unique<FifoRing>(meta_bytes, kMetaAlign);
  if (cfg_.bytes > 0) {
    auto t0 = region_create(ordinal, cfg_.bytes);
    if (!t0.ok()) return cuda_error("allocating T0 (tier.gpu.bytes) failed", t0.status());
    d.t0 = *t0;
    d.t0_index = std::make_unique<T0Index>(d.t0.bytes, std::min<uint64_t>(kT0SlabBytes, d.t0.bytes));
  }
  spdlog::info("GPU tier: device {} ({}), T0 {} MiB, staging {} MiB", ordinal, d.info.name, cfg_.bytes >> 20,
               cfg_.staging_bytes >> 20);
  return OkStatus();
}

GpuService::~GpuService() {
  encoders_.reset();  // no job may outlive the arenas it reads
  for (auto& d : devices_)
    if (d->stream) (void)stream_sync(d->stream);  // nothing in flight may outlive what it reads
  registry_.reset();                              // closes every registration
  for (auto& d : devices_) {
    if (d->stream) stream_destroy(d->stream);
    if (d->t0.base) region_destroy(d->t0);
    if (d->scratch.base) region_destroy(d->scratch);
    if (d->host_meta_pinned) host_unregister(d->host_meta);
    if (d->blobs)
      d->blobs->drop_all([](T0Blob& b) {
        if (b.pinned) host_unregister(b.blob.data());
      });
    std::free(d->host_meta);
  }
  for (std::byte* p : pinned_arenas_) host_unregister(p);
}

bool GpuService::holds_any() const noexcept {
  for (const auto& d : devices_)
    if (d->t0_index && d->t0_index->resident_chunks() > 0) return true;
  return false;
}

bool GpuService::holds(uint32_t region, const Entry& e) const noexcept {
  const T0Key key{region, e.key, e.generation};
  for (const auto& d : devices_)
    if (d->t0_index && d->t0_index->contains(key)) return true;
  return false;
}

int GpuService::wake_fd() const noexcept { return enabled_ && cq_ ? cq_->fd() : -1; }

void GpuService::pin_arena(std::byte* base, uint64_t bytes) noexcept {
  if (!enabled_ || !cfg_.pin_host || base == nullptr || bytes == 0) return;
  Status st = host_register(base, bytes);
  if (!st.ok()) {
    spdlog::warn("GPU tier: page-locking a host arena of {} MiB failed ({}): its copies run from pageable memory",
                 bytes >> 20, st.what());
    return;
  }
  try {
    pinned_arenas_.push_back(base);
  } catch (...) {
    host_unregister(base);
  }
}

void GpuService::unpin_arena(std::byte* base) noexcept {
  auto it = std::find(pinned_arenas_.begin(), pinned_arenas_.end(), base);
  if (it == pinned_arenas_.end()) return;
  host_unregister(base);
  pinned_arenas_.erase(it);
}

// ---- registrations --------------------------------------------------------------------------------

Result<void*> GpuService::open_memory(const Session& s, const ipc::GpuRegisterRecord& rec, int device) {
  if (rec.kind == uint32_t(ipc::GpuMemoryKind::kIpc)) {
    const std::string key = mapping_key(device, rec.ipc_handle);
    if (auto it = ipc_mappings_.find(key); it != ipc_mappings_.end()) {
      ++it->second.refs;
      return it->second.base;
    }
    IpcHandle h;
    std::memcpy(h.bytes, rec.ipc_handle, kIpcHandleBytes);
    auto base = open_ipc_memory(device, h);
    if (!base.ok()) return cuda_error("cudaIpcOpenMemHandle of the engine's memory failed", base.status());
    ipc_mappings_.emplace(key, Mapping{*base, 1});
    return *base;
  }
  auto fd = take_client_fd(s.pid, s.uid, rec.vmm_fd);
  if (!fd.ok()) {
    if (fd.status().code() == Code::kPermission && ptrace_warning_due())
      spdlog::warn("GPU_REGISTER of pid {} uid {}: {}", s.pid, s.uid, fd.status().what());
    return fd.status();
  }
  auto base = import_vmm_memory(device, *fd, rec.alloc_bytes);
  ::close(*fd);
  if (!base.ok()) return cuda_error("importing the engine's VMM memory failed", base.status());
  return *base;
}

void GpuService::close(Registration& r) noexcept {
  if (r.engine_event) event_destroy(r.engine_event);
  if (r.done_event) event_destroy(r.done_event);
  r.engine_event = r.done_event = nullptr;
  if (r.allocation == nullptr) return;
  if (r.kind == uint32_t(ipc::GpuMemoryKind::kIpc)) {
    auto it = ipc_mappings_.find(mapping_key(r.device, r.memory_handle.bytes));
    if (it != ipc_mappings_.end() && --it->second.refs == 0) {
      close_ipc_memory(r.device, it->second.base);
      ipc_mappings_.erase(it);
    }
  } else {
    unmap_vmm_memory(r.allocation, r.allocation_bytes);
  }
  r.allocation = nullptr;
  ++counters_.unregistrations;
}

Result<ipc::GpuRegisteredRecord> GpuService::register_memory(const Session& s, const ipc::GpuRegisterRecord& rec) {
  if (!enabled_) return Status(Code::kUnsupported, off_status_.c_str());
  if (rec.kind != uint32_t(ipc::GpuMemoryKind::kIpc) && rec.kind != uint32_t(ipc::GpuMemoryKind::kVmmFd))
    return Status(Code::kInvalidArgument, "GPU_REGISTER: unknown memory kind");
  if (rec.bytes == 0 || rec.alloc_offset > rec.alloc_bytes || rec.bytes > rec.alloc_bytes - rec.alloc_offset)
    return Status(Code::kInvalidArgument,
                  "GPU_REGISTER: the range [alloc_offset, alloc_offset + bytes) leaves the allocation");
  if (rec.engine_base + rec.bytes < rec.engine_base)
    return Status(Code::kInvalidArgument, "GPU_REGISTER: engine_base + bytes overflows");
  if (rec.kind == uint32_t(ipc::GpuMemoryKind::kVmmFd) && rec.vmm_fd < 0)
    return Status(Code::kInvalidArgument, "GPU_REGISTER: a VMM registration needs vmm_fd");
  auto device = device_by_uuid(rec.device_uuid);
  if (!device.ok()) return Status(Code::kNotFound, "GPU_REGISTER: no device of kdnd has that uuid");
  Registration r;
  r.kind = rec.kind;
  r.device = *device;
  r.engine_base = rec.engine_base;
  r.bytes = rec.bytes;
  std::memcpy(r.memory_handle.bytes, rec.ipc_handle, kIpcHandleBytes);
  r.allocation_bytes = rec.alloc_bytes;
  auto base = open_memory(s, rec, r.device);
  if (!base.ok()) return base.status();
  r.allocation = *base;
  r.mapping_base = uint64_t(uintptr_t(*base)) + rec.alloc_offset;
  // From here on close(r) undoes whatever was opened.
  if (!all_zero(rec.engine_event, kIpcHandleBytes)) {
    IpcHandle h;
    std::memcpy(h.bytes, rec.engine_event, kIpcHandleBytes);
    auto ev = ipc_event_open(r.device, h);
    if (!ev.ok()) {
      close(r);
      return cuda_error("cudaIpcOpenEventHandle of the engine event failed", ev.status());
    }
    r.engine_event = *ev;
  }
  auto done = ipc_event_create(r.device, &r.done_handle);
  if (!done.ok()) {
    close(r);
    return cuda_error("creating the done event failed", done.status());
  }
  r.done_event = *done;
  Registration copy = r;
  auto added = registry_->add(s.id, std::move(r));
  if (!added.ok()) {
    close(copy);
    return added.status();
  }
  ++counters_.registrations;
  ipc::GpuRegisteredRecord out{};
  std::memcpy(out.done_event, (*added)->done_handle.bytes, kIpcHandleBytes);
  out.registration = (*added)->id;
  out.generation = (*added)->generation;
  out.device = uint32_t((*added)->device);
  return out;
}

Status GpuService::unregister(const Session& s, ipc::GpuRegistrationRef ref) noexcept {
  if (!enabled_) return Status(Code::kUnsupported, off_status_.c_str());
  Status st = registry_->unregister(s.id, ref.registration, ref.generation);
  if (st.code() == Code::kNotFound) ++counters_.stale_refused;
  return st;
}

void GpuService::drop_session(uint64_t session) noexcept {
  if (registry_) registry_->drop_session(session);
}

Result<Registration*> GpuService::find(const Session& s, ipc::GpuRegistrationRef ref) noexcept {
  if (!enabled_) return Status(Code::kUnsupported, off_status_.c_str());
  auto r = registry_->find(s.id, ref.registration, ref.generation);
  if (!r.ok()) ++counters_.stale_refused;
  return r;
}

// ---- batches ---------------------------------------------------------------------------------------

std::unique_ptr<GpuService::Batch> GpuService::new_batch(Namespace& ns, Registration& reg,
                                                         std::span<Entry* const> leased) {
  auto b = std::make_unique<Batch>();
  b->token = next_token_++;
  b->device = reg.device;
  b->reg = &reg;
  b->ns = &ns;
  b->leased.assign(leased.begin(), leased.end());  // the batch holds these pins from here
  return b;
}

void GpuService::start_batch(std::unique_ptr<Batch> b) {
  registry_->begin_copy(b->reg);
  ++b->ns->attached;
  const uint64_t token = b->token;
  batches_.emplace(token, std::move(b));
}

Result<kernels::EngineView> GpuService::stage_layout(Device& d, const CheckedLayout& layout,
                                                     std::span<const std::byte> tail, std::byte** tail_dev,
                                                     std::byte** tail_host) {
  const uint64_t bases = layout.k_bases.size() * 8, vbases = layout.v_bases.size() * 8;
  const uint64_t slots = layout.slots.size() * 8;
  const uint64_t vat = (bases + kMetaAlign - 1) / kMetaAlign * kMetaAlign;
  const uint64_t sat = vat + (vbases + kMetaAlign - 1) / kMetaAlign * kMetaAlign;
  const uint64_t tat = (sat + slots + kMetaAlign - 1) / kMetaAlign * kMetaAlign;
  const uint64_t total = tail.empty() ? sat + slots : tat + tail.size_bytes();
  if (total > d.meta->capacity())
    return Status(Code::kLimit, "a request's GPU metadata is larger than the metadata area (tier.gpu.staging_bytes)");
  auto off = d.meta->alloc(total);
  if (!off) return Status(Code::kBusy, "the GPU metadata area is full of requests in flight (tier.gpu.staging_bytes)");
  std::byte* host = d.host_meta + *off;
  std::memcpy(host, layout.k_bases.data(), bases);
  if (vbases) std::memcpy(host + vat, layout.v_bases.data(), vbases);
  if (slots) std::memcpy(host + sat, layout.slots.data(), slots);
  if (!tail.empty()) std::memcpy(host + tat, tail.data(), tail.size_bytes());
  std::byte* dev = static_cast<std::byte*>(d.scratch.base) + d.bounce_bytes + *off;
  if (tail_dev) *tail_dev = tail.empty() ? nullptr : dev + tat;
  if (tail_host) *tail_host = tail.empty() ? nullptr : host + tat;
  Status st = copy_async(dev, host, total, d.stream);
  if (!st.ok()) {
    d.meta->undo_newest();  // nothing of this request was queued
    return cuda_error("queueing the layout copy failed", st);
  }
  kernels::EngineView v = layout.view;
  v.layer_base[0] = reinterpret_cast<void* const*>(dev);
  v.layer_base[1] = vbases ? reinterpret_cast<void* const*>(dev + vat) : v.layer_base[0];
  v.slot_mapping = reinterpret_cast<const int64_t*>(dev + sat);
  return v;
}

Status GpuService::copy_sliced(void* dst, const void* src, uint64_t bytes, void* stream) noexcept {
  const Copy whole{uint64_t(uintptr_t(dst)), uint64_t(uintptr_t(src)), bytes};
  std::vector<Copy> slices;
  try {
    slices = slice_copies(std::span(&whole, 1), cfg_.slice_bytes);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "slicing a GPU copy: out of memory");
  }
  for (const Copy& c : slices)
    KDN_RETURN_IF_ERROR(copy_async(reinterpret_cast<void*>(uintptr_t(c.dst)),
                                   reinterpret_cast<const void*>(uintptr_t(c.src)), c.bytes, stream));
  return OkStatus();
}

Status GpuService::ensure_peer(int engine_device, int t0_device) noexcept {
  uint8_t& state = devices_[size_t(engine_device)]->peer_enabled[size_t(t0_device)];
  if (state == 0) state = enable_peer_access(engine_device, t0_device).ok() ? 1 : 2;
  return state == 1 ? OkStatus() : Status(Code::kUnsupported, "peer access refused");
}

void GpuService::finish_queued(Device& d, uint64_t token, Status why) noexcept {
  spdlog::error("GPU tier: a batch on device {} could not be queued whole ({}); synchronizing its stream",
                d.info.ordinal, why.what());
  if (!notify_after(d.stream, cq_.get(), token).ok()) {
    (void)stream_sync(d.stream);  // what was queued has run; the token keeps completion order
    cq_->push({token, true});
  }
}

Status GpuService::scatter_chunk(const Device& d, const void* src, const kernels::ChunkGeometry& geo,
                                 kernels::EngineView v, size_t i, const SegmentPlacement* segment,
                                 const float* table_dev) noexcept {
  const kernels::Executor ex = kernels::Executor::cuda(d.stream);
  if (segment == nullptr) {
    v.first_token = int64_t(i) * geo.tokens;
    return kernels::scatter(src, geo, v, ex);
  }
  if (i >= segment->first_token.size() || i >= segment->row.size())
    return Status(Code::kInternal, "a segment chunk without its placement");
  v.first_token = segment->first_token[i];
  const int32_t row = segment->row[i];
  if (row < 0) return kernels::scatter(src, geo, v, ex);
  if (table_dev == nullptr || uint32_t(row) >= segment->rows())
    return Status(Code::kInternal, "a segment chunk's RoPE row is not staged");
  const kernels::RopeTable t{segment->style, segment->rotary_dim, table_dev + uint64_t(row) * segment->rotary_dim, 0};
  return kernels::rope_scatter(src, geo, v, t, ex);
}

Status GpuService::begin_copies(const Device& d, int device, uint64_t chunk_bytes) noexcept {
  if (chunk_bytes > d.bounce_bytes)
    return Status(Code::kLimit, "a chunk larger than half of tier.gpu.staging_bytes (the bounce buffer)");
  return set_device(device);  // the kernels launch on the current device
}

Result<uint32_t> GpuService::retrieve(Namespace& ns, Registration& reg, const CheckedLayout& layout,
                                      const kernels::ChunkGeometry& geo, std::span<Entry* const> chunks,
                                      const SegmentPlacement* segment) {
  if (!enabled_) return Status(Code::kUnsupported, off_status_.c_str());
  // T0 blobs are decoded and scattered without re-rotation: a segment retrieve with a T0 codec
  // leaves T0 alone and is served from T1 (below, where a coded T0 is never read or filled).
  if (codec_id_ != 0 && devices_[size_t(reg.device)]->t0_index && segment == nullptr)
    return retrieve_coded(ns, reg, layout, geo, chunks);
  auto raw_t0 = [this](Device& dev) -> T0Index* { return codec_id_ == 0 ? dev.t0_index.get() : nullptr; };
  auto unpin_all = [&] {
    for (Entry* e : chunks) ns.store->unpin(e);
  };
  Device& d = *devices_[size_t(reg.device)];
  const uint64_t bytes = kernels::chunk_bytes(geo);
  if (Status st = begin_copies(d, reg.device, bytes); !st.ok()) {
    unpin_all();
    return st;
  }
  auto batch = new_batch(ns, reg, chunks);
  batch->inject_failure = inject_failure();
  std::byte* tail_dev = nullptr;
  auto view =
      segment ? stage_layout(d, layout, std::as_bytes(std::span(segment->table)), &tail_dev) : stage_layout(d, layout);
  const float* table_dev = reinterpret_cast<const float*>(tail_dev);
  if (!view.ok()) {
    unpin_all();
    return view.status();
  }
  batch->uses_meta = true;
  uint32_t from_t0 = 0;
  Status failed;
  size_t queued = 0;
  for (; queued < chunks.size() && failed.ok(); ++queued) {
    Entry* e = chunks[queued];
    const T0Key key{ns.region_id, e->key, e->generation};
    int t0_dev = -1;
    uint64_t t0_off = 0;
    if (T0Index* t0 = raw_t0(d)) {
      if (auto off = t0->find(key)) t0_dev = reg.device, t0_off = *off;
    }
    for (size_t o = 0; t0_dev < 0 && o < devices_.size(); ++o) {
      if (int(o) == reg.device || !raw_t0(*devices_[o])) continue;
      if (auto off = devices_[o]->t0_index->find(key)) t0_dev = int(o), t0_off = *off;
    }
    RouteInput in;
    in.t0_device = t0_dev;
    in.engine_device = reg.device;
    in.peer_ok = t0_dev >= 0 && t0_dev != reg.device && can_access_peer(reg.device, t0_dev) &&
                 ensure_peer(reg.device, t0_dev).ok();
    std::optional<uint64_t> fresh;
    if (t0_dev != reg.device && !(t0_dev >= 0 && in.peer_ok) && raw_t0(d)) fresh = d.t0_index->insert(key, bytes);
    in.t0_room = fresh.has_value();
    const Route rt = route(in);
    const void* src = nullptr;
    const std::byte* host = ns.host->address(e->placement[tier_index(TierId::kHost)]);
    switch (rt) {
      case Route::kT0Local:
      case Route::kT0Peer:
        src = static_cast<std::byte*>(devices_[size_t(t0_dev)]->t0.base) + t0_off;
        devices_[size_t(t0_dev)]->t0_index->pin(key);
        batch->t0_pins.emplace_back(t0_dev, key);
        ++from_t0;
        if (rt == Route::kT0Peer) ++counters_.peer_chunks;
        break;
      case Route::kHostToT0: {
        void* dst = static_cast<std::byte*>(d.t0.base) + *fresh;
        d.t0_index->pin(key);
        batch->t0_pins.emplace_back(reg.device, key);
        batch->t0_fresh.emplace_back(reg.device, key);
        failed = copy_sliced(dst, host, bytes, d.stream);
        counters_.h2d_bytes += bytes;
        src = dst;
        break;
      }
      case Route::kHostToStage:
        failed = copy_sliced(d.scratch.base, host, bytes, d.stream);
        counters_.h2d_bytes += bytes;
        ++counters_.staged_chunks;
        src = d.scratch.base;
        break;
    }
    if (!failed.ok()) break;
    failed = scatter_chunk(d, src, geo, *view, queued, segment, table_dev);
  }
  if (failed.ok()) failed = event_record(reg.done_event, d.stream);
  if (failed.ok()) failed = notify_after(d.stream, cq_.get(), batch->token);
  if (!failed.ok()) {
    // Work may have been queued: it must land before the pins and the metadata go, so the
    // batch is kept (failed) and releases them when its token comes back.
    finish_queued(d, batch->token, failed);
    start_batch(std::move(batch));
    spdlog::error("GPU tier: queueing copies failed: {} ({})", failed.what(), last_error());
    return Status(Code::kInternal, "queueing GPU copies failed (see kdnd's log)");
  }
  for (auto& [dev, key] : batch->t0_fresh) {
    T0Counters& c = devices_[size_t(dev)]->t0_index->counters();
    ++c.promoted;
    c.promoted_bytes += bytes;
  }
  ++counters_.retrieves;
  counters_.retrieved_chunks += chunks.size();
  start_batch(std::move(batch));
  return from_t0;
}

Status GpuService::store(Namespace& ns, Registration& reg, const CheckedLayout& layout,
                         const kernels::ChunkGeometry& geo, std::span<Entry* const> reserved,
                         std::span<const uint32_t> chunk_pos, uint64_t op_token) {
  if (!enabled_) return Status(Code::kUnsupported, off_status_.c_str());
  Device& d = *devices_[size_t(reg.device)];
  const uint64_t bytes = kernels::chunk_bytes(geo);
  KDN_RETURN_IF_ERROR(begin_copies(d, reg.device, bytes));
  auto batch = new_batch(ns, reg, {});
  batch->op_token = op_token;
  auto view = stage_layout(d, layout);
  if (!view.ok()) return view.status();
  batch->uses_meta = true;
  batch->encodes = begin_store_encodes(d, geo, uint32_t(reserved.size()), op_token);
  Status failed;
  if (reg.engine_event) failed = stream_wait_event(d.stream, reg.engine_event);
  for (size_t i = 0; i < reserved.size() && failed.ok(); ++i) {
    Entry* e = reserved[i];
    const T0Key key{ns.region_id, e->key, e->generation};
    void* dst = d.scratch.base;
    if (d.t0_index && bytes <= d.t0.bytes && codec_id_ == 0) {  // with a codec, blobs enter T0 once encoded
      if (auto off = d.t0_index->insert(key, bytes)) {
        dst = static_cast<std::byte*>(d.t0.base) + *off;
        batch->t0_pins.emplace_back(reg.device, key);
        batch->t0_fresh.emplace_back(reg.device, key);
        d.t0_index->pin(key);
      }
    }
    kernels::EngineView v = *view;
    v.first_token = int64_t(chunk_pos[i]) * geo.tokens;
    failed = kernels::gather(v, dst, geo, kernels::Executor::cuda(d.stream));
    if (!failed.ok()) break;
    std::byte* host = ns.host->address(e->placement[tier_index(TierId::kHost)]);
    failed = copy_sliced(host, dst, bytes, d.stream);
    counters_.d2h_bytes += bytes;
    if (failed.ok() && batch->encodes)
      failed = queue_device_encode(d, *batch->encodes, uint32_t(i), key, e->fingerprint);
  }
  if (failed.ok()) failed = notify_after(d.stream, cq_.get(), batch->token);
  if (!failed.ok()) {
    finish_queued(d, batch->token, failed);
    ++counters_.batches_failed;
  } else {
    ++counters_.stores;
  }
  start_batch(std::move(batch));
  return OkStatus();  // the outcome comes with the token (failed set if queueing failed)
}

Result<uint32_t> GpuService::blend_select(Namespace& ns, Registration& reg, const CheckedLayout& layout,
                                          const kernels::ChunkGeometry& geo, std::span<Entry* const> chunks,
                                          const SegmentPlacement& placement, BlendPlan plan, uint64_t op_token) {
  auto unpin_all = [&] {
    for (Entry* e : chunks) ns.store->unpin(e);
  };
  auto refuse = [&](Status st) -> Result<uint32_t> {
    unpin_all();
    return st;
  };
  if (!enabled_) return refuse(Status(Code::kUnsupported, off_status_.c_str()));
  if (chunks.empty() || chunks.size() != plan.first_token.size() || chunks.size() != placement.row.size())
    return refuse(Status(Code::kInternal, "a blend's chunks, plan and placement disagree"));
  Device& d = *devices_[size_t(reg.device)];
  if (Status st = set_device(reg.device); !st.ok()) return refuse(st);  // the kernels launch on the current device
  const kernels::Executor ex = kernels::Executor::cuda(d.stream);
  auto topk = kernels::top_k_scratch_bytes(plan.n_tokens, ex);
  if (!topk.ok()) return refuse(topk.status());
  if (Status st = place_blend(plan, *topk, placement.table.size() * sizeof(float), d.bounce_bytes); !st.ok())
    return refuse(st);
  const std::vector<std::byte> tail = blend_tail(plan, placement.table);
  std::byte *tail_dev = nullptr, *tail_host = nullptr;
  auto view = stage_layout(d, layout, tail, &tail_dev, &tail_host);
  if (!view.ok()) return refuse(view.status());
  auto batch = new_batch(ns, reg, chunks);
  batch->op_token = op_token;
  batch->uses_meta = true;

  // One layer of the engine's view: its layer-base arrays start at the check layer.
  kernels::EngineView layer_view = *view;
  layer_view.layers = 1;
  layer_view.layer_base[0] = view->layer_base[0] + plan.check_layer;
  layer_view.layer_base[1] = view->layer_base[1] + plan.check_layer;
  std::byte* scratch = static_cast<std::byte*>(d.scratch.base);
  std::byte* cached = scratch + plan.cached_off;
  std::byte* fresh = scratch + plan.fresh_off;
  float* deviation = reinterpret_cast<float*>(scratch + plan.dev_off);
  const auto* candidates = reinterpret_cast<const uint8_t*>(tail_dev + plan.mask_off);
  const auto* table_dev = reinterpret_cast<const float*>(tail_dev);
  const uint32_t T = plan.layer.tokens, width = plan.layer.kv_heads * plan.layer.head_dim;
  const uint64_t plane_off = plan.plane * (plan.layer_bytes / 2);
  T0Index* t0 = codec_id_ == 0 ? d.t0_index.get() : nullptr;  // blobs of a T0 codec are not read here
  uint32_t from_t0 = 0;
  Status failed;
  if (reg.engine_event) failed = stream_wait_event(d.stream, reg.engine_event);  // the check pass wrote its rows
  for (size_t i = 0; i < chunks.size() && failed.ok(); ++i) {
    Entry* e = chunks[i];
    const std::byte* src = ns.host->address(e->placement[tier_index(TierId::kHost)]);
    const T0Key key{ns.region_id, e->key, e->generation};
    if (t0 != nullptr) {
      if (auto off = t0->find(key)) {
        src = static_cast<const std::byte*>(d.t0.base) + *off;
        t0->pin(key);
        batch->t0_pins.emplace_back(reg.device, key);
        ++from_t0;
      }
    }
    failed = copy_async(cached, src + plan.layer_offset_bytes, plan.layer_bytes, d.stream);
    if (!failed.ok()) break;
    if (const int32_t row = placement.row[i]; row >= 0) {  // K as a segment retrieve places it
      if (uint32_t(row) >= placement.rows()) {
        failed = Status(Code::kInternal, "a blend chunk's RoPE row is not staged");
        break;
      }
      const kernels::RopeTable t{placement.style, placement.rotary_dim,
                                 table_dev + uint64_t(row) * placement.rotary_dim, 0};
      failed = kernels::rope_chunk(cached, plan.layer, t, ex);
      if (!failed.ok()) break;
    }
    kernels::EngineView v = layer_view;
    v.first_token = plan.first_token[i];
    failed = kernels::gather(v, fresh, plan.layer, ex);
    if (!failed.ok()) break;
    const kernels::TokenRows f{fresh + plane_off, geo.dtype, width, width};
    const kernels::TokenRows c{cached + plane_off, geo.dtype, width, width};
    failed = kernels::kv_deviation(f, c, T, candidates + i * T, deviation + i * T, ex);
  }
  if (failed.ok()) {
    failed = kernels::select_top_k(
        deviation, candidates, plan.n_tokens, plan.k, reinterpret_cast<int32_t*>(scratch + plan.selected_off),
        reinterpret_cast<uint32_t*>(scratch + plan.count_off), scratch + plan.topk_off, plan.topk_bytes, ex);
  }
  if (failed.ok())
    failed = copy_async(tail_host + plan.result_off, scratch + plan.count_off, 8 + uint64_t(plan.k) * 4, d.stream);
  if (failed.ok()) failed = notify_after(d.stream, cq_.get(), batch->token);
  batch->blend_result = tail_host + plan.result_off;
  batch->blend = std::make_unique<BlendPlan>(std::move(plan));
  if (!failed.ok()) {
    // Work may have been queued: the batch lands (failed) once it ran, and the request learns so.
    spdlog::error("GPU tier: queueing a blend selection failed: {} ({})", failed.what(), last_error());
    finish_queued(d, batch->token, failed);
  } else {
    ++counters_.blend_selects;
    counters_.blend_chunks += chunks.size();
  }
  start_batch(std::move(batch));
  return from_t0;
}

Result<GpuService::Prefetched> GpuService::prefetch(Namespace& ns, Registration& reg, const kernels::ChunkGeometry& geo,
                                                    std::span<Entry* const> chunks) {
  auto unpin = [&](std::span<Entry* const> some) {
    for (Entry* e : some) ns.store->unpin(e);
  };
  if (!enabled_) {
    unpin(chunks);
    return Status(Code::kUnsupported, off_status_.c_str());
  }
  Device& d = *devices_[size_t(reg.device)];
  if (!d.t0_index) {
    unpin(chunks);
    return Status(Code::kUnsupported, "no T0 on this device (tier.gpu.bytes = 0)");
  }
  Prefetched out;
  const uint64_t bytes = kernels::chunk_bytes(geo);
  if (codec_id_ != 0) {  // blobs enter T0 once encoded; the encoder pins its own host copy
    for (Entry* e : chunks) {
      const T0Key key{ns.region_id, e->key, e->generation};
      if (d.t0_index->contains(key) || d.blobs->encoding(key)) {
        ++out.resident;
        continue;
      }
      encode_for_t0(ns, reg.device, geo, e);
      ++out.queued;
    }
    unpin(chunks);
    return out;
  }
  auto batch = new_batch(ns, reg, chunks);
  Status failed;
  size_t i = 0;
  for (; i < chunks.size() && failed.ok(); ++i) {
    Entry* e = chunks[i];
    const T0Key key{ns.region_id, e->key, e->generation};
    if (d.t0_index->contains(key)) {
      ++out.resident;
      continue;
    }
    const std::optional<uint64_t> off = bytes <= d.t0.bytes ? d.t0_index->insert(key, bytes) : std::nullopt;
    if (!off) break;  // every slot pinned: the rest stays in T1
    d.t0_index->pin(key);
    batch->t0_pins.emplace_back(reg.device, key);
    batch->t0_fresh.emplace_back(reg.device, key);
    const std::byte* host = ns.host->address(e->placement[tier_index(TierId::kHost)]);
    failed = copy_sliced(static_cast<std::byte*>(d.t0.base) + *off, host, bytes, d.stream);
    counters_.h2d_bytes += bytes;
    ++out.queued;
  }
  if (out.queued == 0) {  // nothing to copy: no batch, the pins go now
    batch->leased.clear();
    unpin(chunks);
    return out;
  }
  if (failed.ok()) failed = notify_after(d.stream, cq_.get(), batch->token);
  if (!failed.ok()) {
    finish_queued(d, batch->token, failed);  // lands failed: its fresh slots are dropped
    start_batch(std::move(batch));
    spdlog::error("GPU tier: queueing a prefetch into T0 failed: {} ({})", failed.what(), last_error());
    return Status(Code::kInternal, "queueing GPU copies failed (see kdnd's log)");
  }
  T0Counters& c = d.t0_index->counters();
  c.promoted += out.queued;
  c.promoted_bytes += out.queued * bytes;
  start_batch(std::move(batch));
  return out;
}

Result<std::vector<int32_t>> GpuService::take_blend(uint64_t op_token) {
  auto it = blend_answers_.find(op_token);
  if (it == blend_answers_.end()) return Status(Code::kNotFound, "no blend selection landed for this request");
  Result<std::vector<int32_t>> out = std::move(it->second);
  blend_answers_.erase(it);
  return out;
}

void GpuService::land(Batch& b, bool failed) {
  if (b.coded) failed = coded_failed(b, failed);
  if (b.encodes) {  // read by encode_stored once the store committed; a failed store has none
    if (failed)
      store_encodes_.erase(b.op_token);
    else
      b.encodes->landed = true;
  }
  if (b.blend) {  // read before the metadata tail is reused
    blend_answers_.insert_or_assign(b.op_token, failed ? Result<std::vector<int32_t>>(Status(
                                                             Code::kIo, "the GPU work of this blend selection failed"))
                                                       : blend_answer(*b.blend, b.blend_result));
  }
  Device& d = *devices_[size_t(b.device)];
  if (b.uses_meta) d.meta->release_oldest();
  for (auto& [dev, key] : b.t0_pins) devices_[size_t(dev)]->t0_index->unpin(key);
  for (auto& [dev, key] : b.t0_fresh) {
    T0Index& idx = *devices_[size_t(dev)]->t0_index;
    if (failed)
      idx.erase(key);
    else
      idx.publish(key);
  }
  for (Entry* e : b.leased) b.ns->store->unpin(e);
  if (failed) {
    ++counters_.batches_failed;
    spdlog::error("GPU tier: copies on device {} failed: {}", b.device, last_error());
    if (b.reg) {  // GPU_CHECK reports it to the engine
      failed_tickets_.emplace(b.token, uint64_t(b.reg->id) | uint64_t(b.reg->generation) << 32);
      while (failed_tickets_.size() > kMaxFailedTickets) {
        failed_horizon_ = failed_tickets_.begin()->first + 1;
        failed_tickets_.erase(failed_tickets_.begin());
      }
    }
  }
  if (b.coded) drop_faulty(b);
  if (b.reg) registry_->end_copy(b.reg);  // a T0 fill has no registration and no namespace
  if (b.ns) --b.ns->attached;
}

void GpuService::poll(std::vector<Woken>* wake) {
  if (!cq_) return;  // drains even with no batch: the eventfd must not stay readable
  std::vector<CompletionQueue::Done> done;
  cq_->drain(&done);
  if (encoders_) poll_encodes();  // its jobs signal the same eventfd, after queueing their result
  for (const CompletionQueue::Done& c : done) {
    auto it = batches_.find(c.token);
    if (it == batches_.end()) continue;
    Batch& b = *it->second;
    const bool failed = c.failed || b.inject_failure;
    land(b, failed);
    if (b.op_token) wake->push_back({b.op_token, failed});
    for (uint64_t w : b.waiters) wake->push_back({w, failed});
    batches_.erase(it);
  }
}

GpuService::Tickets GpuService::check_tickets(const Registration& reg, uint64_t first, uint64_t last,
                                              uint64_t* wait_on) const noexcept {
  if (first == 0 || first > last || last >= next_token_) return Tickets::kInvalid;
  if (first < failed_horizon_) return Tickets::kTooOld;
  const uint64_t who = uint64_t(reg.id) | uint64_t(reg.generation) << 32;
  for (auto it = failed_tickets_.lower_bound(first); it != failed_tickets_.end() && it->first <= last; ++it)
    if (it->second == who) return Tickets::kFailed;
  // One stream per device runs a registration's batches in order: the newest in flight lands last.
  uint64_t newest = 0;
  for (const auto& [token, b] : batches_)
    if (token >= first && token <= last && b->reg == &reg && token > newest) newest = token;
  if (newest == 0) return Tickets::kOk;
  *wait_on = newest;
  return Tickets::kWait;
}

bool GpuService::wait_batch(uint64_t ticket, uint64_t op_token) {
  auto it = batches_.find(ticket);
  if (it == batches_.end()) return false;
  it->second->waiters.push_back(op_token);
  return true;
}

std::vector<DeviceStats> GpuService::device_stats() const {
  std::vector<DeviceStats> out;
  for (size_t i = 0; i < devices_.size(); ++i) {
    const Device& d = *devices_[i];
    DeviceStats s;
    s.info = d.info;
    for (size_t j = 0; j < devices_.size() && j < 64; ++j)
      if (j != i && can_access_peer(int(i), int(j))) s.peer_mask |= 1ull << j;
    if (d.t0_index) {
      s.t0_capacity = d.t0_index->capacity();
      s.t0_used = d.t0_index->used();
      s.t0_chunks = d.t0_index->resident_chunks();
      s.t0_bytes = d.t0_index->resident_bytes();
      s.t0 = d.t0_index->counters();
    }
    if (d.blobs) {
      s.t0_raw_bytes = d.blobs->raw_bytes();
      s.t0_stored_bytes = d.blobs->stored_bytes();
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace kdn::sidecar::gpu
