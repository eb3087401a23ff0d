// GpuService with tier.gpu.codec: T0 holds KVC1 blobs (docs/gpu.md, "T0 with a codec").
//
// A chunk enters T0 as a blob: GPU_RETRIEVE serves a chunk without a blob from T1 as without a
// codec (bounce buffer) and posts its encode; GPU_STORE gathers into the bounce buffer and host
// slot, and encodes once the request committed (encode_stored). A worker encodes and validates the
// blob; poll_encodes() copies it into a T0 slot sized to it and publishes it there once that copy
// is queued (stream order makes every later reader wait for it). A retrieve decodes its T0 hits
// in groups into the bounce buffer and scatters them from there, all on the device's one stream,
// so no group's outputs are overwritten before their scatters ran; each group's result word is
// copied to pinned host memory and read when the batch lands.
#include "gpu_service.h"
#include "gpu_service_internal.h"

#include "session.h"

#include <kdn/kernels/codec_cuda.h>
#include <kdn/kernels/ops.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

namespace kdn::sidecar::gpu {
namespace {

constexpr uint32_t kEncodeThreads = 2;
constexpr uint64_t kMaxEncodesInFlight = 256;     // chunks on the encoders' queue (each pins a host copy)
constexpr uint64_t kMaxEncodeBacklog = 1u << 16;  // chunks beyond this are not encoded (served from T1)

}  // namespace

Status GpuService::start_codec() {
  auto id = gpu::t0_codec_id(cfg_.codec);
  if (!id) return Status(Code::kInvalidArgument, "tier.gpu.codec: unknown codec");
  codec_id_ = *id;
  if (codec_id_ == 0) return OkStatus();
  if (cfg_.bytes == 0) {
    spdlog::warn("GPU tier: tier.gpu.codec = {} has no effect without T0 (tier.gpu.bytes = 0)", cfg_.codec);
    codec_id_ = 0;
    return OkStatus();
  }
  try {
    encoders_ = std::make_unique<Encoders>(kEncodeThreads, cq_->fd());
    for (size_t i = 0; i < devices_.size(); ++i) {
      Device& d = *devices_[i];
      d.blobs = std::make_unique<T0BlobStore>();
      T0BlobStore* blobs = d.blobs.get();
      d.t0_index->on_erase([blobs](const T0Key& k) {
        if (const T0Blob* b = blobs->find(k); b && b->pinned) host_unregister(b->blob.data());
        blobs->erase(k);
      });
    }
  } catch (const std::exception&) {  // bad_alloc, or no thread could be started
    return Status(Code::kNoMemory, "starting the T0 encoders failed");
  }
  spdlog::info("GPU tier: T0 holds {} blobs (KVC1), decoded on the device", cfg_.codec);
  return OkStatus();
}

// ---- retrieve ----------------------------------------------------------------------------------

Result<uint32_t> GpuService::retrieve_coded(Namespace& ns, Registration& reg, const CheckedLayout& layout,
                                            const kernels::ChunkGeometry& geo, std::span<Entry* const> chunks) {
  auto unpin_all = [&] {
    for (Entry* e : chunks) ns.store->unpin(e);
  };
  Device& d = *devices_[size_t(reg.device)];
  const uint64_t bytes = kernels::chunk_bytes(geo);
  if (Status st = begin_copies(d, reg.device, bytes); !st.ok()) {
    unpin_all();
    return st;
  }
  const DecodeArea area = plan_decode_area(d.bounce_bytes, bytes, kMaxDecodeChunks, kernels::kvc1_cuda_scratch_bytes);
  std::vector<std::pair<uint32_t, uint64_t>> hits;  // (chunk index, T0 offset)
  std::vector<uint32_t> misses;
  try {
    for (uint32_t i = 0; i < chunks.size(); ++i) {
      const T0Key key{ns.region_id, chunks[i]->key, chunks[i]->generation};
      std::optional<uint64_t> off;
      if (area.chunks > 0 && d.blobs->find(key)) off = d.t0_index->find(key);
      if (off)
        hits.emplace_back(i, *off);
      else
        misses.push_back(i);
    }
  } catch (const std::bad_alloc&) {
    unpin_all();
    return Status(Code::kNoMemory, "GPU_RETRIEVE: out of memory");
  }
  auto batch = new_batch(ns, reg, chunks);
  batch->inject_failure = inject_failure();
  batch->coded = std::make_unique<CodedBatch>();
  auto view = stage_layout(d, layout);
  if (!view.ok()) {
    unpin_all();
    return view.status();
  }
  batch->uses_meta = true;
  const uint32_t groups = hits.empty() ? 0 : uint32_t((hits.size() + area.chunks - 1) / area.chunks);
  if (groups > 0) {
    auto words = d.meta->alloc(kernels::kKvc1CudaResultBytes * groups);
    if (words) {
      // Zero: a group whose word copy was never queued (a queueing failure) reads as no fault.
      std::memset(d.host_meta + *words, 0, kernels::kKvc1CudaResultBytes * groups);
      batch->coded->host_words = reinterpret_cast<const uint32_t*>(d.host_meta + *words);
    } else {  // no room for the result words now: serve those chunks from T1 this time
      for (auto& [i, off] : hits) misses.push_back(i);
      hits.clear();
    }
  }
  Status failed;
  for (size_t m = 0; m < misses.size() && failed.ok(); ++m) {
    const Entry* e = chunks[misses[m]];
    const std::byte* host = ns.host->address(e->placement[tier_index(TierId::kHost)]);
    failed = copy_sliced(d.scratch.base, host, bytes, d.stream);
    counters_.h2d_bytes += bytes;
    ++counters_.staged_chunks;
    if (!failed.ok()) break;
    kernels::EngineView v = *view;
    v.first_token = int64_t(misses[m]) * geo.tokens;
    failed = kernels::scatter(d.scratch.base, geo, v, kernels::Executor::cuda(d.stream));
  }
  for (uint32_t g = 0; g * uint64_t(area.chunks) < hits.size() && failed.ok(); ++g) {
    const size_t from = size_t(g) * area.chunks, n = std::min<size_t>(area.chunks, hits.size() - from);
    failed = queue_decode_group(d, *batch, *view, geo, area, chunks, ns.region_id, std::span(hits).subspan(from, n), g);
  }
  if (failed.ok()) failed = event_record(reg.done_event, d.stream);
  if (failed.ok()) failed = notify_after(d.stream, cq_.get(), batch->token);
  if (!failed.ok()) {
    // As retrieve(): what was queued lands before the pins and the metadata go.
    finish_queued(d, batch->token, failed);
    start_batch(std::move(batch));
    spdlog::error("GPU tier: queueing copies or decodes failed: {} ({})", failed.what(), last_error());
    return Status(Code::kInternal, "queueing GPU copies failed (see kdnd's log)");
  }
  ++counters_.retrieves;
  counters_.retrieved_chunks += chunks.size();
  start_batch(std::move(batch));
  for (uint32_t i : misses) encode_for_t0(ns, reg.device, geo, chunks[i]);  // they enter T0 for next time
  return uint32_t(hits.size());
}

Status GpuService::queue_decode_group(Device& d, Batch& b, const kernels::EngineView& view,
                                      const kernels::ChunkGeometry& geo, const DecodeArea& area,
                                      std::span<Entry* const> chunks, uint32_t region,
                                      std::span<const std::pair<uint32_t, uint64_t>> hits, uint32_t group) {
  CodedBatch& c = *b.coded;
  std::vector<const uint8_t*> host_blobs, device_blobs;
  std::vector<size_t> lens;
  std::vector<void*> outs;
  try {
    host_blobs.resize(hits.size());
    device_blobs.resize(hits.size());
    lens.resize(hits.size());
    outs.resize(hits.size());
    c.decoded.reserve(c.decoded.size() + hits.size());
    c.group_end.reserve(c.group_end.size() + 1);
    b.t0_pins.reserve(b.t0_pins.size() + hits.size());
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "decoding T0 blobs: out of memory");
  }
  auto* bounce = static_cast<std::byte*>(d.scratch.base);
  for (size_t j = 0; j < hits.size(); ++j) {
    const Entry* e = chunks[hits[j].first];
    const T0Key key{region, e->key, e->generation};
    const T0Blob* blob = d.blobs->find(key);  // present: a T0 slot with a blob keeps it, and it is pinned below
    host_blobs[j] = reinterpret_cast<const uint8_t*>(blob->blob.data());
    lens[j] = blob->bytes;
    device_blobs[j] = reinterpret_cast<const uint8_t*>(d.t0.base) + hits[j].second;
    outs[j] = bounce + j * area.stride;
    d.t0_index->pin(key);
    b.t0_pins.emplace_back(b.device, key);
    c.decoded.push_back(key);
  }
  c.group_end.push_back(uint32_t(c.decoded.size()));
  kernels::Kvc1CudaBatch kb;
  kb.n = uint32_t(hits.size());
  kb.host_blobs = host_blobs.data();
  kb.blob_bytes = lens.data();
  kb.device_blobs = device_blobs.data();
  kb.device_outputs = outs.data();
  void* scratch = bounce + area.scratch_offset;
  Status st = kernels::kvc1_decode_cuda_validated(kb, geo, chunks[hits[0].first]->fingerprint, scratch,
                                                  area.scratch_bytes, d.stream);
  if (!st.ok()) {
    if (st.code() != Code::kInternal && st.code() != Code::kUnavailable) c.faulty_group = int64_t(group);
    return st;
  }
  // The result word, read when the batch lands (kvc1_cuda_result would wait for the stream here).
  auto* word = const_cast<uint32_t*>(c.host_words + group);
  KDN_RETURN_IF_ERROR(copy_async(word, scratch, kernels::kKvc1CudaResultBytes, d.stream));
  for (size_t j = 0; j < hits.size(); ++j) {
    kernels::EngineView v = view;
    v.first_token = int64_t(hits[j].first) * geo.tokens;
    KDN_RETURN_IF_ERROR(kernels::scatter(outs[j], geo, v, kernels::Executor::cuda(d.stream)));
  }
  return OkStatus();
}

