// The fixture base of GoogleTest suites that share one Redis Cluster (redis_servers.h).
#pragma once

#include "redis_servers.h"

#include <gtest/gtest.h>

#include <string>

namespace kdn::testing {

// The fixture base of a test suite whose cases share one cluster of 3 masters with a replica
// each, started once per suite (a cluster takes seconds to form) and stopped after its last
// case. `Suite` is the deriving fixture, so every suite has a cluster of its own. Without
// redis, servers_ stays null (the fixture's SetUp skips).
template <class Suite>
class ClusterSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!redis_missing().empty()) return;
    servers_ = RedisServers::cluster(3, 1, &why_).release();
  }
  static void TearDownTestSuite() {
    delete servers_;
    servers_ = nullptr;
  }
  static inline RedisServers* servers_ = nullptr;
  static inline std::string why_;
};

}  // namespace kdn::testing
