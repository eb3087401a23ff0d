// Copies of an engine's descriptors, taken with pidfd_getfd(2) from the process the handshake
// verified (VMM registrations: docs/gpu.md). The kernel allows it only with ptrace access to
// that process: the same uid and, under Yama's kernel.yama.ptrace_scope >= 1, an ancestor or a
// tracer the engine named (prctl PR_SET_PTRACER) — or CAP_SYS_PTRACE. A refusal says which of
// these kdnd lacks and how to fix it, since the engine only sees KDN_ERR_PERMISSION.
//
// Thread-safe (no state).
#pragma once

#include <kdn/common/status.h>

#include <cstdint>

namespace kdn::sidecar::gpu {

// kdnd's own copy of descriptor `fd` of process `pid` (uid `uid`); the caller closes it.
// KDN_ERR_PERMISSION (the message names the cause and the fix) when the kernel refuses,
// KDN_ERR_INVALID_ARGUMENT when the process has no such descriptor or is gone,
// KDN_ERR_UNSUPPORTED on a kernel without pidfd_getfd.
Result<int> take_client_fd(uint32_t pid, uint32_t uid, int fd);

// Why this process may not take descriptors of a process of `uid`: the cause and the fix
// (a static string).
const char* ptrace_refusal_reason(uint32_t uid);

}  // namespace kdn::sidecar::gpu
