#include "client.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kdn::python {

void check(int rc, const char* what) {
  if (rc == KDN_OK) return;
  throw Error(rc, std::string(what) + ": " + kdn_strerror(rc));
}

std::shared_ptr<Client> Client::connect(const ConnectOptions& o) {
  kdn_connect_opts opts{};
  opts.struct_size = sizeof opts;
  opts.socket_path = o.socket_path.empty() ? nullptr : o.socket_path.c_str();
  opts.name_space = o.name_space.empty() ? nullptr : o.name_space.c_str();
  opts.token = o.token.empty() ? nullptr : o.token.c_str();
  opts.flags = o.flags;
  opts.timeout_ms = o.timeout_ms;
  opts.staging_bytes = o.staging_bytes;
  kdn_client* c = nullptr;
  check(kdn_connect(&opts, &c), "cannot connect to kdnd");
  return std::shared_ptr<Client>(new Client(c));
}

Client::~Client() {
  if (c_ != nullptr) kdn_disconnect(c_);
}

void Client::close() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

bool Client::closed() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

// ---- leases ------------------------------------------------------------------------------

Lease::~Lease() {
  try {
    release();
  } catch (const Error&) {
    // Errors on the way out change nothing: kdnd drops a session's leases with it.
  }
}

const void* Lease::chunk(uint32_t i) const {
  if (lease_ == nullptr) throw Error(KDN_ERR_INVALID_ARGUMENT, "the lease was released");
  const void* p = kdn_lease_chunk_data(lease_, i);
  if (p == nullptr) throw Error(KDN_ERR_INVALID_ARGUMENT, "chunk index out of range");
  return p;
}

void Lease::release() {
  if (lease_ == nullptr) return;
  kdn_lease* l = lease_;
  lease_ = nullptr;
  const int rc = model_->client().call_to_finish([&](kdn_client* c) { return kdn_lease_release(c, l); });
  if (rc != KDN_ERR_UNAVAILABLE) check(rc, "kdn_lease_release");
}

// ---- reservations -------------------------------------------------------------------------

Reservation::~Reservation() {
  try {
    abort();
  } catch (const Error&) {
    // Errors on the way out change nothing: kdnd aborts a session's reservations with it.
  }
}

void* Reservation::slot(uint32_t i) {
  if (store_ == nullptr) throw Error(KDN_ERR_INVALID_ARGUMENT, "the reservation was committed or aborted");
  if (i >= kdn_store_chunks(store_)) throw Error(KDN_ERR_INVALID_ARGUMENT, "chunk index out of range");
  return kdn_store_chunk_data(store_, i);
}

kdn_store* Reservation::take() {
  if (store_ == nullptr) throw Error(KDN_ERR_INVALID_ARGUMENT, "the reservation was committed or aborted");
  kdn_store* s = store_;
  store_ = nullptr;
  return s;
}

void Reservation::commit() {
  kdn_store* s = take();
  check(model_->client().call([&](kdn_client* c) { return kdn_store_commit(c, s); }), "kdn_store_commit");
}

std::unique_ptr<PendingCommit> Reservation::commit_post() {
  kdn_store* s = take();
  kdn_op* op = nullptr;
  check(model_->client().call([&](kdn_client* c) { return kdn_store_commit_post(c, s, &op); }),
        "kdn_store_commit_post");
  return std::make_unique<PendingCommit>(model_, op);
}

void Reservation::abort() {
  if (store_ == nullptr) return;
  kdn_store* s = take();
  const int rc = model_->client().call_to_finish([&](kdn_client* c) { return kdn_store_abort(c, s); });
  if (rc != KDN_ERR_UNAVAILABLE) check(rc, "kdn_store_abort");
}

PendingCommit::~PendingCommit() {
  model_->client().call_to_finish([&](kdn_client* c) {
    kdn_op_release(c, op_);
    return 0;
  });
}

bool PendingCommit::poll() {
  if (done_) return true;
  const int rc = model_->client().call([&](kdn_client* c) { return kdn_op_poll(c, op_); });
  if (rc == KDN_ERR_IN_PROGRESS) return false;
  check(rc, "commit");
  done_ = true;
  return true;
}

void PendingCommit::wait(uint32_t timeout_ms) {
  if (done_) return;
  check(model_->client().call([&](kdn_client* c) { return kdn_op_wait(c, op_, timeout_ms); }), "commit");
  done_ = true;
}

// ---- file digests -------------------------------------------------------------------------

std::vector<uint8_t> file_digest(const std::vector<std::string>& paths) {
  XXH3_state_t st;
  XXH3_INITSTATE(&st);
  XXH3_128bits_reset(&st);
  std::vector<uint8_t> buf(1 << 20);
  for (const std::string& path : paths) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(KDN_ERR_IO, "cannot open " + path + ": " + std::strerror(errno));
    struct stat sb {};
    if (::fstat(fd, &sb) != 0) {
      ::close(fd);
      throw Error(KDN_ERR_IO, "cannot stat " + path);
    }
    const std::string base = path.substr(path.find_last_of('/') + 1);
    const uint64_t size = static_cast<uint64_t>(sb.st_size);
    XXH3_128bits_update(&st, base.data(), base.size() + 1);  // with its NUL: names do not run together
    XXH3_128bits_update(&st, &size, sizeof size);
    for (;;) {
      const ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::close(fd);
        throw Error(KDN_ERR_IO, "cannot read " + path + ": " + std::strerror(err));
      }
      if (n == 0) break;
      XXH3_128bits_update(&st, buf.data(), static_cast<size_t>(n));
    }
    ::close(fd);
  }
  const XXH128_hash_t h = XXH3_128bits_digest(&st);
  std::vector<uint8_t> out(16);
  std::memcpy(out.data(), &h.low64, 8);
  std::memcpy(out.data() + 8, &h.high64, 8);
  return out;
}

}  // namespace kdn::python
