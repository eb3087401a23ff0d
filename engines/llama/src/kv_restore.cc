#include "kv_restore.h"

// llama.cpp's internal headers (src/): the memory module's state reader and its io interface.
#include <llama-io.h>
#include <llama-memory.h>

#include <ggml-backend.h>
#include <llama.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>

namespace kdn::llama {
namespace {

// llama.cpp's state reader over blob pieces. Field reads copy into llama.cpp's variables; a
// tensor read copies the KV bytes into the tensor (directly into host memory when the tensor
// lives there), checking they are finite. Errors throw, as llama.cpp's own readers do: its
// state reader then takes back the cells it had placed and rethrows.
class PieceReader final : public llama_io_read_i {
 public:
  PieceReader(KvType type, std::span<const BlobPiece> pieces, std::vector<KvCopy>* deferred) noexcept
      : type_(type), pieces_(pieces), deferred_(deferred) {
    for (const BlobPiece& p : pieces) left_ += p.size;
  }

  void read(void* dst, size_t size) override {
    uint8_t* out = static_cast<uint8_t*>(dst);
    walk(size, [&](const uint8_t* src, uint64_t n, bool) {
      std::memcpy(out, src, n);
      out += n;
    });
  }

  void read_tensor(ggml_tensor* t, size_t offset, size_t size) override {
    const size_t total = ggml_nbytes(t);
    if (offset > total || size > total - offset) throw std::runtime_error("tensor range out of bounds");
    const bool host = t->buffer != nullptr && ggml_backend_buffer_is_host(t->buffer);
    const ggml_tensor* base = t->view_src != nullptr ? t->view_src : t;
    walk(size, [&](const uint8_t* src, uint64_t n, bool kv) {
      if (host) {
        uint8_t* dst = static_cast<uint8_t*>(t->data) + offset;
        if (kv && deferred_ != nullptr)
          deferred_->push_back({base, dst, src, n});  // bad_alloc: llama.cpp's reader unwinds
        else if (!kv)
          std::memcpy(dst, src, n);
        else if (!copy_finite(type_, dst, src, n))
          fail_finite();
      } else {
        if (kv && !copy_finite(type_, nullptr, src, n)) fail_finite();
        ggml_backend_tensor_set(t, src, offset, n);
      }
      offset += n;
    });
  }

  size_t n_bytes() override { return read_; }
  uint64_t left() const noexcept { return left_; }
  bool saw_non_finite() const noexcept { return non_finite_; }

 private:
  [[noreturn]] void fail_finite() {
    non_finite_ = true;
    throw std::runtime_error("chunk holds a non-finite value");
  }

  // Hands the next `size` bytes to f piece by piece: f(src, n, kv).
  template <class F>
  void walk(uint64_t size, F&& f) {
    if (size > left_) throw std::runtime_error("read past the end of the blob");
    while (size > 0) {
      const BlobPiece& p = pieces_[i_];
      const uint64_t n = std::min(size, p.size - at_);
      f(p.data + at_, n, p.kv);
      at_ += n;
      size -= n;
      read_ += n;
      left_ -= n;
      if (at_ == p.size) {
        ++i_;
        at_ = 0;
      }
    }
  }

  KvType type_;
  std::span<const BlobPiece> pieces_;
  std::vector<KvCopy>* deferred_;
  size_t i_ = 0;       // current piece
  uint64_t at_ = 0;    // offset in it
  uint64_t left_ = 0;  // bytes not yet read
  size_t read_ = 0;
  bool non_finite_ = false;
};

}  // namespace

Status restore_seq_pieces(llama_context* ctx, int32_t seq, KvType type, std::span<const BlobPiece> pieces,
                          std::vector<KvCopy>* deferred) noexcept {
  llama_memory_t mem = llama_get_memory(ctx);
  if (mem == nullptr) return Status(Code::kInternal, "context has no KV cache");
  llama_synchronize(ctx);
  const size_t deferred_before = deferred != nullptr ? deferred->size() : 0;
  PieceReader reader(type, pieces, deferred);
  try {
    // What llama_state_seq_set_data reads before handing over to the memory module.
    uint32_t magic = 0;
    int32_t source_seq = 0;
    reader.read(&magic, sizeof magic);
    reader.read(&source_seq, sizeof source_seq);
    if (magic != kSeqStateMagic) return Status(Code::kCorrupt, "not a sequence state blob");
    mem->state_read(reader, seq, 0);
  } catch (...) {
    // llama.cpp logs its reason; ours is the non-finite value.
    llama_memory_seq_rm(mem, seq, -1, -1);
    if (deferred != nullptr) deferred->resize(deferred_before);
    if (reader.saw_non_finite()) return Status(Code::kCorrupt, "chunk holds a non-finite value");
    return Status(Code::kCorrupt, "llama.cpp refused the KV blob");
  }
  if (reader.left() != 0) {
    llama_memory_seq_rm(mem, seq, -1, -1);
    if (deferred != nullptr) deferred->resize(deferred_before);
    return Status(Code::kCorrupt, "llama.cpp did not read the whole KV blob");
  }
  return OkStatus();
}

Status check_state_round_trip(llama_context* ctx, int32_t seq, const KvGeometry& g) noexcept {
  const size_t size = llama_state_seq_get_size(ctx, seq);
  if (size != seq_blob_bytes(g, 1))
    return Status(Code::kUnsupported, "llama.cpp state blob size differs from the known format");
  std::vector<uint8_t> blob, again;
  try {
    blob.resize(size);
    again.resize(size);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "no memory for the probe blob");
  }
  if (llama_state_seq_get_data(ctx, blob.data(), size, seq) != size)
    return Status(Code::kUnsupported, "llama.cpp did not write its state blob");
  if (Result<SeqBlobView> v = parse_seq_blob(g, blob); !v.ok()) return v.status();
  // The whole blob as one piece: fields are read as fields, KV ranges checked as KV.
  llama_memory_seq_rm(llama_get_memory(ctx), seq, -1, -1);
  const BlobPiece whole{blob.data(), blob.size(), true};
  KDN_RETURN_IF_ERROR(restore_seq_pieces(ctx, seq, g.type, {&whole, 1}));
  if (llama_state_seq_get_size(ctx, seq) != size || llama_state_seq_get_data(ctx, again.data(), size, seq) != size ||
      again != blob)
    return Status(Code::kUnsupported, "restoring through the piece reader changes the KV state");
  return OkStatus();
}

}  // namespace kdn::llama
