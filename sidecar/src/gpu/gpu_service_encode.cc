// GpuService with tier.gpu.codec: a GPU_STORE's chunks are encoded for T0 on the device
// (docs/gpu.md, "Which copy is encoded where"; t0_device_encode.h has the layout).
//
// store() gathers each chunk into the bounce buffer and copies it to its T1 slot; with a device
// codec the stream then encodes it in place (kvc1_encode_cuda) and copies the result head and
// the blob's room to the store's pinned landing. When the store committed, encode_stored posts
// each landed blob to a worker, which checks it (kvc1_validate_batch) as it would a blob it made,
// and poll_encodes() fills T0 with it. Chunks the device did not encode take the host path.
#include "gpu_service.h"
#include "gpu_service_internal.h"

#include "session.h"

#include <kdn/kernels/codec_cuda.h>

#include <spdlog/spdlog.h>

namespace kdn::sidecar::gpu {

std::shared_ptr<StoreEncodes> GpuService::begin_store_encodes(const Device& d, const kernels::ChunkGeometry& geo,
                                                              uint32_t n, uint64_t op_token) {
  if (codec_id_ == 0 || !d.blobs || n == 0 || encode_stop_.load(std::memory_order_relaxed)) return nullptr;
  const EncodeArea area = plan_encode_area(d.bounce_bytes, geo, codec_id_, kernels::kvc1_cuda_encode_scratch_bytes);
  if (t0_encode_site(codec_id_, /*from_gpu_store=*/true, area) != EncodeSite::kDevice) return nullptr;
  std::shared_ptr<StoreEncodes> enc;
  try {
    enc = std::make_shared<StoreEncodes>();
    enc->keys.resize(n);
    // Pinned: a device-to-host copy into pageable memory may make the loop wait for the stream.
    auto landing = landings_->acquire(uint64_t{n} * area.landing_stride);
    if (!landing.ok()) return nullptr;  // encoded on the host instead
    enc->landing = std::move(*landing);
    enc->area = area;
    enc->geo = geo;
    store_encodes_.insert_or_assign(op_token, enc);
    if (!device_encode_logged_) {
      device_encode_logged_ = true;
      spdlog::info("GPU tier: GPU_STORE chunks are encoded on the device for T0 ({})", cfg_.codec);
    }
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  return enc;
}

Status GpuService::queue_device_encode(Device& d, StoreEncodes& enc, uint32_t i, const T0Key& key,
                                       const kdn_key& fingerprint) {
  auto* bounce = static_cast<std::byte*>(d.scratch.base);
  const void* chunk = bounce;
  uint8_t* out = reinterpret_cast<uint8_t*>(bounce + enc.area.out_offset);
  kernels::Kvc1CudaEncodeBatch b;
  b.n = 1;
  b.device_chunks = &chunk;
  b.device_outputs = &out;
  KDN_RETURN_IF_ERROR(kernels::kvc1_encode_cuda(b, enc.geo, fingerprint, codec_config_of(codec_id_),
                                                bounce + enc.area.scratch_offset, enc.area.scratch_bytes, d.stream));
  for (const LandingCopy& c : landing_copies(enc.area, i)) {
    KDN_RETURN_IF_ERROR(copy_async(enc.landing.data() + c.to, bounce + c.from, c.bytes, d.stream));
    counters_.d2h_bytes += c.bytes;
  }
  enc.keys[i] = key;
  ++counters_.t0_device_encoded;
  return OkStatus();
}

void GpuService::encode_stored(const Session& s, ipc::GpuRegistrationRef ref, Namespace& ns,
                               const kernels::ChunkGeometry& geo, std::span<const kdn_key> keys, uint64_t op_token) {
  std::shared_ptr<StoreEncodes> enc;
  if (auto it = store_encodes_.find(op_token); it != store_encodes_.end()) {
    enc = std::move(it->second);
    store_encodes_.erase(it);
  }
  if (!enabled_ || codec_id_ == 0) return;
  auto reg = registry_->find(s.id, ref.registration, ref.generation);
  if (!reg.ok()) return;
  const int device = (*reg)->device;
  uint32_t cursor = 0;
  for (const kdn_key& k : keys) {
    Entry* e = ns.store->index().find(k);
    if (e == nullptr) continue;
    const T0Key key{ns.region_id, e->key, e->generation};
    if (const int64_t i = enc ? find_landed(*enc, key, cursor) : -1; i >= 0)
      post_device_blob(ns, device, enc, uint32_t(i), e);
    else
      encode_for_t0(ns, device, geo, e);  // the host path: lossless, or not encoded on the device
  }
}

// Hands chunk i's landed blob to a worker, which checks it and hands it to poll_encodes().
void GpuService::post_device_blob(Namespace& ns, int device, const std::shared_ptr<StoreEncodes>& enc, uint32_t i,
                                  Entry* e) {
  Device& d = *devices_[size_t(device)];
  const T0Key& key = enc->keys[i];
  if (encode_stop_.load(std::memory_order_relaxed) || d.t0_index->contains(key) || d.blobs->encoding(key)) return;
  auto bytes = landed_blob_bytes(enc->landing.data(), enc->area, i, kernels::chunk_bytes(enc->geo));
  if (!bytes.ok()) {
    if (counters_.t0_encode_failed++ == 0)
      spdlog::warn("GPU tier: a chunk could not enter T0 as {} ({}); such chunks are served from T1", cfg_.codec,
                   bytes.status().what());
    return;
  }
  std::unique_ptr<T0EncodeJob> job;
  try {
    job = std::make_unique<T0EncodeJob>();
    if (!d.blobs->begin_encode(key)) return;
  } catch (const std::bad_alloc&) {
    return;
  }
  job->geo = enc->geo;
  job->fingerprint = e->fingerprint;
  job->codec = codec_id_;
  job->device_blob = landed_blob(enc->landing.data(), enc->area, i);
  job->device_blob_bytes = *bytes;
  job->keep = enc;
  job->key = key;
  job->device = device;
  job->ns = &ns;
  job->entry = e;
  (void)post_job(std::move(job));
}

}  // namespace kdn::sidecar::gpu
