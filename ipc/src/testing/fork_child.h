// Test helpers for multi-process tests: run a function in a forked child and collect its
// exit code with a time limit, so a hung child fails the test instead of hanging it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>

namespace kdn::ipc::testing {

constexpr int kChildTimedOut = -1000;

// Forks; the child runs fn and _exit()s with its return value (0 = success). GoogleTest
// assertions do not work in the child: return a nonzero code instead.
pid_t fork_child(const std::function<int()>& fn);

// Waits up to timeout_ms for the child. Returns its exit code, -signal if it was killed by
// a signal, or kChildTimedOut (after SIGKILLing it) if it ran too long.
int wait_child(pid_t pid, uint32_t timeout_ms);

}  // namespace kdn::ipc::testing
