// What an operator meets: kdnd's start-up checks and messages, the files it keeps, and the
// arena pre-fault that runs after it listens. Each test runs the real kdnd binary and reads
// what it printed.
#include "kdnd_process.h"

#include <kdn/common/clock.h>

#include <kdn/common/testing/require.h>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace kdn::testing {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool wait_for(const std::function<bool()>& done, int ms) {
  for (int waited = 0; waited < ms; waited += 20) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

class Operations : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdn-ops-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    log_ = dir_ + "/kdnd.log";
  }
  void TearDown() override { (void)!std::system(("rm -rf " + dir_).c_str()); }

  // Runs kdnd to its exit (it is expected to refuse to start); returns its exit code.
  int refused_start(std::vector<std::string> args) {
    args.insert(args.end(), {"--host-arena-bytes", "64M", "--slab-bytes", "16M", "--no-populate"});
    return exit_code_within(spawn_kdnd(args, log_), 20000);
  }

  std::string dir_, log_;
};

TEST_F(Operations, ASocketDirectoryOthersCanWriteIsRefused) {
  const std::string shared = dir_ + "/shared";
  ASSERT_EQ(::mkdir(shared.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);  // like /tmp
  EXPECT_EQ(refused_start({"--socket", shared + "/kdnd.sock"}), 1);
  EXPECT_NE(read_file(log_).find("socket directory " + shared + " is writable by every user (mode 1777)"),
            std::string::npos)
      << read_file(log_);
  struct stat st;
  EXPECT_NE(::lstat((shared + "/kdnd.sock").c_str(), &st), 0) << "no socket was left there";
}

TEST_F(Operations, StartErrorsNameThePathAndTheCause) {
  const std::string file = dir_ + "/plain-file";
  std::ofstream(file) << "x";
  EXPECT_EQ(refused_start({"--socket", file + "/kdnd.sock"}), 1);
  EXPECT_NE(read_file(log_).find("socket directory " + file + " is not a directory"), std::string::npos)
      << read_file(log_);

  KdndProcess live;
  EXPECT_EQ(refused_start({"--socket", live.socket()}), 1);
  EXPECT_NE(read_file(log_).find("another kdnd is listening on " + live.socket()), std::string::npos)
      << read_file(log_);

  const std::string open_dir = dir_ + "/metrics";
  ASSERT_EQ(::mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open_dir.c_str(), 0777), 0);
  EXPECT_EQ(refused_start({"--socket", dir_ + "/k.sock", "--metrics-file", open_dir + "/kdn.prom"}), 1);
  EXPECT_NE(read_file(log_).find("metrics directory " + open_dir + " is writable by every user"), std::string::npos)
      << read_file(log_);
  struct stat st;
  EXPECT_NE(::lstat((dir_ + "/k.sock").c_str(), &st), 0) << "refused before it listened";
}

