// KdndProcess: a real kdnd started for a test (fork + exec of the built binary) on a private
// socket, stopped with SIGTERM (or killed) at the end.
#pragma once

#include <kdn/kdn.h>

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace kdn::testing {

// The path of a binary the tests start: `name` beside the running test binary when it is there
// (a bundle carried to another machine: scripts/gpu-bundle.sh), else `built`, the build tree's.
const char* binary_beside_self(const char* name, const char* built);
// kdnd's path, by the rule above.
inline const char* kdnd_binary() { return binary_beside_self("kdnd", KDN_KDND_PATH); }
// kdnd with its test seams on (DaemonFaults from the environment; sidecar/src/kdnd_main.cc).
inline const char* kdnd_test_binary() { return binary_beside_self("kdnd-test", KDN_KDND_TEST_PATH); }

class KdndProcess {
 public:
  // Starts kdnd (or `binary`, e.g. kdnd_test_binary()) with `extra` flags and waits until it
  // answers a ping (fails the test if not).
  explicit KdndProcess(std::vector<std::string> extra = {}, const std::string& tag = "", const char* binary = nullptr);
  ~KdndProcess();

  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_; }  // private to the test; deleted at the end
  pid_t pid() const { return pid_; }
  // Connect options for this daemon (valid while *this lives); a named namespace is created
  // on first use.
  kdn_connect_opts opts(const char* name_space = nullptr) const;
  // SIGTERM and wait; returns the exit status (or -1).
  int stop();
  void kill9();
  bool alive() const;
  // Starts kdnd again with the same flags, socket and directory (after stop() or kill9()) and
  // waits until it answers a ping; false if it does not.
  bool restart();
  // What kdnd wrote to stderr so far (every start appends; printed if the test failed).
  std::string log() const;

 private:
  bool launch();
  std::vector<std::string> args_;
  std::string dir_, socket_, token_;
  pid_t pid_ = -1;
};

// Starts kdnd with `args` (the binary's path is added first), its stdout and stderr in the file
// `log`, and returns at once; see exit_code_within.
pid_t spawn_kdnd(std::vector<std::string> args, const std::string& log);
// The exit code of `pid` within `ms` (killed and -1 if it did not exit; 128+sig if killed by one).
int exit_code_within(pid_t pid, int ms);

// A loopback TCP port free a moment ago (0 if none could be had).
uint16_t free_port();
// GET http://127.0.0.1:port/path over a plain socket (HTTP/1.0): the status code and the body;
// -1 if it could not connect, -2 if the answer was not HTTP (or did not come within 5 s).
std::pair<int, std::string> http_get(uint16_t port, const std::string& path);
// A TCP connection to 127.0.0.1:port (-1 if refused); reads give up after `timeout_ms`.
int connect_loopback(uint16_t port, int timeout_ms = 5000);

// Runs fn in a forked child; returns the child's exit code (fn's return), 128+sig if killed.
int run_in_child(int (*fn)(void*), void* arg);
template <class F>
int in_child(F f) {
  return run_in_child([](void* p) { return (*static_cast<F*>(p))(); }, &f);
}

// One engine's connection with one registered model (the statuses say what failed, if so).
struct Conn {
  kdn_client* c = nullptr;
  kdn_model* m = nullptr;
  int connect_status = KDN_OK;
  int register_status = KDN_OK;
  Conn(const KdndProcess& d, const kdn_model_desc& desc, const char* ns = nullptr);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  bool ok() const { return c && m; }
};

// Stores chunks [0, n) of document `doc` through zero-copy reservations; returns how many
// were written (already-cached chunks are skipped), or -1 on error.
int store_doc(Conn& k, uint32_t doc, uint32_t n);
// Leases the cached prefix of `doc` and checks every byte; returns chunks verified or -1.
int verify_doc(Conn& k, uint32_t doc, uint32_t n);
// The namespace's counters (and the daemon's: the test's uid is kdnd's, an admin by default).
kdn_stats stats_of(const KdndProcess& d, const char* ns = nullptr);

// A model descriptor used across tests (small chunks: 2 layers, 2 heads, 64 dims, 16 tokens).
kdn_model_desc tiny_model(uint32_t chunk_tokens = 16);
kdn_model_desc smol_model();
// Deterministic token ids and chunk bytes: document `doc`, chunk `i`.
std::vector<int32_t> doc_tokens(uint32_t doc, size_t n);
void fill_chunk(void* dst, size_t bytes, uint32_t doc, uint32_t chunk);
bool check_chunk(const void* src, size_t bytes, uint32_t doc, uint32_t chunk);

}  // namespace kdn::testing