bool GpuService::coded_failed(Batch& b, bool failed) noexcept {
  CodedBatch& c = *b.coded;
  if (c.fill) return failed || c.fill_failed;
  Device& d = *devices_[size_t(b.device)];
  bool corrupt = false;
  uint32_t begin = 0;
  for (size_t g = 0; g < c.group_end.size(); ++g) {
    const uint32_t end = c.group_end[g];
    bool bad = c.faulty_group == int64_t(g);
    // After a CUDA error the words may never have been written: only a landed batch's count.
    if (!bad && !failed && c.host_words) {
      Status st = kernels::kvc1_cuda_result_of(c.host_words[g]);
      bad = !st.ok();
      if (bad)
        spdlog::error("GPU tier: decoding {} T0 blob(s) on device {} failed: {}", end - begin, b.device, st.what());
    }
    if (bad) {
      corrupt = true;
      counters_.t0_decode_faults += end - begin;
      for (uint32_t i = begin; i < end; ++i) c.faulty.push_back(c.decoded[i]);
    } else if (!failed) {
      counters_.t0_decoded_chunks += end - begin;
    }
    begin = end;
  }
  if (c.host_words) d.meta->release_oldest();  // the words' allocation (land releases the layout's)
  c.host_words = nullptr;
  return failed || corrupt;
}

