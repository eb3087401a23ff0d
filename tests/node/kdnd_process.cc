#include "kdnd_process.h"

#include <kdn/common/model_presets.h>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#ifndef KDN_KDND_PATH
#error "KDN_KDND_PATH must name the kdnd binary"
#endif

namespace kdn::testing {

const char* binary_beside_self(const char* name, const char* built) {
  static std::mutex mu;
  static std::map<std::string, std::string> found;
  std::lock_guard lock(mu);
  auto it = found.find(name);
  if (it == found.end()) {
    std::string path = built;
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) {
      const auto beside = self.parent_path() / name;
      if (::access(beside.c_str(), X_OK) == 0) path = beside.string();
    }
    it = found.emplace(name, std::move(path)).first;
  }
  return it->second.c_str();
}

KdndProcess::KdndProcess(std::vector<std::string> extra, const std::string& tag, const char* binary) {
  char tmpl[] = "/tmp/kdn-test-XXXXXX";
  dir_ = mkdtemp(tmpl);
  socket_ = dir_ + "/kdnd" + tag + ".sock";
  std::vector<std::string> args = {binary ? binary : kdnd_binary(),
                                   "--socket",
                                   socket_,
                                   "--host-arena-bytes",
                                   "256M",
                                   "--slab-bytes",
                                   "16M",
                                   "--log-level",
                                   "warn",
                                   "--no-populate"};
  for (size_t i = 0; i < extra.size(); ++i) {
    if (extra[i] == "--token" && i + 1 < extra.size()) token_ = extra[i + 1];
    args.push_back(extra[i]);
  }
  args_ = std::move(args);
  if (!launch()) ADD_FAILURE() << "kdnd did not come up on " << socket_ << "\n" << log();
}

