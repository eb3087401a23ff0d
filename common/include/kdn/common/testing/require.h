// For tests that need a component the machine may lack (redis-server, root, RLIMIT_MEMLOCK for
// fixed buffers, iproute2's ip and tc, promtool, hiredis): without it a test skips — unless the
// run requires it. Under CI (CI set, not "0" or "false") or with KDN_REQUIRE_<NAME>=1, a
// missing component fails the test, so a suite meant to exercise it cannot pass by skipping.
// A device (CUDA) is not among these: no CI machine has one, and GPU tests skip there.
//
//   if (!redis_installed()) KDN_SKIP_OR_FAIL("REDIS", "redis-server is not installed");
//
// Like GTEST_SKIP() and FAIL(), the macro returns from the calling function (which returns
// void). Header-only; test code only.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace kdn::testing {

inline bool env_true(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return false;
  const std::string s(v);
  return s != "0" && s != "false" && s != "no";
}

// True when a missing `component` (the NAME of KDN_REQUIRE_NAME) must fail the run.
inline bool component_required(const char* component) {
  return env_true("CI") || env_true((std::string("KDN_REQUIRE_") + component).c_str());
}

}  // namespace kdn::testing

#define KDN_SKIP_OR_FAIL(component, why)                                                                               \
  do {                                                                                                                 \
    if (::kdn::testing::component_required(component)) {                                                               \
      FAIL() << "missing " << (component) << " (required under CI or KDN_REQUIRE_" << (component) << "=1): " << (why); \
    }                                                                                                                  \
    GTEST_SKIP() << (why);                                                                                             \
  } while (0)