void GpuService::drop_faulty(Batch& b) noexcept {
  T0Index& idx = *devices_[size_t(b.device)]->t0_index;
  for (const T0Key& k : b.coded->faulty) {
    if (!idx.erase(k))
      spdlog::warn(
          "GPU tier: a T0 blob that failed to decode is still read by another batch, which drops it if it fails too");
  }
}

void GpuService::t0_codec_stats(ipc::TierStatsRecord* r) const noexcept {
  if (codec_id_ == 0) return;
  r->codec = codec_id_;
  r->raw_bytes_written = counters_.t0_raw_bytes_written;
  r->stored_bytes_written = counters_.t0_stored_bytes_written;
  r->fault_decode = counters_.t0_decode_faults;
  r->resident_bytes = 0;  // the chunks' canonical bytes, not the blobs'
  for (const auto& d : devices_)
    if (d->blobs) r->resident_bytes += d->blobs->raw_bytes();
}

// ---- encodes -----------------------------------------------------------------------------------

void GpuService::encode_for_t0(Namespace& ns, int device, const kernels::ChunkGeometry& geo, Entry* e) {
  Device& d = *devices_[size_t(device)];
  if (!encoders_ || !d.blobs || e->bytes != kernels::chunk_bytes(geo) || encode_stop_.load(std::memory_order_relaxed))
    return;
  const T0Key key{ns.region_id, e->key, e->generation};
  if (d.t0_index->contains(key) || d.blobs->encoding(key)) return;
  if (encodes_in_flight_ < kMaxEncodesInFlight) {
    (void)post_encode(ns, device, geo, e);
    return;
  }
  if (encode_backlog_.size() >= kMaxEncodeBacklog) return;  // not encoded now; a later retrieve tries again
  try {
    encode_backlog_.push_back({&ns, device, geo, e->key, e->generation});
  } catch (const std::bad_alloc&) {
    return;
  }
  ++ns.attached;  // until the backlog lets go of it
}

