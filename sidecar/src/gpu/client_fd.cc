#include "gpu/client_fd.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string>

namespace kdn::sidecar::gpu {
namespace {

constexpr int kCapSysPtrace = 19;

bool has_cap_sys_ptrace() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    const uint64_t caps = std::stoull(line.substr(7), nullptr, 16);
    return (caps >> kCapSysPtrace) & 1;
  }
  return false;
}

// kernel.yama.ptrace_scope, or -1 without Yama.
int yama_ptrace_scope() {
  std::ifstream f("/proc/sys/kernel/yama/ptrace_scope");
  int scope = -1;
  if (!(f >> scope)) return -1;
  return scope;
}

}  // namespace

const char* ptrace_refusal_reason(uint32_t uid) {
  const uint32_t self = ::geteuid();
  if (uid != self && !has_cap_sys_ptrace())
    return "kdnd may not take the engine's VMM fd: pidfd_getfd needs ptrace access, and the engine runs as "
           "another uid than kdnd, which lacks CAP_SYS_PTRACE. Fix: run the engine as kdnd's uid, or give kdnd "
           "CAP_SYS_PTRACE (systemd AmbientCapabilities=CAP_SYS_PTRACE), or register a legacy IPC handle";
  switch (yama_ptrace_scope()) {
    case 1:
      return "kdnd may not take the engine's VMM fd: pidfd_getfd needs ptrace access, and "
             "kernel.yama.ptrace_scope = 1 grants it only to the engine's ancestors and a tracer it names. "
             "Fix: the engine calls prctl(PR_SET_PTRACER, kdnd's pid) before registering, or set "
             "kernel.yama.ptrace_scope = 0, or give kdnd CAP_SYS_PTRACE, or register a legacy IPC handle";
    case 2:
      return "kdnd may not take the engine's VMM fd: pidfd_getfd needs ptrace access, and "
             "kernel.yama.ptrace_scope = 2 grants it only with CAP_SYS_PTRACE. Fix: give kdnd CAP_SYS_PTRACE "
             "(systemd AmbientCapabilities=CAP_SYS_PTRACE), or register a legacy IPC handle";
    case 3:
      return "kdnd may not take the engine's VMM fd: kernel.yama.ptrace_scope = 3 forbids pidfd_getfd to "
             "every process. Fix: register a legacy IPC handle (KDN_GPU_MEMORY_IPC)";
    default:
      return "kdnd may not take the engine's VMM fd: pidfd_getfd was refused although uid and capabilities "
             "allow it (an undumpable engine, prctl PR_SET_DUMPABLE 0, or a security module). Fix: keep the "
             "engine dumpable, or register a legacy IPC handle";
  }
}

Result<int> take_client_fd(uint32_t pid, uint32_t uid, int fd) {
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
  const int pidfd = int(::syscall(SYS_pidfd_open, pid_t(pid), 0));
  if (pidfd < 0) return Status(Code::kInvalidArgument, "pidfd_open of the engine's process failed (it is gone)");
  const int ours = int(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
  const int err = errno;
  ::close(pidfd);
  if (ours >= 0) return ours;
  if (err == EPERM) return Status(Code::kPermission, ptrace_refusal_reason(uid));
  return Status(Code::kInvalidArgument, "pidfd_getfd: the engine's process has no such descriptor (vmm_fd)");
#else
  (void)pid;
  (void)uid;
  (void)fd;
  return Status(Code::kUnsupported, "this kernel has no pidfd_getfd: register with a legacy IPC handle");
#endif
}

}  // namespace kdn::sidecar::gpu
