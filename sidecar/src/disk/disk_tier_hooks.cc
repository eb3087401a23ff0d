// What the daemon's loop asks of T2 through the Tier hooks (tier.h): background work moved on,
// housekeeping, the write-down queue, and its own counters for TIER_STATS and the metrics page.
#include "disk/disk_tier.h"

namespace kdn::sidecar {

void DiskTier::learn_model(const ModelInfo& model) noexcept { geometries_.learn(model); }

bool DiskTier::advance(bool store_idle) noexcept {
  if (background_busy() && store_idle) service();
  return has_loop_work();
}

// Four queues' worth per directory: the devices stay busy without the whole arena in flight.
uint64_t DiskTier::queue_room() const noexcept { return 4ull * options_.queue_depth * devices(); }

void DiskTier::describe_stats(ipc::TierStatsRecord& r) const noexcept {
  const DiskCounters& c = counters_;
  const RingCounters rc = ring_counters();
  r.reads = c.reads;
  r.read_bytes = c.read_bytes;
  r.writes = c.writes;
  r.write_bytes = c.write_bytes;
  r.raw_bytes_written = c.raw_bytes_written;
  r.stored_bytes_written = c.stored_bytes_written;
  r.reencoded_chunks = c.reencoded;
  r.pending_reencode = pending_reencode_;
  r.fault_io = c.io_errors;
  r.fault_no_space = c.no_space;
  r.fault_eof = c.end_of_file;
  r.fault_crc = c.crc_mismatch;
  r.fault_decode = c.decode_errors;
  r.retries = rc.retries;
  r.short_transfers = rc.short_transfers;
  r.queue_depth = options_.queue_depth;
  r.codec = uint64_t(options_.codec);
  r.flags = (buffers_registered() ? ipc::kTierStatsFixedBuffers : 0) | (degraded() ? ipc::kTierStatsDegraded : 0);
}

void DiskTier::describe_metrics(MetricsSink& sink) const {
  constexpr auto kCounter = MetricsSink::Kind::kCounter;
  const DiskCounters& c = counters_;
  sink.add("kdn_disk_reads_total", kCounter, "Chunk payloads read from the disk tier.", c.reads);
  sink.add("kdn_disk_read_bytes_total", kCounter, "Bytes read from the disk tier.", c.read_bytes);
  sink.add("kdn_disk_writes_total", kCounter, "Chunks written to the disk tier.", c.writes);
  sink.add("kdn_disk_write_bytes_total", kCounter, "Bytes written to the disk tier (headers included).", c.write_bytes);
  sink.add("kdn_disk_raw_bytes_written_total", kCounter,
           "Canonical bytes of the chunks written (codec ratio: raw / stored).", c.raw_bytes_written);
  sink.add("kdn_disk_stored_bytes_written_total", kCounter, "Stored bytes of the chunks written.",
           c.stored_bytes_written);
  sink.add("kdn_disk_faults_io_total", kCounter, "Disk I/O errors (EIO and others).", c.io_errors);
  sink.add("kdn_disk_faults_no_space_total", kCounter, "Disk writes refused with ENOSPC.", c.no_space);
  sink.add("kdn_disk_faults_end_of_file_total", kCounter, "Reads past the end of a slab file.", c.end_of_file);
  sink.add("kdn_disk_faults_crc_total", kCounter, "Disk chunks that failed their CRC32C.", c.crc_mismatch);
  sink.add("kdn_disk_faults_decode_total", kCounter, "Compressed disk chunks that did not decode.", c.decode_errors);
}

}  // namespace kdn::sidecar
