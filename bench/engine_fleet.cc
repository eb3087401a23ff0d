// The bench side of the engine control channel: fork engines, run synchronized tasks.
#include "engine_fleet.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

namespace kdn::bench {
namespace {

constexpr auto kEngineStartTimeout = std::chrono::seconds(120);
constexpr auto kHandshakeTimeout = std::chrono::seconds(60);

}  // namespace

Result<EngineFleet> EngineFleet::start(const EngineSetup& setup, unsigned processes) noexcept {
  EngineFleet fleet;
  for (unsigned i = 0; i < processes; ++i) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
      return Status::from_errno("socketpair", errno);
    }
    Result<ChildProcess> child = fork_child([&fleet, &setup, i, fds] {
      for (const Engine& sibling : fleet.engines_) close(sibling.control_fd);
      close(fds[0]);
      return run_engine_process(setup, i, fds[1]);
    });
    close(fds[1]);
    if (!child.ok()) {
      close(fds[0]);
      return child.status();
    }
    fleet.engines_.push_back(Engine{std::move(child).value(), fds[0]});
  }
  for (Engine& engine : fleet.engines_) {
    EngineReport hello;
    KDN_RETURN_IF_ERROR(receive_message(engine.control_fd, &hello, sizeof hello, kEngineStartTimeout));
    if (hello.status != KDN_OK) {
      std::fprintf(stderr, "kdn-bench: %s\n", hello.error);
      return Status(static_cast<Code>(hello.status), "an engine process could not start");
    }
  }
  return fleet;
}

EngineFleet::~EngineFleet() {
  for (Engine& engine : engines_) {
    if (engine.control_fd >= 0) close(engine.control_fd);  // EOF ends the engine
    engine.control_fd = -1;
  }
  for (Engine& engine : engines_) (void)engine.process.stop(SIGTERM, std::chrono::seconds(10));
}

Result<std::vector<EngineReport>> EngineFleet::run(const std::vector<std::optional<EngineCommand>>& commands,
                                                   std::chrono::seconds timeout) noexcept {
  std::vector<Engine*> active;
  for (size_t i = 0; i < engines_.size() && i < commands.size(); ++i) {
    if (!commands[i]) continue;
    KDN_RETURN_IF_ERROR(send_message(engines_[i].control_fd, &*commands[i], sizeof(EngineCommand)));
    active.push_back(&engines_[i]);
  }
  for (Engine* engine : active) {
    uint32_t ready = 0;
    KDN_RETURN_IF_ERROR(receive_message(engine->control_fd, &ready, sizeof ready, kHandshakeTimeout));
    if (ready != kEngineReady) return Status(Code::kProtocol, "engine sent no ready");
  }
  for (Engine* engine : active) {
    KDN_RETURN_IF_ERROR(send_message(engine->control_fd, &kEngineGo, sizeof kEngineGo));
  }
  std::vector<EngineReport> reports(active.size());
  for (size_t i = 0; i < active.size(); ++i) {
    KDN_RETURN_IF_ERROR(receive_message(active[i]->control_fd, &reports[i], sizeof(EngineReport), timeout));
    reports[i].error[sizeof reports[i].error - 1] = '\0';
  }
  return reports;
}

Status EngineFleet::quit() noexcept {
  EngineCommand quit_cmd;
  quit_cmd.task = EngineTask::kQuit;
  Status status;
  for (Engine& engine : engines_) {
    Status sent = send_message(engine.control_fd, &quit_cmd, sizeof quit_cmd);
    if (!sent.ok() && status.ok()) status = sent;
  }
  for (Engine& engine : engines_) {
    Result<int> exited = engine.process.wait_for(std::chrono::seconds(30));
    if (!exited.ok() && status.ok()) status = exited.status();
    if (exited.ok() && *exited != 0 && status.ok()) {
      status = Status(Code::kInternal, "an engine process exited with an error");
    }
    close(engine.control_fd);
    engine.control_fd = -1;
  }
  return status;
}

}  // namespace kdn::bench