// Pins the chunk's host copy and hands it to an encoder; false if it could not.
bool GpuService::post_encode(Namespace& ns, int device, const kernels::ChunkGeometry& geo, Entry* e) {
  Device& d = *devices_[size_t(device)];
  const T0Key key{ns.region_id, e->key, e->generation};
  if (!ns.store->pin_host_copy(e)) return false;
  std::unique_ptr<T0EncodeJob> job;
  try {
    job = std::make_unique<T0EncodeJob>();
    if (!d.blobs->begin_encode(key)) {
      ns.store->unpin(e);
      return false;
    }
  } catch (const std::bad_alloc&) {
    ns.store->unpin(e);
    return false;
  }
  job->geo = geo;
  job->fingerprint = e->fingerprint;
  job->chunk = ns.host->address(e->placement[tier_index(TierId::kHost)]);
  job->codec = codec_id_;
  job->key = key;
  job->device = device;
  job->ns = &ns;
  job->entry = e;
  return post_job(std::move(job));
}

// Hands a job whose key is marked as encoding to a worker; false (the mark and the host pin
// undone) if it could not.
bool GpuService::post_job(std::unique_ptr<T0EncodeJob> job) {
  try {
    Encoders* pool = encoders_.get();
    T0EncodeJob* j = job.get();
    const std::atomic<bool>* stop = &encode_stop_;
    encoders_->post([pool, j, stop] {
      if (stop->load(std::memory_order_relaxed))
        j->status = Status(Code::kUnavailable, "kdnd is stopping");
      else
        j->run();
      // Page-locked here, off the loop: the H2D into T0 is then a DMA that never makes the loop
      // wait for the stream (a copy from pageable memory may). Unlocked when the blob goes.
      if (j->status.ok()) j->pinned = host_register(j->encoding.blob.data(), j->encoding.blob.size()).ok();
      pool->done(j);
    });
  } catch (...) {  // bad_alloc: not encoded, served from T1
    devices_[size_t(job->device)]->blobs->end_encode(job->key);
    if (job->chunk) job->ns->store->unpin(job->entry);
    return false;
  }
  Namespace* ns = job->ns;
  job.release();  // the pool hands it back through take_done
  ++encodes_in_flight_;
  ++ns->attached;  // its arena stays mapped while a worker reads it
  return true;
}

void GpuService::stop_encoding() noexcept {
  encode_stop_.store(true, std::memory_order_relaxed);
  for (const EncodeLater& w : encode_backlog_) --w.ns->attached;
  encode_backlog_.clear();
}

