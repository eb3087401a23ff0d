// The segment requests' shared first step (api_segment.cc, api_gpu.cc): validated segments and
// their chunk keys, in order.
#pragma once

#include <kdn/common/model.h>
#include <kdn/common/status.h>
#include <kdn/kdn.h>

#include <cstdint>
#include <vector>

namespace kdn::shim {

// One validated segment and where its chunk keys start in a request.
struct SegmentPlan {
  const kdn_segment* seg;
  uint64_t first_key;
  uint64_t chunks;
};

// kInvalidArgument unless *s is a well-formed kdn_segment of this library.
Status check_segment(const kdn_segment* s);

// Validates the segments and computes every chunk key, in order (at most one request's worth:
// kMaxKeysPerOp chunks).
Status plan_keys(const kdn::ModelInfo& m, const kdn_segment* segs, size_t n, std::vector<SegmentPlan>& plans,
                 std::vector<kdn_key>& keys);

// kInvalidArgument unless every target position is non-negative and puts its segment's last
// token within KDN_MAX_POSITION. *moves (may be null) says whether a segment leaves its base.
Status check_targets(const kdn_segment* segs, size_t n, const int64_t* target, bool* moves);

}  // namespace kdn::shim