TEST_F(Operations, TheMetricsFileIsWrittenWholeAndNeverThroughAPlantedLink) {
  // A file kdnd must never write: a planted link points the temporary and the file itself at it.
  const std::string victim = dir_ + "/victim";
  std::ofstream(victim) << "precious";
  ASSERT_EQ(::chmod(victim.c_str(), 0600), 0);
  const std::string mdir = dir_ + "/m";
  ASSERT_EQ(::mkdir(mdir.c_str(), 0700), 0);
  const std::string metrics = mdir + "/kdn.prom";
  ASSERT_EQ(::symlink(victim.c_str(), (mdir + "/.kdn.prom.tmp").c_str()), 0);
  ASSERT_EQ(::symlink(victim.c_str(), metrics.c_str()), 0);
  KdndProcess d({"--metrics-file", metrics});
  ASSERT_TRUE(wait_for([&] { return read_file(metrics).find("kdn_sessions") != std::string::npos; }, 5000))
      << "no metrics written";
  EXPECT_EQ(read_file(victim), "precious");
  struct stat st;
  ASSERT_EQ(::lstat(metrics.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode)) << "the link was replaced, not followed";
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(Operations, TheArenaIsPreFaultedAfterKdndListensWithProgress) {
  const std::string sock = dir_ + "/kdnd.sock";
  const pid_t pid = spawn_kdnd({"--socket", sock, "--host-arena-bytes", "1G", "--log-level", "info"}, log_);
  kdn_connect_opts o{};
  o.struct_size = sizeof o;
  o.socket_path = sock.c_str();
  o.timeout_ms = 1000;
  kdn_client* c = nullptr;
  ASSERT_TRUE(wait_for([&] { return kdn_connect(&o, &c) == KDN_OK; }, 10000)) << read_file(log_);
  kdn_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(kdn_get_stats(c, &s), KDN_OK);
  EXPECT_LE(s.host_prefault_left_bytes, 1ull << 30);
  EXPECT_TRUE(wait_for(
      [&] {
        s.struct_size = sizeof s;
        return kdn_get_stats(c, &s) == KDN_OK && s.host_prefault_left_bytes == 0;
      },
      60000))
      << "still " << s.host_prefault_left_bytes << " bytes to pre-fault";
  kdn_disconnect(c);
  ::kill(pid, SIGTERM);
  EXPECT_EQ(exit_code_within(pid, 20000), 0);
  const std::string log = read_file(log_);
  const size_t listening = log.find("kdnd listening on " + sock);
  const size_t started = log.find("pre-faulting its host arena (1024 MiB) in the background");
  const size_t done = log.find("host arena pre-faulted (1024 MiB in");
  ASSERT_NE(listening, std::string::npos) << log;
  ASSERT_NE(started, std::string::npos) << log;
  ASSERT_NE(done, std::string::npos) << log;
  EXPECT_LT(listening, done) << "kdnd listened before the arena was faulted in";
}

// ---- the Prometheus endpoint ------------------------------------------------------------------

// A strict reading of the Prometheus text format (version 0.0.4) as kdn writes it: every family
// has HELP then TYPE before its samples and appears once; names and label names are valid;
// counters end in _total; a histogram has _bucket series with cumulative counts ending in
// le="+Inf" equal to _count, and a _sum; no series repeats; values are numbers. Returns the
// problems found, one per line ("" = none), and the families by name -> type.
std::string check_exposition(const std::string& text, std::map<std::string, std::string>* families) {
  static const std::regex kSample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$)");
  static const std::regex kLabel(R"re(^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$))re");
  std::string problems, current, help_of;
  std::set<std::string> series;
  std::map<std::string, double> last_bucket;  // histogram series (labels without le) -> count so far
  std::map<std::string, double> inf_bucket, count_of;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  auto bad = [&](const std::string& why) { problems += "line " + std::to_string(n) + ": " + why + ": " + line + "\n"; };
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) {
      bad("empty line");
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) {
      std::istringstream w(line.substr(7));
      std::string name;
      w >> name;
      if (families->count(name)) bad("family repeated");
      help_of = name;
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream w(line.substr(7));
      std::string name, type;
      w >> name >> type;
      if (name != help_of) bad("TYPE without a HELP just before it");
      if (type != "counter" && type != "gauge" && type != "histogram") bad("unknown type");
      if (type == "counter" && (name.size() < 6 || name.substr(name.size() - 6) != "_total"))
        bad("counter not ending in _total");
      (*families)[name] = type;
      current = name;
      continue;
    }
    if (line[0] == '#') {
      bad("stray comment");
      continue;
    }
    std::smatch m;
    if (!std::regex_match(line, m, kSample)) {
      bad("not a sample");
      continue;
    }
    const std::string name = m[1], labels = m[3], value = m[4];
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (end == value.c_str() || *end != '\0') bad("value is not a number");
    std::string rest = labels, le, others;
    while (!rest.empty()) {
      std::smatch lm;
      if (!std::regex_search(rest, lm, kLabel) || lm.position(0) != 0) {
        bad("malformed labels");
        break;
      }
      if (lm[1] == "le")
        le = lm[2];
      else
        others += std::string(lm[1]) + "=" + std::string(lm[2]) + ",";
      rest = rest.substr(size_t(lm.length(0)));
    }
    if (!series.insert(name + "{" + labels + "}").second) bad("series repeated");
    const std::string type = families->count(current) ? (*families)[current] : "";
    if (type == "histogram") {
      const std::string key = others;
      if (name == current + "_bucket") {
        if (le.empty()) bad("bucket without le");
        if (last_bucket.count(key) && v < last_bucket[key]) bad("bucket counts not cumulative");
        last_bucket[key] = v;
        if (le == "+Inf") inf_bucket[key] = v;
      } else if (name == current + "_count") {
        count_of[key] = v;
        if (!inf_bucket.count(key) || inf_bucket[key] != v) bad("_count differs from the +Inf bucket");
      } else if (name != current + "_sum") {
        bad("sample of another family inside a histogram");
      }
    } else if (name != current) {
      bad("sample without its HELP and TYPE");
    }
  }
  if (text.empty() || text.back() != '\n') problems += "the text does not end with a newline\n";
  return problems;
}

