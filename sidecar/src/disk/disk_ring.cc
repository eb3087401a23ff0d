#include "disk/disk_ring.h"

#include <cerrno>
#include <cstring>

namespace kdn::sidecar {
namespace {

constexpr uint64_t kMaxPart = 1ull << 30;  // one SQE moves at most this (the kernel caps near 2 GiB)
constexpr uint32_t kMaxRetries = 10000;    // -EAGAIN this often in a row is a failure, not a hiccup

}  // namespace

Result<std::unique_ptr<DiskRing>> DiskRing::create(uint32_t depth, std::span<const int> files, int wake_fd, DiskIo& io,
                                                   uint32_t device) noexcept {
  if (depth == 0 || depth > 4096) return Status(Code::kInvalidArgument, "io_uring queue depth must be 1..4096");
  std::unique_ptr<DiskRing> r(new (std::nothrow) DiskRing(io, device));
  if (!r) return Status(Code::kNoMemory, "disk ring allocation failed");
  io_uring_params p{};
  p.flags = IORING_SETUP_CQSIZE;
  p.cq_entries = 4 * depth;  // in flight never exceeds 2 * depth: the CQ cannot overflow
  // SUBMIT_ALL: a failing SQE does not strand those behind it (older kernels refuse the flag:
  // fall back to none). Not COOP_TASKRUN: it defers posting completions until the loop thread
  // enters the kernel, and a loop asleep in epoll_wait would not be woken to post them.
  p.flags |= IORING_SETUP_SUBMIT_ALL;
  int rc = io_uring_queue_init_params(2 * depth, &r->ring_, &p);  // payloads + as many metadata writes
  if (rc == -EINVAL) {
    p = io_uring_params{};
    p.flags = IORING_SETUP_CQSIZE;
    p.cq_entries = 4 * depth;
    rc = io_uring_queue_init_params(2 * depth, &r->ring_, &p);
  }
  if (rc < 0) return Status::from_errno("io_uring_queue_init (is io_uring disabled on this kernel?)", -rc);
  r->ring_ok_ = true;
  r->depth_ = depth;
  if (!files.empty()) {
    rc = io_uring_register_files(&r->ring_, files.data(), unsigned(files.size()));
    if (rc < 0) return Status::from_errno("io_uring_register_files", -rc);
  }
  if (wake_fd >= 0) {
    rc = io_uring_register_eventfd(&r->ring_, wake_fd);
    if (rc < 0) return Status::from_errno("io_uring_register_eventfd", -rc);
  }
  return r;
}

DiskRing::~DiskRing() {
  if (!ring_ok_) return;
  // Requests in flight read or write memory the caller is about to free: let them land.
  waiting_.clear();
  waiting_meta_.clear();
  while (in_flight_ > 0) {
    if (prepared_ > 0) (void)flush();
    if (!wait().ok()) break;
    (void)reap([](IoRequest*) {});
    waiting_.clear();
    waiting_meta_.clear();
  }
  io_uring_queue_exit(&ring_);
}

Status DiskRing::register_buffers(std::span<const iovec> pieces) noexcept {
  for (const iovec& v : pieces)
    if (v.iov_len > kMaxPart) return Status(Code::kInvalidArgument, "a registered buffer piece is over 1 GiB");
  const int rc = io_uring_register_buffers(&ring_, pieces.data(), unsigned(pieces.size()));
  if (rc < 0) return Status::from_errno("io_uring_register_buffers", -rc);
  try {
    for (size_t i = 0; i < pieces.size(); ++i)
      regions_.push_back({static_cast<const std::byte*>(pieces[i].iov_base), pieces[i].iov_len, int(i)});
  } catch (const std::bad_alloc&) {
    regions_.clear();
    (void)io_uring_unregister_buffers(&ring_);
    return Status(Code::kNoMemory, "disk ring regions");
  }
  return OkStatus();
}

bool DiskRing::is_metadata(const IoRequest* r) noexcept { return r->kind == IoKind::kSync || r->bytes <= 4096; }

void DiskRing::submit(IoRequest* r) noexcept {
  r->done = 0;
  r->result = 0;
  const bool meta = is_metadata(r);
  if (meta ? in_flight_ - payloads_ >= depth_ : payloads_ >= depth_) {
    // deque growth may throw; requests are few (bounded by the tier)
    (meta ? waiting_meta_ : waiting_).push_back(r);
    if (queued() > counters_.queued_max) counters_.queued_max = queued();
    return;
  }
  prepare(r);
}

void DiskRing::prepare(IoRequest* r) noexcept {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);  // never null: in flight <= 2 * depth == SQ entries
  ++in_flight_;
  if (!is_metadata(r)) ++payloads_;
  ++prepared_;
  ++counters_.submitted;
  if (r->kind == IoKind::kSync) {
    io_uring_prep_fsync(sqe, int(r->file), IORING_FSYNC_DATASYNC);
  } else {
    std::byte* p = r->buf + r->done;
    uint64_t part = std::min(r->bytes - r->done, kMaxPart);
    const Region* fixed = nullptr;
    for (const Region& g : regions_) {
      if (p >= g.base && p < g.base + g.bytes) {
        fixed = &g;
        part = std::min<uint64_t>(part, uint64_t(g.base + g.bytes - p));
        break;
      }
    }
    r->segment = uint32_t(part);
    const uint64_t off = r->offset + r->done;
    if (fixed) {
      ++counters_.fixed;
      if (r->kind == IoKind::kRead)
        io_uring_prep_read_fixed(sqe, int(r->file), p, unsigned(part), off, fixed->index);
      else
        io_uring_prep_write_fixed(sqe, int(r->file), p, unsigned(part), off, fixed->index);
    } else {
      ++counters_.unfixed;
      if (r->kind == IoKind::kRead)
        io_uring_prep_read(sqe, int(r->file), p, unsigned(part), off);
      else
        io_uring_prep_write(sqe, int(r->file), p, unsigned(part), off);
    }
  }
  sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data(sqe, r);
}

