// kdn._kdn.EngineLayout, the host copies through it, and kdn._kdn.GpuKV.
//
// Every libkdn call runs with the GIL released. The engine's memory is named by addresses the
// caller derived from its own tensors (kdn/torch.py); before any call uses them the layout is
// checked to stay inside one allocation: the backing host tensor for the host copies, the CUDA
// allocation holding the first layer for a registration (kdnd checks every GPU request again).
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "client.h"
#include "cuda_driver.h"
#include "engine_layout.h"
#include "gpu_bindings.h"

#include <kdn/common/model.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace kdn::python {
namespace {

using Tokens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Slots = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using HostMemory = nb::ndarray<nb::device::cpu, nb::c_contig>;

std::span<const int32_t> span_of(const Tokens& a) { return {a.data(), a.shape(0)}; }
std::span<const int64_t> span_of(const Slots& a) { return {a.data(), a.shape(0)}; }

uint32_t elem_bytes_of(uint32_t dtype) {
  const uint32_t bytes = dtype_bytes(dtype);
  if (bytes == 0) throw Error(KDN_ERR_UNSUPPORTED, "kdn holds no KV of this dtype");
  return bytes;
}

PagedLayout make_layout(uint32_t dtype, std::vector<uint64_t> bases, uint64_t num_blocks, int64_t block_size,
                        uint32_t kv_heads, uint32_t head_dim, int64_t stride_block, int64_t stride_head,
                        int64_t stride_offset, int64_t stride_dim, int64_t stride_kv) {
  PagedLayout l;
  l.dtype = dtype;
  l.elem_bytes = elem_bytes_of(dtype);
  l.layer_base = std::move(bases);
  l.num_blocks = num_blocks;
  l.block_size = block_size;
  l.kv_heads = kv_heads;
  l.head_dim = head_dim;
  l.stride_block = stride_block;
  l.stride_head = stride_head;
  l.stride_offset = stride_offset;
  l.stride_dim = stride_dim;
  l.stride_kv = stride_kv;
  validate_layout(l);
  return l;
}

// The layout's slots must address its own blocks: kdnd bounds them again on the device, the
// host scatter only by the layout, so a slot past the cache is refused here.
void check_slots(const PagedLayout& l, std::span<const int64_t> slots) {
  const int64_t limit = int64_t(l.num_blocks) * l.block_size;
  for (int64_t s : slots)
    if (s >= limit) throw Error(KDN_ERR_INVALID_ARGUMENT, "a slot lies past the layout's last block");
}

void check_model_layout(const Model& m, const PagedLayout& l) {
  const kdn_model_desc& d = m.desc();
  if (d.num_layers != l.layer_base.size() || d.num_kv_heads != l.kv_heads || d.head_dim != l.head_dim)
    throw Error(KDN_ERR_MODEL_MISMATCH, "the model descriptor does not describe this KV layout");
}

// ---- host copies through a layout (the CPU form of what kdnd does on a device) ----------------

void check_host(const PagedLayout& l, const HostMemory& backing) {
  const uint64_t bytes = backing.nbytes();
  check_layout_within(l, reinterpret_cast<uint64_t>(backing.data()), bytes);
}

uint32_t host_retrieve(nb::handle model, std::span<const int32_t> tokens, const PagedLayout& l,
                       const HostMemory& backing, std::span<const int64_t> slots, uint32_t max_chunks) {
  auto m = model_of(model);
  check_model_layout(*m, l);
  check_host(l, backing);
  check_slots(l, slots);
  // The scatter reads one slot per token of the chunks it loads: never more chunks than slots.
  const uint32_t fit = uint32_t(slots.size() / m->chunk_tokens());
  if (fit == 0) return 0;
  max_chunks = max_chunks == 0 ? fit : std::min(max_chunks, fit);
  nb::gil_scoped_release nogil;
  std::vector<void*> bases;
  const kdn_engine_layout abi = layout_abi(l, bases, slots);
  uint32_t loaded = 0;
  check(m->client().call([&](kdn_client* c) {
    return kdn_retrieve_to(c, m->handle(), tokens.data(), tokens.size(), max_chunks, &abi, &loaded);
  }),
        "kdn_retrieve_to");
  return loaded;
}

uint32_t host_store(nb::handle model, std::span<const int32_t> tokens, const PagedLayout& l, const HostMemory& backing,
                    std::span<const int64_t> slots, uint32_t first_chunk, uint32_t n_chunks) {
  auto m = model_of(model);
  check_model_layout(*m, l);
  check_host(l, backing);
  check_slots(l, slots);
  if (slots.size() < uint64_t(n_chunks) * m->chunk_tokens())
    throw Error(KDN_ERR_INVALID_ARGUMENT, "store: fewer slots than the chunks' tokens");
  nb::gil_scoped_release nogil;
  std::vector<void*> bases;
  const kdn_engine_layout abi = layout_abi(l, bases, slots);
  uint32_t stored = 0;
  check(m->client().call([&](kdn_client* c) {
    return kdn_store_from(c, m->handle(), tokens.data(), tokens.size(), first_chunk, n_chunks, &abi, &stored);
  }),
        "kdn_store_from");
  return stored;
}

// ---- GpuKV ---------------------------------------------------------------------------------

std::string bytes_of(nb::bytes b, size_t n, const char* what) {
  if (b.size() != n)
    throw Error(KDN_ERR_INVALID_ARGUMENT, std::string(what) + " must be " + std::to_string(n) + " bytes");
  return std::string(b.c_str(), n);
}

// The registration covers exactly the bytes the layout reaches, checked inside the allocation.
std::pair<uint64_t, uint64_t> layout_range(const PagedLayout& l, const CudaAllocation& a) {
  check_layout_within(l, a.base, a.bytes);
  return layout_bytes(l);
}

class GpuKV {
 public:
  GpuKV(nb::handle model, const PagedLayout& layout, nb::bytes engine_event)
      : model_(model_of(model)), layout_(layout) {
    check_model_layout(*model_, layout_);
    const std::string event = bytes_of(engine_event, KDN_GPU_HANDLE_BYTES, "engine_event");
    nb::gil_scoped_release nogil;
    const CudaAllocation a = cuda_allocation_of(layout_.layer_base[0]);
    const auto [first, end] = layout_range(layout_, a);
    kdn_gpu_kv_desc d{};
    d.struct_size = sizeof d;
    d.kind = KDN_GPU_MEMORY_IPC;
    const std::string uuid = cuda_device_uuid(a.device);
    std::memcpy(d.device_uuid, uuid.data(), sizeof d.device_uuid);
    d.engine_base = first;
    d.bytes = end - first;
    d.alloc_offset = first - a.base;
    d.alloc_bytes = a.bytes;
    const std::string handle = cuda_ipc_mem_handle(a.base);
    std::memcpy(d.ipc_handle, handle.data(), sizeof d.ipc_handle);
    d.vmm_fd = -1;
    std::memcpy(d.engine_event, event.data(), sizeof d.engine_event);
    device_ = a.device;
    check(model_->client().call([&](kdn_client* c) { return kdn_gpu_register(c, &d, &kv_); }), "kdn_gpu_register");
  }
  ~GpuKV() { unregister_quietly(); }
  GpuKV(const GpuKV&) = delete;
  GpuKV& operator=(const GpuKV&) = delete;

