// kdn._kdn: the Python binding of libkdn (ABI v2) and of the paged-KV copies engines use.
//
// Every call into libkdn or into a copy runs with the GIL released. Errors raise
// kdn.KdnError, whose `code` is the kdn_status. Tensors cross by DLPack (torch, numpy and
// anything else that speaks it), CPU memory only; device memory is named by addresses the
// caller derives from its tensors (gpu_bindings.cc, kdn/torch.py).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "client.h"
#include "gpu_bindings.h"
#include "paged_io.h"
#include "paged_kv.h"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace kdn::python {
namespace {

PyObject* g_error_type = nullptr;  // kdn._kdn.KdnError

// Tokens arrive as int32 arrays (numpy, torch, ...) or as sequences of ints.
using TokenArray = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using BlockArray = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using AnyArray = nb::ndarray<nb::device::cpu>;

std::span<const int32_t> span_of(const TokenArray& a) { return {a.data(), a.shape(0)}; }
std::span<const int64_t> span_of(const BlockArray& a) { return {a.data(), a.shape(0)}; }

nb::dlpack::dtype dlpack_dtype(uint32_t d) {
  switch (d) {
    case KDN_DTYPE_F16:
      return {uint8_t(nb::dlpack::dtype_code::Float), 16, 1};
    case KDN_DTYPE_BF16:
      return {uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case KDN_DTYPE_F32:
      return {uint8_t(nb::dlpack::dtype_code::Float), 32, 1};
    case KDN_DTYPE_FP8_E4M3:
      return {uint8_t(nb::dlpack::dtype_code::Float8_E4M3FN), 8, 1};
    default:
      throw Error(KDN_ERR_INVALID_ARGUMENT, "unknown kdn dtype");
  }
}

uint32_t kdn_dtype_of(nb::dlpack::dtype t) {
  if (t.lanes != 1) return 0;
  if (t.code == uint8_t(nb::dlpack::dtype_code::Bfloat) && t.bits == 16) return KDN_DTYPE_BF16;
  if (t.code == uint8_t(nb::dlpack::dtype_code::Float) && t.bits == 16) return KDN_DTYPE_F16;
  if (t.code == uint8_t(nb::dlpack::dtype_code::Float) && t.bits == 32) return KDN_DTYPE_F32;
  if (t.code == uint8_t(nb::dlpack::dtype_code::Float8_E4M3FN) && t.bits == 8) return KDN_DTYPE_FP8_E4M3;
  return 0;
}

bool c_contiguous(const AnyArray& a) {
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) return false;
    expect *= int64_t(a.shape(i));
  }
  return true;
}

// ---- model descriptors ------------------------------------------------------------------

kdn_model_desc new_desc() {
  kdn_model_desc d{};
  d.struct_size = sizeof d;
  return d;
}

std::string desc_name(const kdn_model_desc& d) { return std::string(d.name, strnlen(d.name, sizeof d.name)); }

void set_desc_name(kdn_model_desc& d, const std::string& s) {
  if (s.size() >= sizeof d.name || s.find('\0') != std::string::npos)
    throw Error(KDN_ERR_INVALID_ARGUMENT, "model name must be at most 63 bytes without NUL");
  std::memset(d.name, 0, sizeof d.name);
  std::memcpy(d.name, s.data(), s.size());
}

void set_desc_salt(kdn_model_desc& d, nb::bytes b) {
  if (b.size() > sizeof d.engine_salt) throw Error(KDN_ERR_INVALID_ARGUMENT, "engine_salt is at most 32 bytes");
  std::memset(d.engine_salt, 0, sizeof d.engine_salt);
  std::memcpy(d.engine_salt, b.c_str(), b.size());
}

nb::bytes key_bytes(const kdn_key& k) {
  uint8_t out[16];
  std::memcpy(out, &k.lo, 8);
  std::memcpy(out + 8, &k.hi, 8);
  return nb::bytes(reinterpret_cast<const char*>(out), 16);
}

// ---- Python-facing objects ----------------------------------------------------------------

struct LookupResult {
  uint32_t hit_chunks = 0;
  uint64_t hit_tokens = 0;
  std::vector<uint32_t> tier_chunks;
};