// The source tree (docs/grafana, .cache): KDN_SOURCE_DIR in the environment (a bundle run on
// another machine), else the one this test was built from.
std::string source_dir() {
  const char* env = std::getenv("KDN_SOURCE_DIR");
  return env != nullptr ? env : KDN_SOURCE_DIR;
}

// promtool from Debian's prometheus package, unpacked by scripts/test.sh (see docs/operations.md).
std::string promtool_path() {
  const char* env = std::getenv("KDN_PROMTOOL");
  return env != nullptr ? env : source_dir() + "/.cache/bin/promtool";
}

std::string kdnctl_path();

TEST_F(Operations, TheMetricsEndpointServesValidExpositionWithTheMetricsFilesNames) {
  const uint16_t port = free_port();
  ASSERT_NE(port, 0);
  const std::string mdir = dir_ + "/m";
  ASSERT_EQ(::mkdir(mdir.c_str(), 0700), 0);
  const std::string metrics = mdir + "/kdn.prom";
  KdndProcess d({"--metrics-file", metrics, "--set", "metrics_listen=127.0.0.1:" + std::to_string(port)});
  {
    const kdn_model_desc desc = tiny_model();
    Conn k(d, desc);
    ASSERT_TRUE(k.ok());
    ASSERT_EQ(store_doc(k, 1, 4), 4);
    ASSERT_EQ(verify_doc(k, 1, 4), 4);
  }
  auto [code, body] = http_get(port, "/metrics");
  ASSERT_EQ(code, 200) << body;
  std::map<std::string, std::string> families;
  EXPECT_EQ(check_exposition(body, &families), "") << body;
  EXPECT_NE(body.find("kdn_stored_chunks_total{namespace=\"default\"} 4\n"), std::string::npos) << body;
  EXPECT_NE(body.find("kdn_request_duration_seconds_count{op=\"commit\"} "), std::string::npos) << body;
  EXPECT_EQ(body.find("kdn_request_duration_seconds_count{op=\"lease\"} 0\n"), std::string::npos)
      << "the leases were not timed";
  EXPECT_NE(body.find("kdn_handshakes_refused_total{reason=\"uid\"} 0\n"), std::string::npos) << body;
  EXPECT_EQ(http_get(port, "/nothing").first, 404);

  // The metrics file: the same families, the same types.
  ASSERT_TRUE(wait_for([&] { return read_file(metrics).find("kdn_stored_chunks_total") != std::string::npos; }, 5000));
  std::map<std::string, std::string> file_families;
  EXPECT_EQ(check_exposition(read_file(metrics), &file_families), "");
  EXPECT_EQ(file_families, families);

  // kdnctl prints the same page (METRICS).
  const std::string kdnctl = kdnctl_path();
  const std::string printed = dir_ + "/kdnctl.prom";
  ASSERT_EQ(std::system((kdnctl + " --socket " + d.socket() + " stats --prometheus > " + printed).c_str()), 0);
  std::map<std::string, std::string> printed_families;
  EXPECT_EQ(check_exposition(read_file(printed), &printed_families), "") << read_file(printed);
  EXPECT_EQ(printed_families, families);
  EXPECT_NE(read_file(printed).find("kdn_request_duration_seconds_count{op=\"metrics\"} 0\n"), std::string::npos)
      << "the page is rendered before its own request is counted";

  // The example dashboard asks only for families kdnd exports.
  const std::string dashboard = read_file(source_dir() + "/docs/grafana/kdn-dashboard.json");
  ASSERT_FALSE(dashboard.empty());
  static const std::regex kName("kdn_[a-z_]+");
  int used = 0;
  for (auto it = std::sregex_iterator(dashboard.begin(), dashboard.end(), kName); it != std::sregex_iterator(); ++it) {
    std::string name = it->str();
    for (const char* suffix : {"_bucket", "_count", "_sum"})
      if (name.size() > std::strlen(suffix) && name.ends_with(suffix) && !families.count(name))
        name.resize(name.size() - std::strlen(suffix));
    EXPECT_TRUE(families.count(name)) << "the dashboard uses " << it->str() << ", which kdnd does not export";
    ++used;
  }
  EXPECT_GT(used, 10);

  // And promtool's own check, where scripts/test.sh unpacked it.
  const std::string promtool = promtool_path();
  if (::access(promtool.c_str(), X_OK) != 0) {
    KDN_SKIP_OR_FAIL("PROMTOOL", "no promtool at " + promtool + " (scripts/setup.sh unpacks it)");
  }
  const std::string config = source_dir() + "/docs/grafana/prometheus-scrape.yml";
  EXPECT_EQ(std::system((promtool + " check config " + config + " > " + dir_ + "/promtool.out 2>&1").c_str()), 0)
      << read_file(dir_ + "/promtool.out");
  const std::string saved = dir_ + "/scrape.txt";
  std::ofstream(saved) << body;
  const int rc = std::system((promtool + " check metrics < " + saved + " > " + dir_ + "/promtool.out 2>&1").c_str());
  EXPECT_EQ(rc, 0) << read_file(dir_ + "/promtool.out");
}