  int device() const { return device_; }
  nb::bytes done_event() const {
    const uint8_t* e = live() ? kdn_gpu_kv_done_event(kv_) : nullptr;
    if (!e) throw Error(KDN_ERR_INTERNAL, "the registration has no done event");
    return nb::bytes(reinterpret_cast<const char*>(e), KDN_GPU_HANDLE_BYTES);
  }

  uint32_t retrieve(nb::handle model, std::span<const int32_t> tokens, std::span<const int64_t> slots,
                    uint32_t max_chunks) {
    auto m = same_client(model);
    check_slots(layout_, slots);
    const uint32_t fit = uint32_t(slots.size() / m->chunk_tokens());
    if (fit == 0) return 0;
    max_chunks = max_chunks == 0 ? fit : std::min(max_chunks, fit);
    nb::gil_scoped_release nogil;
    std::vector<void*> bases;
    const kdn_engine_layout abi = layout_abi(layout_, bases, slots);
    uint32_t loaded = 0;
    check(m->client().call([&](kdn_client* c) {
      return kdn_gpu_retrieve(c, m->handle(), tokens.data(), tokens.size(), max_chunks, live_kv(), &abi, &loaded);
    }),
          "kdn_gpu_retrieve");
    return loaded;
  }

  uint32_t store(nb::handle model, std::span<const int32_t> tokens, std::span<const int64_t> slots,
                 uint32_t first_chunk, uint32_t n_chunks) {
    auto m = same_client(model);
    check_slots(layout_, slots);
    if (slots.size() < uint64_t(n_chunks) * m->chunk_tokens())
      throw Error(KDN_ERR_INVALID_ARGUMENT, "store: fewer slots than the chunks' tokens");
    nb::gil_scoped_release nogil;
    std::vector<void*> bases;
    const kdn_engine_layout abi = layout_abi(layout_, bases, slots);
    uint32_t stored = 0;
    check(m->client().call([&](kdn_client* c) {
      return kdn_gpu_store(c, m->handle(), tokens.data(), tokens.size(), first_chunk, n_chunks, live_kv(), &abi,
                           &stored);
    }),
          "kdn_gpu_store");
    return stored;
  }