nb::dict stats_dict(const kdn_stats& s) {
  nb::dict d;
#define KDN_STAT(f) d[#f] = s.f
  KDN_STAT(lookups);
  KDN_STAT(lookup_hit_chunks);
  KDN_STAT(lookup_miss_chunks);
  KDN_STAT(stored_chunks);
  KDN_STAT(stored_bytes);
  KDN_STAT(retrieved_chunks);
  KDN_STAT(retrieved_bytes);
  KDN_STAT(evicted_chunks);
  KDN_STAT(dropped_chunks);
  KDN_STAT(demoted_chunks);
  KDN_STAT(promoted_chunks);
  KDN_STAT(resident_chunks);
  KDN_STAT(resident_bytes);
  KDN_STAT(capacity_bytes);
  KDN_STAT(active_leases);
  KDN_STAT(open_reservations);
  KDN_STAT(in_flight_ops);
  KDN_STAT(sessions);
  KDN_STAT(protocol_errors);
  KDN_STAT(limit_errors);
  KDN_STAT(corrupt_chunks);
  KDN_STAT(expired_reservations);
  KDN_STAT(staging_bytes);
  KDN_STAT(daemon_sessions);
  KDN_STAT(daemon_requests);
  KDN_STAT(daemon_handshakes_refused);
  KDN_STAT(daemon_namespaces);
#undef KDN_STAT
  nb::list chunks, bytes, capacity;
  for (uint32_t t = 0; t < KDN_TIER_COUNT; ++t) {
    chunks.append(s.tier_resident_chunks[t]);
    bytes.append(s.tier_resident_bytes[t]);
    capacity.append(s.tier_capacity_bytes[t]);
  }
  d["tier_resident_chunks"] = chunks;
  d["tier_resident_bytes"] = bytes;
  d["tier_capacity_bytes"] = capacity;
  return d;
}

nb::dict session_dict(const kdn_session_info& s) {
  nb::dict d;
  d["admin"] = bool(s.admin);
  d["staging_bytes"] = s.staging_bytes;
  d["arena_bytes"] = s.arena_bytes;
  d["max_leases"] = s.max_leases;
  d["max_lease_count"] = s.max_lease_count;
  d["max_reservations"] = s.max_reservations;
  d["max_in_flight"] = s.max_in_flight;
  d["max_models"] = s.max_models;
  d["reservation_timeout_ms"] = s.reservation_timeout_ms;
  d["max_lease_bytes"] = s.max_lease_bytes;
  return d;
}

// The canonical shape of n chunks: (n, layers, 2, chunk_tokens, kv_heads, head_dim).
std::vector<size_t> chunk_shape(const kdn_model_desc& d, uint32_t chunk_tokens, size_t n) {
  return {n, d.num_layers, 2, chunk_tokens, d.num_kv_heads, d.head_dim};
}

// A tensor of whole canonical chunks of this model: [n, L, 2, T, H, D], C-contiguous.
size_t check_chunk_tensor(const Model& m, const AnyArray& a, const char* what) {
  const kdn_model_desc& d = m.desc();
  const auto shape = chunk_shape(d, m.chunk_tokens(), 0);
  if (kdn_dtype_of(a.dtype()) != d.dtype)
    throw Error(KDN_ERR_INVALID_ARGUMENT, std::string(what) + ": dtype differs from the model's");
  bool ok = a.ndim() == 6 && c_contiguous(a);
  for (size_t i = 1; ok && i < 6; ++i) ok = a.shape(i) == shape[i];
  if (!ok)
    throw Error(
        KDN_ERR_INVALID_ARGUMENT,
        std::string(what) + ": expected a C-contiguous [chunks, layers, 2, chunk_tokens, kv_heads, head_dim] tensor");
  return a.shape(0);
}

class PyModel;

class PyLease {
 public:
  explicit PyLease(std::unique_ptr<Lease> l) : lease_(std::move(l)) {}
  Lease& get() { return *lease_; }

 private:
  std::unique_ptr<Lease> lease_;
};

class PyReservation {
 public:
  explicit PyReservation(std::unique_ptr<Reservation> r) : res_(std::move(r)) {}
  Reservation& get() { return *res_; }

 private:
  std::unique_ptr<Reservation> res_;
};

class PyModel {
 public:
  explicit PyModel(std::shared_ptr<Model> m) : m_(std::move(m)) {}
  const std::shared_ptr<Model>& ptr() const { return m_; }
  Model& get() const { return *m_; }

  LookupResult lookup(std::span<const int32_t> tokens) const {
    kdn_lookup_result r{};
    {
      nb::gil_scoped_release nogil;
      check(m_->client().call(
                [&](kdn_client* c) { return kdn_lookup(c, m_->handle(), tokens.data(), tokens.size(), &r); }),
            "kdn_lookup");
    }
    return {r.hit_chunks, r.hit_tokens, std::vector<uint32_t>(r.tier_chunks, r.tier_chunks + KDN_TIER_COUNT)};
  }

  // Starts bringing the cached prefix of `tokens` from the disk tier into the arena; returns at
  // once. A kdnd too old for it (protocol 2.0) is not an error: there is nothing to overlap.
  bool prefetch(std::span<const int32_t> tokens) const {
    int rc;
    {
      nb::gil_scoped_release nogil;
      rc =
          m_->client().call([&](kdn_client* c) { return kdn_prefetch(c, m_->handle(), tokens.data(), tokens.size()); });
    }
    if (rc == KDN_ERR_UNSUPPORTED) return false;
    check(rc, "kdn_prefetch");
    return true;
  }

