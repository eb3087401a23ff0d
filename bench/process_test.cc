#include "process.h"

#include <kdn/common/clock.h>

#include <ctime>

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace kdn::bench {
namespace {

TEST(ChildProcessTest, ForkedBodyExitCodeComesBack) {
  Result<ChildProcess> child = fork_child([] { return 7; });
  ASSERT_TRUE(child.ok());
  Result<int> status = child->wait_for(std::chrono::seconds(10));
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(describe_wait_status(*status), "exit 7");
  EXPECT_FALSE(child->running());
}

TEST(ChildProcessTest, StopEndsAChildThatIgnoresNothing) {
  Result<ChildProcess> child = fork_child([] {
    pause();
    return 0;
  });
  ASSERT_TRUE(child.ok());
  EXPECT_TRUE(child->running());
  EXPECT_EQ(child->wait_for(std::chrono::milliseconds(50)).status().code(), Code::kTimeout);
  Result<int> status = child->stop(SIGTERM, std::chrono::seconds(5));
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(describe_wait_status(*status), "signal " + std::to_string(SIGTERM));
}

TEST(ChildProcessTest, StopEscalatesToSigkill) {
  Result<ChildProcess> child = fork_child([] {
    signal(SIGTERM, SIG_IGN);
    while (true) pause();
    return 0;
  });
  ASSERT_TRUE(child.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let it ignore SIGTERM
  Result<int> status = child->stop(SIGTERM, std::chrono::milliseconds(200));
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(describe_wait_status(*status), "signal " + std::to_string(SIGKILL));
}

TEST(ChildProcessTest, DestructorReapsARunningChild) {
  pid_t pid;
  {
    Result<ChildProcess> child = fork_child([] {
      pause();
      return 0;
    });
    ASSERT_TRUE(child.ok());
    pid = child->pid();
  }
  EXPECT_EQ(waitpid(pid, nullptr, WNOHANG), -1);  // already reaped: no such child
}

TEST(SpawnTest, RunsProgramsWithOutputInTheLog) {
  Result<TempDir> dir = TempDir::create("kdn-bench-test");
  ASSERT_TRUE(dir.ok());
  std::string log = dir->path() + "/out.log";
  Result<ChildProcess> child = spawn_program({"sh", "-c", "echo hello; echo oops >&2; exit 3"}, log);
  ASSERT_TRUE(child.ok());
  Result<int> status = child->wait_for(std::chrono::seconds(10));
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(describe_wait_status(*status), "exit 3");
  EXPECT_EQ(file_tail(log), "hello\noops\n");
  EXPECT_EQ(file_tail(log, 5), "oops\n");
}

TEST(SpawnTest, MissingProgramExitsWithoutRunning) {
  Result<TempDir> dir = TempDir::create("kdn-bench-test");
  ASSERT_TRUE(dir.ok());
  Result<ChildProcess> child = spawn_program({"kdn-no-such-program-xyz"}, dir->path() + "/log");
  ASSERT_TRUE(child.ok());
  Result<int> status = child->wait_for(std::chrono::seconds(10));
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(describe_wait_status(*status), "exit 127");
  EXPECT_EQ(spawn_program({}, "/dev/null").status().code(), Code::kInvalidArgument);
}

TEST(PathTest, FindsInstalledProgramsOnly) {
  EXPECT_FALSE(find_on_path("sh").empty());
  EXPECT_TRUE(find_on_path("kdn-no-such-program-xyz").empty());
  EXPECT_EQ(find_on_path("/bin/sh"), "/bin/sh");
}

TEST(TempDirTest, RemovedWithItsContents) {
  std::string path;
  {
    Result<TempDir> dir = TempDir::create("kdn-bench-test");
    ASSERT_TRUE(dir.ok());
    path = dir->path();
    std::ofstream(path + "/file") << "x";
    EXPECT_TRUE(std::filesystem::exists(path + "/file"));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(DescribeTest, OsErrorsNameErrno) {
  EXPECT_EQ(describe(Status::from_errno("open", ENOENT)), "open: No such file or directory");
  EXPECT_EQ(describe(Status(Code::kTimeout, "late")), "late");
}

class MessageTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, fds_), 0); }
  void TearDown() override {
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }
  int fds_[2] = {-1, -1};
};

TEST_F(MessageTest, RoundTripsFixedSizeMessages) {
  uint64_t out = 0x1234, in = 0;
  ASSERT_TRUE(send_message(fds_[0], &out, sizeof out).ok());
  ASSERT_TRUE(receive_message(fds_[1], &in, sizeof in, std::chrono::seconds(1)).ok());
  EXPECT_EQ(in, out);
}

TEST_F(MessageTest, WrongSizeIsAProtocolError) {
  uint32_t small = 1;
  uint64_t in = 0;
  ASSERT_TRUE(send_message(fds_[0], &small, sizeof small).ok());
  EXPECT_EQ(receive_message(fds_[1], &in, sizeof in, std::chrono::seconds(1)).code(), Code::kProtocol);
  char big[16] = {};
  ASSERT_TRUE(send_message(fds_[0], big, sizeof big).ok());
  EXPECT_EQ(receive_message(fds_[1], &in, sizeof in, std::chrono::seconds(1)).code(), Code::kProtocol);
}

TEST_F(MessageTest, SilenceTimesOutAndAClosedPeerIsUnavailable) {
  uint64_t in = 0;
  uint64_t t0 = now_ns();
  EXPECT_EQ(receive_message(fds_[1], &in, sizeof in, std::chrono::milliseconds(50)).code(), Code::kTimeout);
  EXPECT_GE(now_ns() - t0, 45'000'000u);
  close(fds_[0]);
  fds_[0] = -1;
  EXPECT_EQ(receive_message(fds_[1], &in, sizeof in, std::chrono::seconds(1)).code(), Code::kUnavailable);
  EXPECT_FALSE(send_message(fds_[1], &in, sizeof in).ok());
}

TEST(CpuTimeTest, CountsTheWorkOfAProcess) {
  Result<double> self_before = process_cpu_seconds(getpid());
  ASSERT_TRUE(self_before.ok());
  // Spins until the process's own CPU clock says 300 ms passed (wall time would depend on how
  // busy the machine is), then checks the /proc figure against it, allowing for clock ticks.
  timespec t0{}, t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
  volatile uint64_t spin = 0;
  do {
    for (int i = 0; i < 100000; ++i) spin = spin + 1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  } while ((t.tv_sec - t0.tv_sec) * 1e9 + (t.tv_nsec - t0.tv_nsec) < 300e6);
  Result<double> self_after = process_cpu_seconds(getpid());
  ASSERT_TRUE(self_after.ok());
  EXPECT_GE(*self_after - *self_before, 0.25);
  EXPECT_FALSE(process_cpu_seconds(-1).ok());
}

}  // namespace
}  // namespace kdn::bench