Status DiskRing::flush() noexcept {
  while (prepared_ > 0) {
    const int rc = io_uring_submit(&ring_);
    if (rc >= 0) {
      prepared_ -= std::min<uint32_t>(prepared_, uint32_t(rc));
      if (rc == 0) break;
      continue;
    }
    if (rc == -EINTR) continue;
    // -EAGAIN / -EBUSY: the kernel is short of resources right now; the SQEs stay prepared
    // and go out on the next flush, after completions were reaped.
    if (rc == -EAGAIN || rc == -EBUSY) return OkStatus();
    return Status::from_errno("io_uring_submit", -rc);
  }
  return OkStatus();
}

bool DiskRing::settle(IoRequest* r, int32_t res) noexcept {
  if (r->kind == IoKind::kSync) {
    r->result = res < 0 ? res : 0;
    return true;
  }
  res = io_.completed(r->kind, device_, r->offset + r->done, r->segment, res);
  if (res == -EAGAIN || res == -EINTR) {
    ++counters_.retries;
    if (++r->retries < kMaxRetries) return false;
    r->result = res;
    return true;
  }
  if (res < 0) {
    r->result = res;
    return true;
  }
  if (res == 0) {  // nothing moved: the end of the file (a read), or a device that refuses (a write)
    r->result = r->kind == IoKind::kRead ? -ENODATA : -EIO;
    return true;
  }
  r->done += uint64_t(res);
  if (uint32_t(res) < r->segment) {
    ++counters_.short_transfers;
    ++r->short_count;
  }
  if (r->done < r->bytes) return false;  // the rest goes out again
  r->result = 0;
  return true;
}

size_t DiskRing::reap(const std::function<void(IoRequest*)>& done) noexcept {
  size_t finished = 0;
  io_uring_cqe* cqes[64];
  for (;;) {
    const unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, 64);
    if (n == 0) break;
    for (unsigned i = 0; i < n; ++i) {
      auto* r = static_cast<IoRequest*>(io_uring_cqe_get_data(cqes[i]));
      const int32_t res = cqes[i]->res;
      --in_flight_;
      ++counters_.completed;
      if (r == nullptr) continue;
      if (!is_metadata(r)) --payloads_;
      if (!settle(r, res)) {
        prepare(r);  // a slot was just freed, so the continuation keeps its place in line
        continue;
      }
      ++finished;
      done(r);
    }
    io_uring_cq_advance(&ring_, n);
    if (n < 64) break;
  }
  start_waiting();
  return finished;
}

void DiskRing::start_waiting() noexcept {
  while (!waiting_.empty() && payloads_ < depth_) {
    IoRequest* r = waiting_.front();
    waiting_.pop_front();
    prepare(r);
  }
  while (!waiting_meta_.empty() && in_flight_ - payloads_ < depth_) {
    IoRequest* r = waiting_meta_.front();
    waiting_meta_.pop_front();
    prepare(r);
  }
}

Status DiskRing::wait() noexcept {
  if (prepared_ > 0) KDN_RETURN_IF_ERROR(flush());
  io_uring_cqe* cqe = nullptr;
  for (;;) {
    const int rc = io_uring_wait_cqe(&ring_, &cqe);
    if (rc == -EINTR) continue;
    if (rc < 0) return Status::from_errno("io_uring_wait_cqe", -rc);
    return OkStatus();
  }
}

}  // namespace kdn::sidecar