  std::unique_ptr<PyLease> lease(std::span<const int32_t> tokens, uint32_t max_chunks) const {
    kdn_lease* l = nullptr;
    {
      nb::gil_scoped_release nogil;
      check(m_->client().call([&](kdn_client* c) {
        return kdn_retrieve_lease(c, m_->handle(), tokens.data(), tokens.size(), max_chunks, &l);
      }),
            "kdn_retrieve_lease");
    }
    return std::make_unique<PyLease>(std::make_unique<Lease>(m_, l));
  }

  std::unique_ptr<PyReservation> reserve(std::span<const int32_t> tokens, uint32_t first, uint32_t n) const {
    kdn_store* s = nullptr;
    {
      nb::gil_scoped_release nogil;
      check(m_->client().call([&](kdn_client* c) {
        return kdn_store_reserve(c, m_->handle(), tokens.data(), tokens.size(), first, n, &s);
      }),
            "kdn_store_reserve");
    }
    return std::make_unique<PyReservation>(std::make_unique<Reservation>(m_, s));
  }

  // Stores whole chunks given as one tensor; returns how many were written (not already cached).
  uint32_t store(std::span<const int32_t> tokens, const AnyArray& kv, uint32_t first_chunk) const {
    const size_t n = check_chunk_tensor(*m_, kv, "store");
    if (n == 0) return 0;
    const uint64_t bytes = m_->chunk_bytes();
    const auto* base = static_cast<const uint8_t*>(kv.data());
    nb::gil_scoped_release nogil;
    uint32_t written = 0;
    uint32_t round = m_->client().call([&](kdn_client* c) { return kdn_store_max_chunks(c, m_->handle()); });
    if (round == 0) throw Error(KDN_ERR_LIMIT, "this client cannot store (read-only, or no staging room)");
    for (size_t done = 0; done < n;) {
      const uint32_t k = uint32_t(std::min<size_t>(round, n - done));
      kdn_store* s = nullptr;
      check(m_->client().call([&](kdn_client* c) {
        return kdn_store_reserve(c, m_->handle(), tokens.data(), tokens.size(), uint32_t(first_chunk + done), k, &s);
      }),
            "kdn_store_reserve");
      Reservation res(m_, s);
      for (uint32_t i = 0; i < k; ++i) {
        void* slot = res.slot(i);
        if (slot == nullptr) continue;
        kdn_copy_chunk(slot, base + (done + i) * bytes, bytes);
        ++written;
      }
      res.commit();
      done += k;
    }
    return written;
  }

  // Copies the longest cached prefix (at most out.shape[0] chunks) into `out`; returns the count.
  uint32_t retrieve(std::span<const int32_t> tokens, AnyArray& out) const {
    const size_t n = check_chunk_tensor(*m_, out, "retrieve");
    if (n == 0) return 0;
    const uint64_t bytes = m_->chunk_bytes();
    auto* base = static_cast<uint8_t*>(out.data());
    nb::gil_scoped_release nogil;
    kdn_lease* l = nullptr;
    check(m_->client().call([&](kdn_client* c) {
      return kdn_retrieve_lease(c, m_->handle(), tokens.data(), tokens.size(), uint32_t(n), &l);
    }),
          "kdn_retrieve_lease");
    Lease lease(m_, l);
    const uint32_t got = lease.chunks();
    for (uint32_t i = 0; i < got; ++i) kdn_copy_chunk(base + i * bytes, lease.chunk(i), bytes);
    lease.release();
    return got;
  }

 private:
  std::shared_ptr<Model> m_;
};

class PyClient {
 public:
  PyClient(std::optional<std::string> socket_path, std::optional<std::string> name_space,
           std::optional<std::string> token, bool read_only, bool create_namespace, bool admin, uint32_t timeout_ms,
           uint64_t staging_bytes) {
    ConnectOptions o;
    o.socket_path = socket_path.value_or("");
    o.name_space = name_space.value_or("");
    o.token = token.value_or("");
    o.flags = (read_only ? KDN_CONNECT_READ_ONLY : 0u) | (create_namespace ? KDN_CONNECT_CREATE_NAMESPACE : 0u) |
              (admin ? KDN_CONNECT_ADMIN : 0u);
    o.timeout_ms = timeout_ms;
    o.staging_bytes = staging_bytes;
    nb::gil_scoped_release nogil;
    c_ = Client::connect(o);
  }

  void close() { c_->close(); }
  bool closed() { return c_->closed(); }

  void ping() {
    nb::gil_scoped_release nogil;
    check(c_->call([](kdn_client* c) { return kdn_ping(c); }), "kdn_ping");
  }

