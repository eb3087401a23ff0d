// C++ owners of libkdn's handles for the Python module: a connection, its registered models,
// leases, store reservations and posted commits. Failures throw Error (the kdn_status code
// and a message); the bindings turn it into the Python exception kdn.KdnError.
//
// Ownership: every child (Model, Lease, Reservation, PendingCommit) holds its Client, so a
// connection ends (kdn_disconnect) only when the Client and all its children are gone;
// close() makes every later call through it fail with KDN_ERR_UNAVAILABLE at once.
//
// Thread safety: a kdn_client is not thread-safe, so every libkdn call through a Client takes
// its mutex. Callers release the GIL around these calls; objects may be used from any thread.
#pragma once

#include <kdn/kdn.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace kdn::python {

class Error : public std::runtime_error {
 public:
  Error(int code, const std::string& what) : std::runtime_error(what), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

// Throws Error(rc, "<what>: <kdn_strerror(rc)>") unless rc is KDN_OK.
void check(int rc, const char* what);

struct ConnectOptions {
  std::string socket_path;  // empty: libkdn's default rule
  std::string name_space;   // empty: "default"
  std::string token;
  uint32_t flags = 0;  // KDN_CONNECT_*
  uint32_t timeout_ms = 0;
  uint64_t staging_bytes = 0;
};

class Client {
 public:
  static std::shared_ptr<Client> connect(const ConnectOptions& opts);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Runs f(kdn_client*) under the mutex; Error(KDN_ERR_UNAVAILABLE) once closed.
  template <class F>
  auto call(F&& f) -> decltype(f(static_cast<kdn_client*>(nullptr))) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) throw Error(KDN_ERR_UNAVAILABLE, "the kdn client is closed");
    return f(c_);
  }
  // The same for calls returning a kdn_status, for callers that treat failures as results:
  // KDN_ERR_UNAVAILABLE once closed instead of throwing.
  template <class F>
  int status_call(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return KDN_ERR_UNAVAILABLE;
    return f(c_);
  }
  // The same for calls that give something back (release, abort): allowed after close(),
  // since the connection itself lives until the last child is gone.
  template <class F>
  auto call_to_finish(F&& f) -> decltype(f(static_cast<kdn_client*>(nullptr))) {
    std::lock_guard<std::mutex> lock(mu_);
    return f(c_);
  }
  void close() noexcept;
  bool closed() noexcept;

 private:
  explicit Client(kdn_client* c) noexcept : c_(c) {}
  std::mutex mu_;
  kdn_client* c_;
  bool closed_ = false;
};

class Model {
 public:
  Model(std::shared_ptr<Client> client, kdn_model* model, const kdn_model_desc& desc) noexcept
      : client_(std::move(client)), model_(model), desc_(desc) {}
  Client& client() const noexcept { return *client_; }
  const std::shared_ptr<Client>& client_ptr() const noexcept { return client_; }
  const kdn_model* handle() const noexcept { return model_; }
  const kdn_model_desc& desc() const noexcept { return desc_; }
  uint64_t chunk_bytes() const noexcept { return kdn_model_chunk_bytes(model_); }
  uint32_t chunk_tokens() const noexcept { return kdn_model_chunk_tokens(model_); }

 private:
  std::shared_ptr<Client> client_;
  kdn_model* model_;  // freed by kdn_disconnect
  kdn_model_desc desc_;
};

// Leased chunks, read-only in place; released by release() or the destructor.
class Lease {
 public:
  Lease(std::shared_ptr<Model> model, kdn_lease* lease) noexcept : model_(std::move(model)), lease_(lease) {}
  ~Lease();
  uint32_t chunks() const noexcept { return lease_ ? kdn_lease_chunks(lease_) : 0; }
  const void* chunk(uint32_t i) const;  // Error if released or out of range
  const Model& model() const noexcept { return *model_; }
  bool released() const noexcept { return lease_ == nullptr; }
  void release();

 private:
  std::shared_ptr<Model> model_;
  kdn_lease* lease_;
};

// Completion of kdn_store_commit_post.
class PendingCommit {
 public:
  PendingCommit(std::shared_ptr<Model> model, kdn_op* op) noexcept : model_(std::move(model)), op_(op) {}
  ~PendingCommit();
  bool poll();  // true once published; Error if the commit failed
  void wait(uint32_t timeout_ms);

 private:
  std::shared_ptr<Model> model_;
  kdn_op* op_;
  bool done_ = false;
};

// Store slots; aborted by the destructor unless committed.
class Reservation {
 public:
  Reservation(std::shared_ptr<Model> model, kdn_store* store) noexcept : model_(std::move(model)), store_(store) {}
  ~Reservation();
  uint32_t chunks() const noexcept { return store_ ? kdn_store_chunks(store_) : 0; }
  void* slot(uint32_t i);  // nullptr: chunk needs no write; Error if finished or out of range
  const Model& model() const noexcept { return *model_; }
  void commit();
  std::unique_ptr<PendingCommit> commit_post();
  void abort();

 private:
  kdn_store* take();
  std::shared_ptr<Model> model_;
  kdn_store* store_;
};

// XXH3-128 over each file's name, size and bytes, in the order given (16 bytes, little-endian
// low word first). Error(KDN_ERR_IO) if a file cannot be read.
std::vector<uint8_t> file_digest(const std::vector<std::string>& paths);

}  // namespace kdn::python
