#include "kdnd_process.h"

#include <kdn/common/model_presets.h>

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#ifndef KDN_KDND_PATH
#error "KDN_KDND_PATH must name the kdnd binary"
#endif

namespace kdn::testing {

KdndProcess::KdndProcess(std::vector<std::string> extra, const std::string& tag) {
  char tmpl[] = "/tmp/kdn-test-XXXXXX";
  dir_ = mkdtemp(tmpl);
  socket_ = dir_ + "/kdnd" + tag + ".sock";
  std::vector<std::string> args = {KDN_KDND_PATH, "--socket", socket_, "--host-arena-bytes", "256M",
                                   "--slab-bytes", "16M", "--log-level", "warn", "--no-populate"};
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
  for (int i = 0; i < 500; ++i) {
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

kdn_model_desc tiny_model(uint32_t chunk_tokens) {
  kdn_model_desc d{};
  d.struct_size = sizeof d;
  d.num_layers = 2;
  d.num_kv_heads = 2;
  d.head_dim = 64;
  d.dtype = KDN_DTYPE_F16;
  d.chunk_tokens = chunk_tokens;
  d.rope_style = KDN_ROPE_NEOX;
  d.rope_theta = 10000.0;
  std::strcpy(d.name, "test/tiny");
  return d;
}

kdn_model_desc smol_model() {
  return preset_desc(*find_model_preset("smollm2-135m"), "HuggingFaceTB/SmolLM2-135M");
}

std::vector<int32_t> doc_tokens(uint32_t doc, size_t n) {
  std::vector<int32_t> t(n);
  uint64_t x = 0x9E3779B97F4A7C15ull * (doc + 1);
  for (auto& v : t) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
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