  std::tuple<uint32_t, uint32_t> prefetch(nb::handle model, std::span<const int32_t> tokens) {
    auto m = same_client(model);
    nb::gil_scoped_release nogil;
    uint32_t cached = 0, queued = 0;
    check(m->client().call([&](kdn_client* c) {
      return kdn_gpu_prefetch(c, m->handle(), tokens.data(), tokens.size(), live_kv(), &cached, &queued);
    }),
          "kdn_gpu_prefetch");
    return {cached, queued};
  }

  // True when every retrieve since the last check landed whole, False when one failed (KDN_ERR_IO).
  bool check_tickets() {
    nb::gil_scoped_release nogil;
    const int rc = model_->client().call([&](kdn_client* c) { return kdn_gpu_check(c, live_kv()); });
    if (rc == KDN_ERR_IO) return false;
    check(rc, "kdn_gpu_check");
    return true;
  }

  void unregister() {
    nb::gil_scoped_release nogil;
    if (!kv_) return;
    kdn_gpu_kv* kv = kv_;
    kv_ = nullptr;
    check(model_->client().call_to_finish([&](kdn_client* c) { return kdn_gpu_unregister(c, kv); }),
          "kdn_gpu_unregister");
  }

 private:
  bool live() const { return kv_ != nullptr; }
  kdn_gpu_kv* live_kv() const {
    if (!kv_) throw Error(KDN_ERR_INVALID_ARGUMENT, "the GPU registration was unregistered");
    return kv_;
  }
  std::shared_ptr<Model> same_client(nb::handle model) const {
    auto m = model_of(model);
    if (&m->client() != &model_->client())
      throw Error(KDN_ERR_INVALID_ARGUMENT, "the model belongs to another client than the registration");
    check_model_layout(*m, layout_);
    return m;
  }
  void unregister_quietly() noexcept {
    if (!kv_) return;
    (void)model_->client().call_to_finish([&](kdn_client* c) { return kdn_gpu_unregister(c, kv_); });
    kv_ = nullptr;
  }

  std::shared_ptr<Model> model_;
  PagedLayout layout_;
  kdn_gpu_kv* kv_ = nullptr;
  int device_ = -1;
};

}  // namespace