  nb::dict stats() {
    kdn_stats s{};
    s.struct_size = sizeof s;
    {
      nb::gil_scoped_release nogil;
      check(c_->call([&](kdn_client* c) { return kdn_get_stats(c, &s); }), "kdn_get_stats");
    }
    return stats_dict(s);
  }

  nb::dict session_info() {
    kdn_session_info s{};
    s.struct_size = sizeof s;
    {
      nb::gil_scoped_release nogil;
      check(c_->call([&](kdn_client* c) { return kdn_get_session_info(c, &s); }), "kdn_get_session_info");
    }
    return session_dict(s);
  }

  PyModel register_model(const kdn_model_desc& desc) {
    kdn_model* m = nullptr;
    {
      nb::gil_scoped_release nogil;
      check(c_->call([&](kdn_client* c) { return kdn_register_model(c, &desc, &m); }), "kdn_register_model");
    }
    return PyModel(std::make_shared<Model>(c_, m, desc));
  }

  uint32_t store_max_chunks(const PyModel& m) {
    nb::gil_scoped_release nogil;
    return c_->call([&](kdn_client* c) { return kdn_store_max_chunks(c, m.get().handle()); });
  }

 private:
  std::shared_ptr<Client> c_;
};

// The engine side: one vLLM CPU KV cache, a tensor per layer.
class PyPagedKV {
 public:
  PyPagedKV(std::vector<AnyArray> layers, const std::string& isa, uint32_t chunk_tokens, uint32_t threads)
      : layers_(std::move(layers)) {
    if (layers_.empty()) throw Error(KDN_ERR_INVALID_ARGUMENT, "no layer tensors");
    PagedGeometry g;
    if (!block_layout_from_isa(isa.c_str(), &g.layout))
      throw Error(KDN_ERR_UNSUPPORTED, "no kdn block layout for the CPU attention ISA '" + isa + "'");
    const AnyArray& a = layers_[0];
    if (a.ndim() != 4)
      throw Error(KDN_ERR_INVALID_ARGUMENT, "a layer tensor must be [blocks, kv_heads, block_tokens, 2*head_dim]");
    g.layers = uint32_t(layers_.size());
    g.num_blocks = a.shape(0);
    g.kv_heads = uint32_t(a.shape(1));
    g.block_tokens = uint32_t(a.shape(2));
    g.head_dim = uint32_t(a.shape(3) / 2);
    g.chunk_tokens = chunk_tokens;
    g.dtype = kdn_dtype_of(a.dtype());
    g.elem_bytes = a.dtype().bits / 8;
    g.stride_block = a.stride(0);
    g.stride_head = a.stride(1);
    std::vector<uint8_t*> bases;
    for (const AnyArray& l : layers_) {
      bool same = l.ndim() == 4 && kdn_dtype_of(l.dtype()) == g.dtype && l.stride(0) == g.stride_block &&
                  l.stride(1) == g.stride_head && l.stride(2) == int64_t(a.shape(3)) && l.stride(3) == 1;
      for (size_t i = 0; same && i < 4; ++i) same = l.shape(i) == a.shape(i);
      if (!same || a.shape(3) % 2 != 0)
        throw Error(KDN_ERR_INVALID_ARGUMENT, "layer tensors must share one shape, dtype and row-contiguous strides");
      bases.push_back(static_cast<uint8_t*>(l.data()));
    }
    auto kv = PagedKV::create(g, std::move(bases), threads);
    if (!kv.ok()) throw Error(kv.status().raw(), kv.status().what());
    kv_ = std::move(*kv);
  }

  const PagedGeometry& geometry() const { return kv_->geometry(); }

  void check_model(const PyModel& m) const {
    if (m.get().desc().dtype != kv_->geometry().dtype || m.get().desc().num_layers != kv_->geometry().layers ||
        m.get().desc().num_kv_heads != kv_->geometry().kv_heads || m.get().desc().head_dim != kv_->geometry().head_dim)
      throw Error(KDN_ERR_MODEL_MISMATCH, "the model descriptor does not describe this KV cache");
  }

  LoadOutcome load(const PyModel& m, std::span<const int32_t> tokens, std::span<const int64_t> blocks,
                   uint32_t first_chunk, uint32_t end_chunk, int64_t first_block) {
    check_model(m);
    nb::gil_scoped_release nogil;
    return load_chunks(m.get(), *kv_, tokens, blocks, first_chunk, end_chunk, first_block);
  }

  SaveOutcome save(const PyModel& m, std::span<const int32_t> tokens, std::span<const int64_t> blocks,
                   uint32_t first_chunk, uint32_t n_chunks) {
    check_model(m);
    nb::gil_scoped_release nogil;
    return save_chunks(m.get(), *kv_, tokens, blocks, first_chunk, n_chunks);
  }

