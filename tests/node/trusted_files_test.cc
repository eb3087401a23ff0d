// The files kdnd trusts from disk, seen by another local user: a disk-tier directory, the slab
// files in it and the secret files (tokens, the remote password). Whatever that user can write
// or redirect — an open directory, a planted symlink, a slab file of another owner or mode, a
// second link — is refused at start with the path named, before kdnd reads a byte of it; the
// slab files kdnd creates are 0600. Each test runs the real kdnd binary.
#include "kdnd_process.h"

#include <gtest/gtest.h>
#include <kdn/common/testing/require.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kdn::testing {
namespace {

constexpr uid_t kOtherUid = 65534;  // "nobody": any uid but kdnd's and root's

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

class TrustedFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdn-trust-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    disk_ = dir_ + "/disk";
    slab_ = disk_ + "/default/slabs.kdn";
    ASSERT_EQ(::mkdir(disk_.c_str(), 0700), 0);
  }
  void TearDown() override { (void)!std::system(("rm -rf " + dir_).c_str()); }

  std::vector<std::string> disk_flags() const {
    return {"--set", "tier.disk.dirs=" + disk_, "--set", "tier.disk.bytes=32M", "--set", "tier.disk.slab_bytes=16M"};
  }
  // Runs kdnd with `args` to its exit (it is expected to refuse to start); its exit code, or
  // -1 if it was still running after `ms`.
  int start(std::vector<std::string> args, int ms = 20000) {
    args.insert(args.end(),
                {"--socket", dir_ + "/kdnd.sock", "--host-arena-bytes", "64M", "--slab-bytes", "16M", "--no-populate"});
    return exit_code_within(spawn_kdnd(args, log_path()), ms);
  }
  // kdnd refused to start, said `sentence`, and left no socket behind.
  void expect_refused(const std::vector<std::string>& args, const std::string& sentence) {
    EXPECT_EQ(start(args), 1) << log();
    EXPECT_NE(log().find(sentence), std::string::npos) << "expected \"" << sentence << "\" in\n" << log();
  }
  // Creates the slab file with a kdnd that starts and stops cleanly.
  void create_slab_file() {
    KdndProcess k(disk_flags());
    ASSERT_TRUE(k.alive());
    EXPECT_EQ(k.stop(), 0);
    ASSERT_TRUE(exists(slab_));
  }
  std::string log_path() const { return dir_ + "/kdnd.log"; }
  std::string log() const { return read_file(log_path()); }

  std::string dir_, disk_, slab_;
};

TEST_F(TrustedFiles, ADiskDirectoryOthersCanWriteIsRefusedAtStart) {
  for (mode_t mode : {01777, 0777, 0770}) {
    ASSERT_EQ(::chmod(disk_.c_str(), mode), 0);
    char octal[8];
    std::snprintf(octal, sizeof octal, "%04o", unsigned(mode));
    expect_refused(disk_flags(), "tier.disk.dirs " + disk_ + " is writable by " +
                                     ((mode & S_IWOTH) ? "every user" : "its group") + " (mode " + octal + ")");
    EXPECT_FALSE(exists(disk_ + "/default")) << "nothing created in a directory others can write";
  }
  ASSERT_EQ(::chmod(disk_.c_str(), 0755), 0);  // readable by all, writable by kdnd only: fine
  create_slab_file();
}

