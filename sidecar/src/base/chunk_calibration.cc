#include "chunk_calibration.h"

#include <xxhash.h>

#include <cstring>
#include <new>

namespace kdn::sidecar {

namespace {
// Seeds the store key's hash: chunk keys are XXH3 of other inputs with no seed, so a
// calibration key lands in a domain of its own.
constexpr uint64_t kCalibrationKeySeed = 0x6b646e2d63616c31ull;  // "kdn-cal1"
}  // namespace

kdn_key calibration_store_key(const kdn_key& fingerprint, const kdn_key& id) noexcept {
  const uint64_t words[4] = {fingerprint.lo, fingerprint.hi, id.lo, id.hi};
  const XXH128_hash_t h = XXH3_128bits_withSeed(words, sizeof(words), kCalibrationKeySeed);
  return kdn_key{h.low64, h.high64};
}

Status CalibrationCatalog::add(std::span<const std::byte> object, const kdn_key* expect_id, bool make_current,
                               CalibrationRef* out) noexcept {
  std::shared_ptr<CalibrationObject> obj;
  try {
    obj = std::make_shared<CalibrationObject>();
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "no memory for a calibration object");
  }
  obj->bytes = AlignedBuffer(object.size());
  if (object.empty() || obj->bytes.data() == nullptr)
    return Status(object.empty() ? Code::kCorrupt : Code::kNoMemory, "a calibration object is empty or too large");
  std::memcpy(obj->bytes.data(), object.data(), object.size());
  Status st =
      kernels::kvc1_calibration_open(reinterpret_cast<const uint8_t*>(obj->bytes.data()), object.size(), &obj->view);
  if (!st.ok()) return st;
  if (expect_id != nullptr && !(obj->view.id == *expect_id))
    return Status(Code::kCorrupt, "a calibration object is not the calibration its key names");
  std::lock_guard lock(mu_);
  try {
    auto [it, inserted] = by_id_.try_emplace(obj->view.id, obj);
    if (make_current) current_[it->second->view.fingerprint] = it->second;
    if (out != nullptr) *out = it->second;
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "no memory for a calibration object");
  }
  return OkStatus();
}

CalibrationRef CalibrationCatalog::find(const kdn_key& id) const noexcept {
  std::lock_guard lock(mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

CalibrationRef CalibrationCatalog::current(const kdn_key& fingerprint) const noexcept {
  std::lock_guard lock(mu_);
  auto it = current_.find(fingerprint);
  return it == current_.end() ? nullptr : it->second;
}

size_t CalibrationCatalog::size() const noexcept {
  std::lock_guard lock(mu_);
  return by_id_.size();
}

}  // namespace kdn::sidecar