bool KdndProcess::launch() {
  const std::string log_path = dir_ + "/kdnd.log";
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (auto& a : args_) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  kdn_connect_opts o = opts();
  o.timeout_ms = 200;
  // Up to a minute while it lives: a start that recovers a disk tier of thousands of chunks can
  // take many seconds on a loaded 2-core machine, and that is not what the tests measure.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    kdn_client* c = nullptr;
    if (kdn_connect(&o, &c) == KDN_OK) {
      EXPECT_EQ(kdn_ping(c), KDN_OK);
      kdn_disconnect(c);
      return true;
    }
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {  // it exited: no point waiting
      pid_ = -1;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

bool KdndProcess::restart() {
  if (alive()) stop();
  return launch();
}

std::string KdndProcess::log() const {
  std::ifstream in(dir_ + "/kdnd.log");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

KdndProcess::~KdndProcess() {
  if (alive()) stop();
  if (::testing::Test::HasFailure()) std::fprintf(stderr, "---- kdnd log (%s) ----\n%s", dir_.c_str(), log().c_str());
  std::string cmd = "rm -rf " + dir_;
  (void)!std::system(cmd.c_str());
}

kdn_connect_opts KdndProcess::opts(const char* name_space) const {
  kdn_connect_opts o{};
  o.struct_size = sizeof o;
  o.socket_path = socket_.c_str();
  o.name_space = name_space;
  // Tests name fresh tenants freely: kdnd creates them for its own uid (the test's).
  if (name_space && *name_space) o.flags = KDN_CONNECT_CREATE_NAMESPACE;
  o.timeout_ms = 5000;
  o.token = token_.empty() ? nullptr : token_.c_str();
  return o;
}

bool KdndProcess::alive() const { return pid_ > 0 && ::kill(pid_, 0) == 0; }

int KdndProcess::stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int st = 0;
  waitpid(pid_, &st, 0);
  pid_ = -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void KdndProcess::kill9() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

pid_t spawn_kdnd(std::vector<std::string> args, const std::string& log) {
  args.insert(args.begin(), kdnd_binary());
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) _exit(126);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

int exit_code_within(pid_t pid, int ms) {
  for (int waited = 0; waited < ms; waited += 10) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) {
      if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
      return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

// A loopback port free a moment ago.
uint16_t free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(s);
    return 0;
  }
  ::close(s);
  return ntohs(a.sin_port);
}

// GET http://127.0.0.1:port/path with a plain socket: the status code and the body.
int connect_loopback(uint16_t port, int timeout_ms) {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  (void)::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(s);
    return -1;
  }
  return s;
}

std::pair<int, std::string> http_get(uint16_t port, const std::string& path) {
  const int s = connect_loopback(port, 5000);  // a server that never answers fails the test, not hangs it
  if (s < 0) return {-1, ""};
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!::write(s, req.data(), req.size());
  std::string resp;
  char buf[4096];
  for (ssize_t n; (n = ::read(s, buf, sizeof buf)) > 0;) resp.append(buf, size_t(n));
  ::close(s);
  const size_t sp = resp.find(' ');
  const size_t body = resp.find("\r\n\r\n");
  if (sp == std::string::npos || body == std::string::npos) return {-2, resp};
  return {std::atoi(resp.c_str() + sp + 1), resp.substr(body + 4)};
}

int run_in_child(int (*fn)(void*), void* arg) {
  fflush(nullptr);
  pid_t p = fork();
  if (p == 0) _exit(fn(arg));
  int st = 0;
  waitpid(p, &st, 0);
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return -1;
}

Conn::Conn(const KdndProcess& d, const kdn_model_desc& desc, const char* ns) {
  kdn_connect_opts o = d.opts(ns);
  connect_status = kdn_connect(&o, &c);
  if (connect_status != KDN_OK) return;
  register_status = kdn_register_model(c, &desc, &m);
  if (register_status != KDN_OK) m = nullptr;
}

Conn::~Conn() { kdn_disconnect(c); }

int store_doc(Conn& k, uint32_t doc, uint32_t n) {
  const uint32_t T = kdn_model_chunk_tokens(k.m);
  auto tok = doc_tokens(doc, size_t(n) * T);
  kdn_store* s = nullptr;
  if (kdn_store_reserve(k.c, k.m, tok.data(), tok.size(), 0, n, &s) != KDN_OK) return -1;
  int written = 0;
  for (uint32_t i = 0; i < kdn_store_chunks(s); ++i) {
    if (void* p = kdn_store_chunk_data(s, i)) {
      fill_chunk(p, kdn_model_chunk_bytes(k.m), doc, i);
      ++written;
    }
  }
  return kdn_store_commit(k.c, s) == KDN_OK ? written : -1;
}

int verify_doc(Conn& k, uint32_t doc, uint32_t n) {
  const uint32_t T = kdn_model_chunk_tokens(k.m);
  auto tok = doc_tokens(doc, size_t(n) * T);
  kdn_lease* l = nullptr;
  if (kdn_retrieve_lease(k.c, k.m, tok.data(), tok.size(), 0, &l) != KDN_OK) return -1;
  int good = 0;
  for (uint32_t i = 0; i < kdn_lease_chunks(l); ++i)
    good += check_chunk(kdn_lease_chunk_data(l, i), kdn_model_chunk_bytes(k.m), doc, i) ? 1 : -1000;
  if (kdn_lease_release(k.c, l) != KDN_OK) return -1;
  return good < 0 ? -1 : good;
}

kdn_stats stats_of(const KdndProcess& d, const char* ns) {
  kdn_connect_opts o = d.opts(ns);
  o.flags |= KDN_CONNECT_ADMIN | KDN_CONNECT_READ_ONLY;
  kdn_client* c = nullptr;
  kdn_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(kdn_connect(&o, &c), KDN_OK);
  if (c == nullptr) return s;
  kdn_session_info info{};
  info.struct_size = sizeof info;
  EXPECT_EQ(kdn_get_session_info(c, &info), KDN_OK);
  EXPECT_EQ(info.admin, 1u) << "the test's uid is kdnd's: an admin";
  EXPECT_EQ(kdn_get_stats(c, &s), KDN_OK);
  kdn_disconnect(c);
  return s;
}

kdn_model_desc tiny_model(uint32_t chunk_tokens) { return shaped_desc(2, 2, 64, chunk_tokens, "test/tiny"); }

kdn_model_desc smol_model() { return preset_desc(*find_model_preset("smollm2-135m"), "HuggingFaceTB/SmolLM2-135M"); }

std::vector<int32_t> doc_tokens(uint32_t doc, size_t n) {
  std::vector<int32_t> t(n);
  uint64_t x = 0x9E3779B97F4A7C15ull * (doc + 1);
  for (auto& v : t) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = int32_t(x % 49152);
  }
  return t;
}

static uint64_t pattern(uint32_t doc, uint32_t chunk, size_t i) {
  return (uint64_t(doc) << 48) ^ (uint64_t(chunk) << 32) ^ (i * 0x9E3779B97F4A7C15ull);
}

void fill_chunk(void* dst, size_t bytes, uint32_t doc, uint32_t chunk) {
  auto* p = static_cast<uint64_t*>(dst);
  for (size_t i = 0; i < bytes / 8; ++i) p[i] = pattern(doc, chunk, i);
}

bool check_chunk(const void* src, size_t bytes, uint32_t doc, uint32_t chunk) {
  auto* p = static_cast<const uint64_t*>(src);
  for (size_t i = 0; i < bytes / 8; ++i)
    if (p[i] != pattern(doc, chunk, i)) return false;
  return true;
}

}  // namespace kdn::testing
