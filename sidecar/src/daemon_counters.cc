#include "daemon_counters.h"

namespace kdn::sidecar {

const char* refusal_name(Refusal r) noexcept {
  switch (r) {
    case Refusal::kUid:
      return "uid";
    case Refusal::kPending:
      return "pending";
    case Refusal::kTimeout:
      return "timeout";
    case Refusal::kHello:
      return "hello";
    case Refusal::kVersion:
      return "version";
    case Refusal::kAccess:
      return "access";
    case Refusal::kLimit:
      return "limit";
    case Refusal::kResources:
      return "resources";
    case Refusal::kCount:
      break;
  }
  return "unknown";
}

}  // namespace kdn::sidecar