// Chunks that waited for an encoder: posted while encoders are free, if still the same chunk.
void GpuService::drain_encode_backlog() {
  while (!encode_backlog_.empty() && encodes_in_flight_ < kMaxEncodesInFlight &&
         !encode_stop_.load(std::memory_order_relaxed)) {
    const EncodeLater w = encode_backlog_.front();
    encode_backlog_.pop_front();
    Entry* e = w.ns->store->index().find(w.key);
    if (e != nullptr && e->generation == w.generation) encode_for_t0(*w.ns, w.device, w.geo, e);
    --w.ns->attached;
  }
}

void GpuService::poll_encodes() {
  std::vector<T0EncodeJob*> done;
  encoders_->take_done(done);
  for (T0EncodeJob* raw : done) {
    std::unique_ptr<T0EncodeJob> job(raw);
    --encodes_in_flight_;
    Device& d = *devices_[size_t(job->device)];
    d.blobs->end_encode(job->key);
    if (job->chunk) job->ns->store->unpin(job->entry);  // the blob is ours now: the host copy may go
    --job->ns->attached;
    if (job->status.code() == Code::kUnavailable) continue;  // stop_encoding(): not encoded
    if (!job->status.ok()) {
      if (counters_.t0_encode_failed++ == 0)
        spdlog::warn("GPU tier: a chunk could not enter T0 as {} ({}); such chunks are served from T1", cfg_.codec,
                     job->status.what());
      continue;
    }
    ++counters_.t0_encoded;
    fill_t0(d, *job);
    if (job->pinned && job->encoding.blob.data()) host_unregister(job->encoding.blob.data());  // not kept
  }
  drain_encode_backlog();
}

void GpuService::fill_t0(Device& d, T0EncodeJob& job) {
  const T0Key key = job.key;
  const uint64_t blob_bytes = job.encoding.bytes;
  const uint64_t slot_bytes = t0_slot_bytes(blob_bytes);
  if (slot_bytes > d.t0.bytes) return;
  auto batch = std::make_unique<Batch>();
  std::optional<uint64_t> off;
  try {
    batch->coded = std::make_unique<CodedBatch>();
    batch->t0_pins.reserve(1);
    batch->t0_fresh.reserve(1);
    off = d.t0_index->insert(key, slot_bytes);
    if (!off) return;  // every slot pinned, or the chunk has a T0 copy already
    d.blobs->put(key, T0Blob{std::move(job.encoding.blob), blob_bytes, kernels::chunk_bytes(job.geo), job.pinned});
  } catch (const std::bad_alloc&) {
    if (off) d.t0_index->erase(key);
    return;
  }
  const T0Blob* blob = d.blobs->find(key);
  batch->token = next_token_++;
  batch->device = job.device;
  batch->coded->fill = true;
  d.t0_index->pin(key);  // until the copy landed: never evicted (nor its host blob freed) before
  batch->t0_pins.emplace_back(job.device, key);
  batch->t0_fresh.emplace_back(job.device, key);
  Status st = copy_sliced(static_cast<std::byte*>(d.t0.base) + *off, blob->blob.data(), blob_bytes, d.stream);
  if (st.ok()) st = notify_after(d.stream, cq_.get(), batch->token);
  if (!st.ok()) {
    batch->coded->fill_failed = true;  // lands failed: the slot and its blob are dropped
    finish_queued(d, batch->token, st);
  } else {
    d.t0_index->publish(key);  // readers queue behind the copy on this stream
    T0Counters& c = d.t0_index->counters();
    ++c.promoted;
    c.promoted_bytes += blob_bytes;
    counters_.t0_raw_bytes_written += kernels::chunk_bytes(job.geo);
    counters_.t0_stored_bytes_written += blob_bytes;
  }
  counters_.h2d_bytes += blob_bytes;
  batches_.emplace(batch->token, std::move(batch));
}

}  // namespace kdn::sidecar::gpu