 private:
  std::vector<AnyArray> layers_;  // keeps the tensors alive
  std::unique_ptr<PagedKV> kv_;
};

void raise_error(const Error& e) {
  nb::object exc = nb::borrow(g_error_type)(e.what());
  exc.attr("code") = e.code();
  PyErr_SetObject(g_error_type, exc.ptr());
}

}  // namespace

std::shared_ptr<Model> model_of(nb::handle model) { return nb::cast<PyModel&>(model).ptr(); }

}  // namespace kdn::python

using namespace kdn::python;

NB_MODULE(_kdn, m) {
  m.doc() = "Python binding of libkdn, the client library of the kdn KV-cache sidecar";

  g_error_type = PyErr_NewExceptionWithDoc(
      "kdn._kdn.KdnError", "A libkdn call failed; `code` is the kdn status (a negative integer, see Status).",
      PyExc_RuntimeError, nullptr);
  m.attr("KdnError") = nb::borrow(g_error_type);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      raise_error(e);
    }
  });

  nb::enum_<kdn_status>(m, "Status", nb::is_arithmetic())
      .value("OK", KDN_OK)
      .value("INVALID_ARGUMENT", KDN_ERR_INVALID_ARGUMENT)
      .value("NOT_FOUND", KDN_ERR_NOT_FOUND)
      .value("NO_SPACE", KDN_ERR_NO_SPACE)
      .value("PROTOCOL", KDN_ERR_PROTOCOL)
      .value("VERSION", KDN_ERR_VERSION)
      .value("PERMISSION", KDN_ERR_PERMISSION)
      .value("UNAVAILABLE", KDN_ERR_UNAVAILABLE)
      .value("TIMEOUT", KDN_ERR_TIMEOUT)
      .value("IN_PROGRESS", KDN_ERR_IN_PROGRESS)
      .value("BUSY", KDN_ERR_BUSY)
      .value("IO", KDN_ERR_IO)
      .value("NO_MEMORY", KDN_ERR_NO_MEMORY)
      .value("CORRUPT", KDN_ERR_CORRUPT)
      .value("MODEL_MISMATCH", KDN_ERR_MODEL_MISMATCH)
      .value("UNSUPPORTED", KDN_ERR_UNSUPPORTED)
      .value("INTERNAL", KDN_ERR_INTERNAL)
      .value("LIMIT", KDN_ERR_LIMIT);
  nb::enum_<kdn_dtype>(m, "DType", nb::is_arithmetic())
      .value("F16", KDN_DTYPE_F16)
      .value("BF16", KDN_DTYPE_BF16)
      .value("F32", KDN_DTYPE_F32)
      .value("FP8_E4M3", KDN_DTYPE_FP8_E4M3);
  nb::enum_<kdn_rope_style>(m, "RopeStyle", nb::is_arithmetic())
      .value("NONE", KDN_ROPE_NONE)
      .value("NEOX", KDN_ROPE_NEOX)
      .value("GPTJ", KDN_ROPE_GPTJ);
  nb::enum_<kdn_rope_scaling>(m, "RopeScaling", nb::is_arithmetic())
      .value("NONE", KDN_ROPE_SCALING_NONE)
      .value("LINEAR", KDN_ROPE_SCALING_LINEAR)
      .value("LLAMA3", KDN_ROPE_SCALING_LLAMA3)
      .value("YARN", KDN_ROPE_SCALING_YARN);
  m.attr("TIER_COUNT") = KDN_TIER_COUNT;
  m.attr("ABI_VERSION") = KDN_ABI_VERSION;
  m.attr("PROTOCOL_VERSION") = KDN_PROTOCOL_VERSION;

  m.def("abi_version", &kdn_abi_version, "The ABI version of the libkdn this module runs with.");
  m.def(
      "strerror", [](int code) { return std::string(kdn_strerror(code)); }, "code"_a, "The name of a kdn status code.");
  m.def(
      "file_digest",
      [](const std::vector<std::string>& paths) {
        std::vector<uint8_t> d;
        {
          nb::gil_scoped_release nogil;
          d = file_digest(paths);
        }
        return nb::bytes(reinterpret_cast<const char*>(d.data()), d.size());
      },
      "paths"_a, "XXH3-128 (16 bytes) of the files' names, sizes and contents, in order.");

  // ---- ModelDesc ----------------------------------------------------------------------------
  nb::class_<kdn_model_desc>(m, "ModelDesc",
                             "Everything that decides whether two engines' KV bytes are interchangeable "
                             "(kdn_model_desc). Equal descriptors have equal fingerprints.")
      .def("__init__", [](kdn_model_desc* self) { new (self) kdn_model_desc(new_desc()); })
      .def_rw("num_layers", &kdn_model_desc::num_layers)
      .def_rw("num_kv_heads", &kdn_model_desc::num_kv_heads)
      .def_rw("head_dim", &kdn_model_desc::head_dim)
      .def_rw("dtype", &kdn_model_desc::dtype)
      .def_rw("chunk_tokens", &kdn_model_desc::chunk_tokens)
      .def_rw("rope_style", &kdn_model_desc::rope_style)
      .def_rw("rotary_dim", &kdn_model_desc::rotary_dim)
      .def_rw("rope_theta", &kdn_model_desc::rope_theta)
      .def_rw("rope_scaling", &kdn_model_desc::rope_scaling)
      .def_prop_rw(
          "rope_scaling_params",
          [](const kdn_model_desc& d) {
            return std::make_tuple(d.rope_scaling_params[0], d.rope_scaling_params[1], d.rope_scaling_params[2],
                                   d.rope_scaling_params[3]);
          },
          [](kdn_model_desc& d, const std::tuple<float, float, float, float>& p) {
            d.rope_scaling_params[0] = std::get<0>(p);
            d.rope_scaling_params[1] = std::get<1>(p);
            d.rope_scaling_params[2] = std::get<2>(p);
            d.rope_scaling_params[3] = std::get<3>(p);
          })
      .def_rw("k_channel_order", &kdn_model_desc::k_channel_order)
      .def_rw("tp_rank", &kdn_model_desc::tp_rank)
      .def_rw("tp_size", &kdn_model_desc::tp_size)
      .def_prop_rw("name", &desc_name, &set_desc_name)
      .def_prop_rw(
          "engine_salt",
          [](const kdn_model_desc& d) {
            return nb::bytes(reinterpret_cast<const char*>(d.engine_salt), sizeof d.engine_salt);
          },
          &set_desc_salt)
      .def("validate", [](const kdn_model_desc& d) { check(kdn_model_validate(&d), "invalid model descriptor"); })
      .def("fingerprint",
           [](const kdn_model_desc& d) {
             kdn_key k{};
             check(kdn_model_fingerprint(&d, &k), "invalid model descriptor");
             return key_bytes(k);
           })
      .def_prop_ro("chunk_bytes", [](const kdn_model_desc& d) { return kdn_chunk_bytes(&d); })
      .def(
          "prefix_keys",
          [](const kdn_model_desc& d, const std::vector<int32_t>& tokens) {
            std::vector<kdn_key> keys(tokens.size() / std::max<uint32_t>(1, d.chunk_tokens ? d.chunk_tokens : 256) + 1);
            size_t n = 0;
            check(kdn_prefix_keys(&d, tokens.data(), tokens.size(), keys.data(), keys.size(), &n), "kdn_prefix_keys");
            nb::list out;
            for (size_t i = 0; i < n; ++i) out.append(key_bytes(keys[i]));
            return out;
          },
          "tokens"_a, "The 16-byte prefix keys of the whole chunks of `tokens`.");

  // ---- results ------------------------------------------------------------------------------
  nb::class_<LookupResult>(m, "LookupResult")
      .def_ro("hit_chunks", &LookupResult::hit_chunks)
      .def_ro("hit_tokens", &LookupResult::hit_tokens)
      .def_ro("tier_chunks", &LookupResult::tier_chunks)
      .def("__repr__", [](const LookupResult& r) {
        return "LookupResult(hit_chunks=" + std::to_string(r.hit_chunks) +
               ", hit_tokens=" + std::to_string(r.hit_tokens) + ")";
      });
  nb::class_<LoadOutcome>(m, "LoadOutcome")
      .def_ro("loaded", &LoadOutcome::loaded)
      .def_ro("status", &LoadOutcome::status)
      .def_ro("corrupt", &LoadOutcome::corrupt)
      .def_ro("bytes", &LoadOutcome::bytes);
  nb::class_<SaveOutcome>(m, "SaveOutcome")
      .def_ro("stored", &SaveOutcome::stored)
      .def_ro("present", &SaveOutcome::present)
      .def_ro("status", &SaveOutcome::status)
      .def_ro("bytes", &SaveOutcome::bytes);

  // ---- Lease, Reservation, PendingCommit --------------------------------------------------------
  nb::class_<PyLease>(m, "Lease", "Leased chunks, read in place (zero-copy) until released.")
      .def_prop_ro("chunks", [](PyLease& l) { return l.get().chunks(); })
      .def("__len__", [](PyLease& l) { return l.get().chunks(); })
      .def(
          "chunk",
          [](nb::handle self, uint32_t i) {
            PyLease& l = nb::cast<PyLease&>(self);
            const Model& model = l.get().model();
            const auto shape = chunk_shape(model.desc(), model.chunk_tokens(), 1);
            return nb::ndarray<nb::array_api, nb::ro>(l.get().chunk(i), 5, shape.data() + 1, self, nullptr,
                                                      dlpack_dtype(model.desc().dtype), nb::device::cpu::value);
          },
          "i"_a,
          "Chunk i as a read-only [layers, 2, chunk_tokens, kv_heads, head_dim] tensor (DLPack), valid "
          "until the lease is released.")
      .def("release",
           [](PyLease& l) {
             nb::gil_scoped_release nogil;
             l.get().release();
           })
      .def_prop_ro("released", [](PyLease& l) { return l.get().released(); })
      .def("__enter__", [](nb::handle self) { return self; })
      .def("__exit__", [](PyLease& l, nb::args) {
        nb::gil_scoped_release nogil;
        l.get().release();
      });

  nb::class_<PendingCommit>(m, "PendingCommit", "A commit posted without waiting (kdn_store_commit_post).")
      .def(
          "poll",
          [](PendingCommit& p) {
            nb::gil_scoped_release nogil;
            return p.poll();
          },
          "True once the chunks are published; raises if the commit failed.")
      .def(
          "wait",
          [](PendingCommit& p, uint32_t timeout_ms) {
            nb::gil_scoped_release nogil;
            p.wait(timeout_ms);
          },
          "timeout_ms"_a = 0);

  nb::class_<PyReservation>(m, "Reservation", "Store slots in this client's staging area; aborted unless committed.")
      .def_prop_ro("chunks", [](PyReservation& r) { return r.get().chunks(); })
      .def("__len__", [](PyReservation& r) { return r.get().chunks(); })
      .def(
          "slot",
          [](nb::handle self, uint32_t i) -> nb::object {
            PyReservation& r = nb::cast<PyReservation&>(self);
            void* p = r.get().slot(i);
            if (p == nullptr) return nb::none();
            const Model& model = r.get().model();
            const auto shape = chunk_shape(model.desc(), model.chunk_tokens(), 1);
            return nb::cast(nb::ndarray<nb::array_api>(p, 5, shape.data() + 1, self, nullptr,
                                                       dlpack_dtype(model.desc().dtype), nb::device::cpu::value));
          },
          "i"_a, "Writable slot of chunk i, or None when kdnd needs no write (already cached or in flight).")
      .def("commit",
           [](PyReservation& r) {
             nb::gil_scoped_release nogil;
             r.get().commit();
           })
      .def("commit_post",
           [](PyReservation& r) {
             nb::gil_scoped_release nogil;
             return r.get().commit_post();
           })
      .def("abort",
           [](PyReservation& r) {
             nb::gil_scoped_release nogil;
             r.get().abort();
           })
      .def("__enter__", [](nb::handle self) { return self; })
      .def("__exit__", [](PyReservation& r, nb::args) {
        nb::gil_scoped_release nogil;
        r.get().abort();
      });

  // ---- Model ---------------------------------------------------------------------------------
  nb::class_<PyModel>(m, "Model", "A model registered through a Client.")
      .def_prop_ro("desc", [](const PyModel& p) { return p.get().desc(); })
      .def_prop_ro("chunk_tokens", [](const PyModel& p) { return p.get().chunk_tokens(); })
      .def_prop_ro("chunk_bytes", [](const PyModel& p) { return p.get().chunk_bytes(); })
      .def_prop_ro("chunk_shape",
                   [](const PyModel& p) {
                     const auto s = chunk_shape(p.get().desc(), p.get().chunk_tokens(), 0);
                     return std::make_tuple(s[1], s[2], s[3], s[4], s[5]);
                   })
      .def(
          "lookup", [](const PyModel& p, const TokenArray& t) { return p.lookup(span_of(t)); }, "tokens"_a)
      .def(
          "lookup", [](const PyModel& p, const std::vector<int32_t>& t) { return p.lookup(t); }, "tokens"_a,
          "How many leading whole chunks of `tokens` are cached on the node.")
      .def(
          "prefetch", [](const PyModel& p, const TokenArray& t) { return p.prefetch(span_of(t)); }, "tokens"_a)
      .def(
          "prefetch", [](const PyModel& p, const std::vector<int32_t>& t) { return p.prefetch(t); }, "tokens"_a,
          "Starts reading the cached prefix of `tokens` from the disk tier into host memory and returns at "
          "once (False from a kdnd without prefetch).")
      .def(
          "lease", [](const PyModel& p, const TokenArray& t, uint32_t max) { return p.lease(span_of(t), max); },
          "tokens"_a, "max_chunks"_a = 0)
      .def(
          "lease", [](const PyModel& p, const std::vector<int32_t>& t, uint32_t max) { return p.lease(t, max); },
          "tokens"_a, "max_chunks"_a = 0, "Leases the longest cached prefix (at most max_chunks; 0: all).")
      .def(
          "reserve",
          [](const PyModel& p, const TokenArray& t, uint32_t first, uint32_t n) {
            return p.reserve(span_of(t), first, n);
          },
          "tokens"_a, "first_chunk"_a, "n_chunks"_a)
      .def(
          "reserve",
          [](const PyModel& p, const std::vector<int32_t>& t, uint32_t first, uint32_t n) {
            return p.reserve(t, first, n);
          },
          "tokens"_a, "first_chunk"_a, "n_chunks"_a, "Reserves store slots for chunks [first, first + n) of tokens.")
      .def(
          "store",
          [](const PyModel& p, const TokenArray& t, const AnyArray& kv, uint32_t first) {
            return p.store(span_of(t), kv, first);
          },
          "tokens"_a, "kv"_a, "first_chunk"_a = 0)
      .def(
          "store",
          [](const PyModel& p, const std::vector<int32_t>& t, const AnyArray& kv, uint32_t first) {
            return p.store(t, kv, first);
          },
          "tokens"_a, "kv"_a, "first_chunk"_a = 0,
          "Stores kv ([n, layers, 2, chunk_tokens, kv_heads, head_dim]) as chunks [first, first + n) of tokens; "
          "returns how many were written (the rest were cached already).")
      .def(
          "retrieve", [](const PyModel& p, const TokenArray& t, AnyArray out) { return p.retrieve(span_of(t), out); },
          "tokens"_a, "out"_a)
      .def(
          "retrieve", [](const PyModel& p, const std::vector<int32_t>& t, AnyArray out) { return p.retrieve(t, out); },
          "tokens"_a, "out"_a,
          "Copies the longest cached prefix of tokens (at most out.shape[0] chunks) into out; returns the count.");

  // ---- Client --------------------------------------------------------------------------------
  nb::class_<PyClient>(m, "Client", "A connection to kdnd (one session). Calls are serialized per client.")
      .def(nb::init<std::optional<std::string>, std::optional<std::string>, std::optional<std::string>, bool, bool,
                    bool, uint32_t, uint64_t>(),
           "socket_path"_a = nb::none(), "namespace"_a = nb::none(), "token"_a = nb::none(), nb::kw_only(),
           "read_only"_a = false, "create_namespace"_a = false, "admin"_a = false, "timeout_ms"_a = 0,
           "staging_bytes"_a = 0)
      .def("close", &PyClient::close, "Ends the session once every lease and reservation made through it is gone.")
      .def_prop_ro("closed", &PyClient::closed)
      .def("ping", &PyClient::ping)
      .def("stats", &PyClient::stats, "kdnd's counters for this client's namespace.")
      .def("session_info", &PyClient::session_info)
      .def("register_model", &PyClient::register_model, "desc"_a)
      .def("store_max_chunks", &PyClient::store_max_chunks, "model"_a)
      .def("__enter__", [](nb::handle self) { return self; })
      .def("__exit__", [](PyClient& c, nb::args) { c.close(); });

  bind_engine_memory(m);

  // ---- PagedKV -------------------------------------------------------------------------------
  nb::class_<PyPagedKV>(m, "PagedKV",
                        "vLLM's CPU paged KV cache (a [blocks, kv_heads, block_tokens, 2*head_dim] tensor per "
                        "layer) as kdn loads and stores it.")
      .def(nb::init<std::vector<AnyArray>, const std::string&, uint32_t, uint32_t>(), "layers"_a, "isa"_a,
           "chunk_tokens"_a, "threads"_a = 1)
      .def_prop_ro("num_blocks", [](const PyPagedKV& k) { return k.geometry().num_blocks; })
      .def_prop_ro("block_tokens", [](const PyPagedKV& k) { return k.geometry().block_tokens; })
      .def(
          "load",
          [](PyPagedKV& k, const PyModel& m, const TokenArray& t, const BlockArray& b, uint32_t first, uint32_t end,
             int64_t first_block) { return k.load(m, span_of(t), span_of(b), first, end, first_block); },
          "model"_a, "tokens"_a, "blocks"_a, "first_chunk"_a, "end_chunk"_a, "first_block"_a,
          "Loads chunks [first_chunk, end_chunk) into the request's blocks (blocks before first_block are "
          "left alone); every element is checked finite.")
      .def(
          "save",
          [](PyPagedKV& k, const PyModel& m, const TokenArray& t, const BlockArray& b, uint32_t first, uint32_t n) {
            return k.save(m, span_of(t), span_of(b), first, n);
          },
          "model"_a, "tokens"_a, "blocks"_a, "first_chunk"_a, "n_chunks"_a,
          "Stores chunks [first_chunk, first_chunk + n_chunks) from the request's blocks.");
}