void bind_engine_memory(nb::module_& m) {
  nb::class_<PagedLayout>(m, "EngineLayout",
                          "An engine's paged KV memory as kdn_engine_layout describes it: per layer the address "
                          "of element (block 0, head 0, token 0, channel 0), strides in elements, V at "
                          "K + stride_kv. kdn.torch derives it from the engine's tensors.")
      .def(
          "__init__",
          [](PagedLayout* self, uint32_t dtype, std::vector<uint64_t> bases, uint64_t num_blocks, int64_t block_size,
             uint32_t kv_heads, uint32_t head_dim, int64_t stride_block, int64_t stride_head, int64_t stride_offset,
             int64_t stride_dim, int64_t stride_kv) {
            new (self) PagedLayout(make_layout(dtype, std::move(bases), num_blocks, block_size, kv_heads, head_dim,
                                               stride_block, stride_head, stride_offset, stride_dim, stride_kv));
          },
          "dtype"_a, "layer_bases"_a, "num_blocks"_a, "block_size"_a, "kv_heads"_a, "head_dim"_a, "stride_block"_a,
          "stride_head"_a, "stride_offset"_a, "stride_dim"_a, "stride_kv"_a)
      .def_ro("dtype", &PagedLayout::dtype)
      .def_ro("layer_bases", &PagedLayout::layer_base)
      .def_ro("num_blocks", &PagedLayout::num_blocks)
      .def_ro("block_size", &PagedLayout::block_size)
      .def_ro("kv_heads", &PagedLayout::kv_heads)
      .def_ro("head_dim", &PagedLayout::head_dim)
      .def_prop_ro(
          "strides",
          [](const PagedLayout& l) {
            return std::make_tuple(l.stride_block, l.stride_head, l.stride_offset, l.stride_dim, l.stride_kv);
          },
          "(block, head, offset, dim, kv) in elements")
      .def("check_within", &check_layout_within, "base"_a, "bytes"_a,
           "Raises KdnError(INVALID_ARGUMENT) unless every byte the layout reaches lies in [base, base + bytes).")
      .def(
          "retrieve_to",
          [](const PagedLayout& l, nb::handle model, const Tokens& t, const HostMemory& backing, const Slots& s,
             uint32_t max_chunks) { return host_retrieve(model, span_of(t), l, backing, span_of(s), max_chunks); },
          "model"_a, "tokens"_a, "backing"_a, "slots"_a, "max_chunks"_a = 0,
          "Host form of a GPU retrieve: scatters the cached prefix of tokens into host memory through this layout "
          "(token i to slot slots[i]); `backing` is the one tensor all layers live in. Returns the chunks loaded.")
      .def(
          "store_from",
          [](const PagedLayout& l, nb::handle model, const Tokens& t, const HostMemory& backing, const Slots& s,
             uint32_t first, uint32_t n) { return host_store(model, span_of(t), l, backing, span_of(s), first, n); },
          "model"_a, "tokens"_a, "backing"_a, "slots"_a, "first_chunk"_a, "n_chunks"_a,
          "Host form of a GPU store: gathers chunks [first, first + n) (token i of them from slots[i]).");

  nb::class_<GpuKV>(m, "GpuKV",
                    "Device KV memory registered with kdnd's GPU tier (kdn_gpu_register). kdnd copies straight "
                    "between its tiers and these blocks; the engine orders its stream behind done_event.")
      .def(nb::init<nb::handle, const PagedLayout&, nb::bytes>(), "model"_a, "layout"_a, "engine_event"_a,
           "Registers the CUDA allocation holding `layout` (checked to lie inside it). engine_event: the IPC "
           "handle of an interprocess event the engine records after writing KV, before store().")
      .def_prop_ro("device", &GpuKV::device)
      .def_prop_ro("done_event", &GpuKV::done_event, "IPC handle of kdnd's event recorded after each retrieve.")
      .def(
          "retrieve",
          [](GpuKV& g, nb::handle m, const Tokens& t, const Slots& s, uint32_t max) {
            return g.retrieve(m, span_of(t), span_of(s), max);
          },
          "model"_a, "tokens"_a, "slots"_a, "max_chunks"_a = 0,
          "Queues the copies of the cached prefix (at most slots' whole chunks) into the blocks; returns the "
          "chunks that will be written. Wait on done_event before reading them.")
      .def(
          "store",
          [](GpuKV& g, nb::handle m, const Tokens& t, const Slots& s, uint32_t first, uint32_t n) {
            return g.store(m, span_of(t), span_of(s), first, n);
          },
          "model"_a, "tokens"_a, "slots"_a, "first_chunk"_a, "n_chunks"_a,
          "Stores chunks [first, first + n) gathered from the blocks once the engine event fired; returns "
          "the chunks written (not cached before). Returns after the commit.")
      .def(
          "prefetch", [](GpuKV& g, nb::handle m, const Tokens& t) { return g.prefetch(m, span_of(t)); }, "model"_a,
          "tokens"_a, "Brings the cached prefix into T0 of this device: (cached_chunks, queued_chunks).")
      .def("check", &GpuKV::check_tickets,
           "True if every retrieve since the last check landed whole; False if a copy failed (recompute).")
      .def("unregister", &GpuKV::unregister);

  m.def(
      "cuda_available",
      [] {
        std::string why;
        const bool ok = cuda_driver_available(&why);
        return std::make_tuple(ok, why);
      },
      "(True, '') when the CUDA driver loads and initializes, else (False, why).");
  m.def(
      "cuda_stream_wait_value",
      [](uint64_t stream, uint64_t address, uint32_t value) {
        nb::gil_scoped_release nogil;
        cuda_stream_wait_value(stream, address, value);
      },
      "stream"_a, "address"_a, "value"_a,
      "Makes a CUDA stream wait until the 32-bit word at a page-locked host address reaches value.");
  m.def(
      "cuda_allocation",
      [](uint64_t address) {
        nb::gil_scoped_release nogil;
        const CudaAllocation a = cuda_allocation_of(address);
        return std::make_tuple(a.base, a.bytes, a.device);
      },
      "address"_a, "(base, bytes, device) of the CUDA allocation holding a device address.");
}

}  // namespace kdn::python