TEST_F(TrustedFiles, ASymlinkPlantedForTheNamespaceOrTheDirectoryIsNotFollowed) {
  const std::string elsewhere = dir_ + "/elsewhere";
  ASSERT_EQ(::mkdir(elsewhere.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(elsewhere.c_str(), (disk_ + "/default").c_str()), 0);
  expect_refused(disk_flags(), disk_ + "/default is a symlink");
  EXPECT_FALSE(exists(elsewhere + "/slabs.kdn")) << "kdnd wrote through the planted link";

  const std::string link = dir_ + "/disk-link";
  ASSERT_EQ(::symlink(disk_.c_str(), link.c_str()), 0);
  std::vector<std::string> via_link = disk_flags();
  via_link[1] = "tier.disk.dirs=" + link;
  expect_refused(via_link, "tier.disk.dirs " + link + " is a symlink");
}

TEST_F(TrustedFiles, ANamespaceDirectoryOthersCanWriteIsRefused) {
  const std::string ns_dir = disk_ + "/default";
  ASSERT_EQ(::mkdir(ns_dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(ns_dir.c_str(), 0777), 0);
  expect_refused(disk_flags(), "disk directory " + ns_dir + " is writable by every user (mode 0777)");
  EXPECT_FALSE(exists(slab_));
  if (::geteuid() != 0) KDN_SKIP_OR_FAIL("ROOT", "giving the directory to another user needs root");
  ASSERT_EQ(::chmod(ns_dir.c_str(), 0700), 0);
  ASSERT_EQ(::chown(ns_dir.c_str(), kOtherUid, kOtherUid), 0);
  expect_refused(disk_flags(), "disk directory " + ns_dir + " belongs to uid 65534");
}

TEST_F(TrustedFiles, SlabFilesAreCreated0600AndRefusedWhenAnotherUserCouldWriteThem) {
  const mode_t old_umask = ::umask(0);  // kdnd inherits it: the file's mode must not depend on it
  create_slab_file();
  ::umask(old_umask);
  struct stat st;
  ASSERT_EQ(::stat(slab_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);

  ASSERT_EQ(::chmod(slab_.c_str(), 0666), 0);
  expect_refused(disk_flags(), "slab file " + slab_ + " is writable by every user (mode 0666)");
  ASSERT_EQ(::chmod(slab_.c_str(), 0620), 0);
  expect_refused(disk_flags(), "slab file " + slab_ + " is writable by its group (mode 0620)");
  ASSERT_EQ(::chmod(slab_.c_str(), 0600), 0);

  const std::string alias = dir_ + "/alias.kdn";  // a second name, in a directory kdnd does not check
  ASSERT_EQ(::link(slab_.c_str(), alias.c_str()), 0);
  expect_refused(disk_flags(), "slab file " + slab_ + " has 2 links");
  ASSERT_EQ(::unlink(alias.c_str()), 0);

  const std::string moved = disk_ + "/default/real.kdn";
  ASSERT_EQ(::rename(slab_.c_str(), moved.c_str()), 0);
  ASSERT_EQ(::symlink(moved.c_str(), slab_.c_str()), 0);
  expect_refused(disk_flags(), "slab file " + slab_ + " is a symlink");
  ASSERT_EQ(::unlink(slab_.c_str()), 0);
  ASSERT_EQ(::rename(moved.c_str(), slab_.c_str()), 0);

  if (::geteuid() == 0) {  // a file another user owns: they could chmod it at will
    ASSERT_EQ(::chown(slab_.c_str(), kOtherUid, kOtherUid), 0);
    expect_refused(disk_flags(), "slab file " + slab_ + " belongs to uid 65534");
    ASSERT_EQ(::chown(slab_.c_str(), 0, 0), 0);
  }
  create_slab_file();  // the file as kdnd left it is taken again
}

TEST_F(TrustedFiles, SecretFilesAnotherUserCouldReplaceAreRefused) {
  const std::string open_dir = dir_ + "/open";
  ASSERT_EQ(::mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open_dir.c_str(), 01777), 0);
  const std::string password = open_dir + "/redis.pass";
  std::ofstream(password) << "s3cret\n";
  ASSERT_EQ(::chmod(password.c_str(), 0600), 0);
  // The password is read before kdnd looks for the store, so no store needs to run here.
  const std::vector<std::string> remote = {"--set", "tier.remote.seeds=127.0.0.1:1",
                                           "--set", "tier.remote.mode=standalone",
                                           "--set", "tier.remote.password_file=" + password};
  expect_refused(remote, "tier.remote.password_file = \"" + password + "\": its directory " + open_dir +
                             " is writable by every user (mode 1777)");

  const std::string token_dir = dir_ + "/tokens";
  ASSERT_EQ(::mkdir(token_dir.c_str(), 0700), 0);
  const std::string real = token_dir + "/real.token", link = token_dir + "/team.token";
  std::ofstream(real) << "t0ken\n";
  ASSERT_EQ(::chmod(real.c_str(), 0600), 0);
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  expect_refused({"--set", "namespace.team.token_file=" + link},
                 "namespace.team.token_file = \"" + link + "\": cannot read: it is a symlink");
  ASSERT_EQ(::chmod(real.c_str(), 0620), 0);
  expect_refused({"--set", "namespace.team.token_file=" + real},
                 "namespace.team.token_file = \"" + real + "\": the file is writable by its group");
  if (::geteuid() != 0) KDN_SKIP_OR_FAIL("ROOT", "giving the file to another user needs root");
  ASSERT_EQ(::chmod(real.c_str(), 0600), 0);
  ASSERT_EQ(::chown(real.c_str(), kOtherUid, kOtherUid), 0);
  expect_refused({"--set", "namespace.team.token_file=" + real},
                 "namespace.team.token_file = \"" + real + "\": the file belongs to uid 65534");
}

bool can_listen_on(uint16_t port) {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  (void)::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  const bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(s, 1) == 0;
  ::close(s);
  return ok;
}

// A start refused after the Prometheus endpoint began to listen (the namespaces, their tokens
// and tiers open after it) must still end the process, with status 1 and the port free again;
// the endpoint's thread once kept kdnd alive instead. Each refusal is tried a few times: the
// thread's start raced with the error.
TEST_F(TrustedFiles, EveryRefusedStartExitsNonZeroEvenWithTheMetricsEndpointUp) {
  const uint16_t port = free_port();
  ASSERT_NE(port, 0);
  const std::string token = dir_ + "/team.token";
  std::ofstream(token) << "t0ken\n";
  ASSERT_EQ(::chmod(token.c_str(), 0644), 0);
  ASSERT_EQ(::chmod(disk_.c_str(), 0777), 0);
  const std::vector<std::vector<std::string>> refusals = {
      {"--set", "namespace.team.token_file=" + token},  // readable by others
      disk_flags(),                                     // a disk directory others can write
      {"--set", "tier.remote.seeds=127.0.0.1:1", "--set", "tier.remote.mode=standalone"},  // no store there
  };
  for (const auto& bad : refusals) {
    for (int attempt = 0; attempt < 4; ++attempt) {
      std::vector<std::string> args = bad;
      args.insert(args.end(), {"--set", "metrics_listen=127.0.0.1:" + std::to_string(port), "--log-level", "info"});
      ASSERT_EQ(start(args, 10000), 1) << "still running 10 s after a refused start\n" << log();
      EXPECT_NE(log().find("metrics at http://127.0.0.1:" + std::to_string(port)), std::string::npos)
          << "the refusal came after the endpoint listened\n"
          << log();
      EXPECT_NE(log().find("cannot start"), std::string::npos) << log();
      EXPECT_TRUE(can_listen_on(port)) << "the port is still held";
    }
  }
}

}  // namespace
}  // namespace kdn::testing