TEST_F(Operations, TheMetricsEndpointRefusesOtherAddressesAndNamesABusyPort) {
  EXPECT_EQ(refused_start({"--socket", dir_ + "/k.sock", "--set", "metrics_listen=0.0.0.0:9464"}),
            2);  // a configuration error
  EXPECT_NE(read_file(log_).find("metrics_listen = '0.0.0.0:9464': only a loopback address"), std::string::npos)
      << read_file(log_);
  // A port another process listens on.
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(s, 4), 0);
  ASSERT_EQ(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string busy = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  EXPECT_EQ(refused_start({"--socket", dir_ + "/k2.sock", "--set", "metrics_listen=" + busy}), 1);
  EXPECT_NE(read_file(log_).find("cannot listen on " + busy + ": Address already in use"), std::string::npos)
      << read_file(log_);
  ::close(s);
}

// ---- the operator's view: kdnctl ------------------------------------------------------------

std::string kdnctl_path() {
  std::string built = KDN_KDND_PATH;
  built.replace(built.rfind("kdnd"), 4, "kdnctl");
  return kdn::testing::binary_beside_self("kdnctl", built.c_str());
}

// Runs kdnctl with `args` against `d`; its exit code, its stdout in *out.
int kdnctl(const KdndProcess& d, const std::string& args, std::string* out, const std::string& dir) {
  const std::string file = dir + "/kdnctl.out";
  const int rc = std::system((kdnctl_path() + " --socket " + d.socket() + " " + args + " > " + file + " 2>&1").c_str());
  *out = read_file(file);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// "name": N in kdnctl stats --json's one object (-1 if absent).
int64_t json_field(const std::string& json, const std::string& name) {
  const size_t at = json.find("\"" + name + "\": ");
  if (at == std::string::npos) return -1;
  return std::strtoll(json.c_str() + at + name.size() + 4, nullptr, 10);
}

// An engine that only leases (kdn-llama's way) used to show lookups 0 and no hits at all.
TEST_F(Operations, LeaseOnlyTrafficShowsHitsAndMissesThatAddUp) {
  KdndProcess d;
  {
    const kdn_model_desc desc = tiny_model();
    Conn k(d, desc);
    ASSERT_TRUE(k.ok());
    ASSERT_EQ(store_doc(k, 1, 4), 4);
    ASSERT_EQ(verify_doc(k, 1, 4), 4);  // 4 hits
    ASSERT_EQ(verify_doc(k, 2, 3), 0);  // a document never stored: 3 misses
  }
  std::string out;
  ASSERT_EQ(kdnctl(d, "stats --json", &out, dir_), 0) << out;
  EXPECT_EQ(json_field(out, "lookups"), 0) << out;
  EXPECT_EQ(json_field(out, "leases"), 2) << out;
  EXPECT_EQ(json_field(out, "lease_hit_chunks"), 4) << out;
  EXPECT_EQ(json_field(out, "lease_miss_chunks"), 3) << out;
  EXPECT_EQ(json_field(out, "retrieved_chunks"), 4) << out;
  EXPECT_EQ(json_field(out, "tier.host.lease_hit_chunks"), 4) << out;
  ASSERT_EQ(kdnctl(d, "stats", &out, dir_), 0) << out;
  EXPECT_NE(out.find("lease_hit_ratio"), std::string::npos) << out;
  EXPECT_NE(out.find("57.1%"), std::string::npos) << "4 of 7: " << out;

  // The Prometheus page: by operation and tier, and bytes by tier and direction.
  ASSERT_EQ(kdnctl(d, "stats --prometheus", &out, dir_), 0) << out;
  std::map<std::string, std::string> families;
  EXPECT_EQ(check_exposition(out, &families), "") << out;
  EXPECT_NE(out.find("kdn_hit_chunks_total{namespace=\"default\",op=\"lease\",tier=\"host\"} 4\n"), std::string::npos)
      << out;
  EXPECT_NE(out.find("kdn_miss_chunks_total{namespace=\"default\",op=\"lease\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("kdn_hit_chunks_total{namespace=\"default\",op=\"lookup\",tier=\"host\"} 0\n"), std::string::npos)
      << out;
  EXPECT_NE(out.find("kdn_lease_hit_chunks_total{namespace=\"default\"} 4\n"), std::string::npos) << out;
  const uint64_t chunk = 2ull * 2 * 2 * 16 * 64 * 2;  // tiny_model(): layers x K|V x heads x tokens x dim x f16
  EXPECT_NE(out.find("kdn_tier_bytes_total{namespace=\"default\",tier=\"host\",direction=\"in\"} " +
                     std::to_string(4 * chunk) + "\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("kdn_tier_bytes_total{namespace=\"default\",tier=\"host\",direction=\"out\"} " +
                     std::to_string(4 * chunk) + "\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(families["kdn_hit_chunks_total"], "counter");
  EXPECT_EQ(families["kdn_tier_bytes_total"], "counter");
}

// kdnctl stats --watch: a table per interval with rates, for --count refreshes or until SIGINT.
TEST_F(Operations, StatsWatchPrintsRatesEveryInterval) {
  KdndProcess d;
  const kdn_model_desc desc = tiny_model();
  Conn k(d, desc);
  ASSERT_TRUE(k.ok());
  ASSERT_EQ(store_doc(k, 1, 4), 4);
  std::string out;
  int rc = -1;
  std::thread watcher([&] { rc = kdnctl(d, "stats --watch 0.3 --count 4", &out, dir_); });
  const uint64_t until = now_ns() + 1'000'000'000;
  int leased = 0;
  while (now_ns() < until) {
    ASSERT_EQ(verify_doc(k, 1, 4), 4);
    ++leased;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  watcher.join();
  ASSERT_EQ(rc, 0) << out;
  for (int i = 1; i <= 4; ++i) EXPECT_NE(out.find("refresh " + std::to_string(i) + ","), std::string::npos) << out;
  EXPECT_EQ(out.find("refresh 5,"), std::string::npos) << out;
  // Some interval saw leases: a positive hits/s and bytes-out/s figure.
  static const std::regex kRate(R"(\nhit_chunks +(\d+) +([0-9.]+)\n)");
  double best = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), kRate); it != std::sregex_iterator(); ++it)
    best = std::max(best, std::stod((*it)[2]));
  EXPECT_GT(best, 0.0) << out;
  for (const char* row : {"miss_chunks", "bytes_in", "bytes_out", "evicted_chunks", "hit_ratio"})
    EXPECT_NE(out.find(std::string("\n") + row + " "), std::string::npos) << row << "\n" << out;
  EXPECT_GT(leased, 0);

  // Without --count it runs until SIGINT, and then exits 0.
  const std::string log = dir_ + "/watch.log";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ::dup2(fd, 1);
    const std::string path = kdnctl_path(), sock = d.socket();
    ::execl(path.c_str(), path.c_str(), "--socket", sock.c_str(), "stats", "--watch", "0.1", nullptr);
    _exit(127);
  }
  ASSERT_TRUE(wait_for([&] { return read_file(log).find("refresh 2,") != std::string::npos; }, 5000)) << read_file(log);
  ::kill(pid, SIGINT);
  EXPECT_EQ(exit_code_within(pid, 5000), 0);
}

// kdnctl ls: each chunk's age, its last use, and its place in the prefix chain it was stored in.
TEST_F(Operations, LsShowsAgeLastUseAndPrefixChain) {
  KdndProcess d;
  const kdn_model_desc desc = tiny_model();
  Conn k(d, desc);
  ASSERT_TRUE(k.ok());
  ASSERT_EQ(store_doc(k, 1, 3), 3);
  ASSERT_EQ(store_doc(k, 2, 2), 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(verify_doc(k, 1, 1), 1);  // uses chunk 0 of document 1 again
  std::string out;
  ASSERT_EQ(kdnctl(d, "ls", &out, dir_), 0) << out;
  EXPECT_NE(out.find("age_s"), std::string::npos) << out;
  EXPECT_NE(out.find("idle_s"), std::string::npos) << out;
  EXPECT_NE(out.find("5 chunks"), std::string::npos) << out;
  static const std::regex kRow(R"(\n[0-9a-f]{32} .* ([0-9.]+) +([0-9.]+) ([0-9a-f]{8})/(\d+))");
  std::map<std::string, std::set<int>> chains;  // chain head -> positions
  int rows = 0, used_recently = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), kRow); it != std::sregex_iterator(); ++it) {
    ++rows;
    const double age = std::stod((*it)[1]), idle = std::stod((*it)[2]);
    EXPECT_GE(age, 0.3) << out;
    EXPECT_LE(idle, age) << out;
    used_recently += idle < 0.3;
    chains[(*it)[3]].insert(std::stoi((*it)[4]));
  }
  EXPECT_EQ(rows, 5) << out;
  EXPECT_EQ(used_recently, 1) << "only the chunk leased again: " << out;
  ASSERT_EQ(chains.size(), 2u) << out;
  std::set<std::set<int>> positions;
  for (auto& [head, pos] : chains) positions.insert(pos);
  EXPECT_EQ(positions, (std::set<std::set<int>>{{0, 1, 2}, {0, 1}})) << out;
}

// kdnctl ping reports the two round trips an engine can see, each with its figures.
TEST_F(Operations, PingShowsTheBusyPollAndTheWakeUpRoundTrips) {
  KdndProcess d;
  std::string out;
  ASSERT_EQ(kdnctl(d, "ping -c 200 -w 3", &out, dir_), 0) << out;
  EXPECT_NE(out.find("kdnd is alive:"), std::string::npos) << out;
  static const std::regex kBusy(
      R"(busy-poll round trip +p50 +[0-9.]+ us +p99 +[0-9.]+ us +max +[0-9.]+ us +\(199 pings: )");
  static const std::regex kWake(
      R"(wake-up round trip +p50 +[0-9.]+ us +p99 +[0-9.]+ us +max +[0-9.]+ us +\(3 pings: )");
  EXPECT_TRUE(std::regex_search(out, kBusy)) << out;
  EXPECT_TRUE(std::regex_search(out, kWake)) << out;
  ASSERT_EQ(kdnctl(d, "ping -c 10 -w 0", &out, dir_), 0) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("busy-poll round trip"))) << out;
  EXPECT_EQ(out.find("wake-up round trip"), std::string::npos) << "no wake-up pings asked for: " << out;
}

}  // namespace
}  // namespace kdn::testing
