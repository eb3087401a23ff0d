// `kdn-bench disk --dir DIR`: T2 against fio on the same directory, in one run.
//
// Baselines (fio, on a file in DIR in the state of kdn's slab files: fallocated, then written
// once with O_DIRECT; one job, O_DIRECT, io_uring with fixed buffers and registered files,
// blocks of one chunk, the queue depth kdnd uses): random read, sequential read, random
// overwrite and sequential write. A demotion writes slab slots in ascending order (the slab
// allocator hands them out so), so its write is set beside both: sequential write is the
// like-for-like limit, random overwrite the harder pattern.
//
// kdn (a kdnd of this build with its disk tier in DIR):
//   t2_write_gbps            demotion: the arena holds `data` bytes of chunks; an operator's
//                            `evict --all --tier host` writes them all down; chunk bytes / time
//   t2_read_gbps             promotion: those chunks, now only on disk, are leased by engines
//                            (`lessees` threads, documents in random order; the chunks of a
//                            document lie in random places on disk) and come back through
//                            io_uring into the arena, each checked against its CRC32C
//   t2_read_gbps_by_codec    the same per codec (namespaces with disk_codec), in decoded bytes
//                            per second: decode on kdnd's workers included
//   recovery_s_10k           10,000 chunks of 64 KiB written through, kdnd SIGKILLed and
//                            restarted: the time it logs for rebuilding the index from headers
//   prefetch_hidden_fraction an engine prefetches a disk-only document, computes for as long as
//                            the cold lease took, then leases: 1 - (lease wait / cold lease)
//   lookup latency           LOOKUP round trips of a cached document, idle and while other
//                            engines keep promotions saturating the disk. kdn_lookup from
//                            token ids: libkdn hashes the document's tokens first, so the
//                            idle figure is the hashing plus the round trip; the keys-only
//                            figure (kdn_lookup_keys, the keys hashed once) is what
//                            `kdn-bench node` calls lookup_rtt
// Ratios are paired: each kdn write and read pass runs right after an fio run of its kind on
// the same file, and the ratio reported is the median of the pairs (a shared machine's load
// moves both alike). (A VM's disk may sit on the host's cache: the figures are claimed only
// relative to fio on the same file.)
#include "admin_client.h"
#include "commands.h"
#include "kdnd_process.h"
#include "node_workload.h"
#include "process.h"
#include "report.h"
#include "stats.h"

#include <kdn/common/clock.h>
#include <kdn/common/model.h>
#include <kdn/common/model_presets.h>
#include <kdn/ipc/handshake.h>
#include <kdn/ipc/ops.h>
#include <kdn/ipc/session.h>
#include <kdn/ipc/uds.h>
#include <kdn/kdn.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/synthetic.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

namespace kdn::bench {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
// Chunks per document: 32 is an 8K-token document of 256-token chunks (--doc-chunks).
uint32_t kDocChunks = 32;
const char* const kCodecs[] = {"lossless", "int8", "kivi4"};

struct DiskOptions {
  std::string dir;
  bool json = false;
  std::string model = "smollm2-135m";
  uint64_t data_mib = 2048;
  uint64_t codec_mib = 256;
  uint32_t queue_depth = 32;
  uint32_t lessees = 2;
  uint32_t read_passes = 5;
  double fio_seconds = 5;
  uint32_t recovery_chunks = 10000;
  uint32_t lookup_samples = 20000;
  uint32_t prefetch_docs = 5;
  uint32_t doc_chunks = 32;
  std::string kdnd;
  bool no_codecs = false;
};

// ---- engines (libkdn clients; one per thread) ------------------------------------------------------

// An engine that only reads connects without a staging area: kdnd would otherwise allocate
// and pre-fault one for it, work that has nothing to do with what is measured.
enum class Role { kWriter, kReader };

struct Engine {
  kdn_client* c = nullptr;
  kdn_model* m = nullptr;
  Engine(const std::string& socket, const std::string& ns, const kdn_model_desc& desc, Role role = Role::kReader) {
    kdn_connect_opts o{};
    o.struct_size = sizeof o;
    o.socket_path = socket.c_str();
    o.name_space = ns.c_str();
    o.timeout_ms = 60000;
    if (role == Role::kReader) o.flags = KDN_CONNECT_READ_ONLY;
    if (kdn_connect(&o, &c) != KDN_OK) return;
    if (kdn_register_model(c, &desc, &m) != KDN_OK) m = nullptr;
  }
  ~Engine() { kdn_disconnect(c); }
  bool ok() const { return c && m; }
};

std::vector<int32_t> doc_tokens(uint32_t doc, uint32_t chunk_tokens) {
  std::vector<int32_t> t(size_t(kDocChunks) * chunk_tokens);
  uint64_t x = 0x9E3779B97F4A7C15ull * (doc + 77);
  for (auto& v : t) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = int32_t(x % 49152);
  }
  return t;
}

// Stores documents [first, first + n): each chunk's bytes are `content[chunk % content.size()]`
// with the document and chunk numbers written into its first 16 bytes (so each is checked).
bool store_docs(Engine& e, uint32_t first, uint32_t n, const std::vector<std::vector<uint8_t>>& content) {
  const uint64_t bytes = kdn_model_chunk_bytes(e.m);
  const uint32_t T = kdn_model_chunk_tokens(e.m);
  for (uint32_t d = first; d < first + n; ++d) {
    auto tok = doc_tokens(d, T);
    kdn_store* s = nullptr;
    if (kdn_store_reserve(e.c, e.m, tok.data(), tok.size(), 0, kDocChunks, &s) != KDN_OK) return false;
    for (uint32_t i = 0; i < kdn_store_chunks(s); ++i) {
      auto* p = static_cast<uint8_t*>(kdn_store_chunk_data(s, i));
      if (!p) continue;
      kdn_copy_chunk(p, content[i % content.size()].data(), bytes);
      const uint64_t tag[2] = {d, i};
      std::memcpy(p, tag, sizeof tag);
    }
    if (kdn_store_commit(e.c, s) != KDN_OK) return false;
  }
  return true;
}

// Leases document d whole; false if it is not all there or a chunk is not the one stored.
bool lease_doc(Engine& e, uint32_t d) {
  const uint32_t T = kdn_model_chunk_tokens(e.m);
  auto tok = doc_tokens(d, T);
  kdn_lease* l = nullptr;
  if (kdn_retrieve_lease(e.c, e.m, tok.data(), tok.size(), 0, &l) != KDN_OK) return false;
  bool good = kdn_lease_chunks(l) == kDocChunks;
  for (uint32_t i = 0; good && i < kDocChunks; ++i) {
    uint64_t tag[2];
    std::memcpy(tag, kdn_lease_chunk_data(l, i), sizeof tag);
    good = tag[0] == d && tag[1] == i;
  }
  return kdn_lease_release(e.c, l) == KDN_OK && good;
}

// ---- files in the state of kdn's slab files ------------------------------------------------------

Status make_written_file(const std::string& path, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return Status::from_errno("creating the fio file", errno);
  (void)::fallocate(fd, 0, 0, off_t(bytes));
  void* zeros = std::aligned_alloc(4096, 8 * kMiB);
  std::memset(zeros, 0, 8 * kMiB);
  Status st;
  for (uint64_t off = 0; off < bytes && st.ok(); off += 8 * kMiB) {
    const size_t n = size_t(std::min<uint64_t>(8 * kMiB, bytes - off));
    if (::pwrite(fd, zeros, n, off_t(off)) != ssize_t(n)) st = Status::from_errno("writing the fio file", errno);
  }
  std::free(zeros);
  ::close(fd);
  return st;
}

// One fio run; GB/s of `rw` (read or write side), or none if fio is missing or failed. It runs
// for `seconds`, or (seconds 0) until it moved `io_bytes`.
std::optional<double> run_fio(const std::string& fio, const std::string& file, uint64_t file_bytes,
                              const std::string& rw, uint64_t block, uint32_t depth, double seconds,
                              nlohmann::json* raw, uint64_t io_bytes = 0) {
  if (fio.empty()) return std::nullopt;
  std::ostringstream cmd;
  cmd << fio << " --name=kdn-bench --filename=" << file << " --size=" << file_bytes
      << " --direct=1 --ioengine=io_uring --fixedbufs=1 --registerfiles=1 --numjobs=1 --bs=" << block
      << " --iodepth=" << depth << " --rw=" << rw;
  if (seconds > 0)
    cmd << " --time_based=1 --runtime=" << seconds;
  else
    cmd << " --io_size=" << io_bytes;
  cmd << " --norandommap=1 --randrepeat=0 --output-format=json 2>/dev/null";
  FILE* p = ::popen(cmd.str().c_str(), "r");
  if (!p) return std::nullopt;
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  if (::pclose(p) != 0) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded() || !j.contains("jobs") || j["jobs"].empty()) return std::nullopt;
  const auto& job = j["jobs"][0];
  const char* side = rw.find("write") != std::string::npos ? "write" : "read";
  if (raw) (*raw)[rw] = {{"bw_bytes", job[side]["bw_bytes"]}, {"iops", job[side]["iops"]}};
  return job[side]["bw_bytes"].get<double>() / 1e9;
}

// ---- phases ------------------------------------------------------------------------------------------

struct Kdnd {
  std::string socket, log;
  std::optional<KdndProcess> process;
};

Result<Kdnd> start_kdnd(const DiskOptions& o, const std::string& root, const std::string& tag, uint64_t arena,
                        std::vector<std::string> args) {
  Kdnd k;
  k.socket = root + "/" + tag + ".sock";
  k.log = root + "/" + tag + ".log";
  KdndOptions ko;
  ko.binary = o.kdnd.empty() ? default_kdnd_path() : o.kdnd;
  ko.socket_path = k.socket;
  ko.log_path = k.log;
  ko.host_arena_bytes = arena;
  args.insert(args.end(), {"--log-level", "info"});
  ko.extra_args = std::move(args);
  auto p = KdndProcess::start(ko);
  if (!p.ok()) {
    std::fprintf(stderr, "kdn-bench disk: kdnd: %s\n%s", describe(p.status()).c_str(), file_tail(k.log).c_str());
    return p.status();
  }
  k.process.emplace(std::move(p.value()));
  return k;
}

// Promotion of every document by `lessees` engines in random order; GB/s, or none on a failure.
std::optional<double> read_all(const std::string& socket, const std::string& ns, const kdn_model_desc& desc,
                               uint32_t docs, uint32_t lessees, uint64_t seed) {
  std::vector<uint32_t> order(docs);
  for (uint32_t i = 0; i < docs; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  std::atomic<uint32_t> next{0};
  std::atomic<bool> failed{false};
  std::vector<std::unique_ptr<Engine>> engines;
  for (uint32_t t = 0; t < lessees; ++t) engines.push_back(std::make_unique<Engine>(socket, ns, desc));
  for (auto& e : engines)
    if (!e->ok()) return std::nullopt;
  const uint64_t t0 = now_ns();
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < lessees; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t i; (i = next.fetch_add(1)) < docs;)
        if (!lease_doc(*engines[t], order[i])) failed = true;
    });
  }
  for (auto& th : threads) th.join();
  const uint64_t ns_spent = now_ns() - t0;
  if (failed) return std::nullopt;
  return gb_per_s(uint64_t(docs) * kDocChunks * kdn_model_chunk_bytes(engines[0]->m), ns_spent);
}

std::vector<std::vector<uint8_t>> synthetic_content(const kdn_model_desc& desc, uint32_t n) {
  auto info = ModelInfo::from_desc(desc);
  const kernels::ChunkGeometry g = kernels::chunk_geometry_of(*info);
  std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(info->chunk_bytes));
  for (uint32_t i = 0; i < n; ++i) {
    kernels::SyntheticKvParams p;
    p.seed = 1000 + i;
    (void)kernels::fill_synthetic_kv(out[i].data(), g, p);
  }
  return out;
}

// The median of `runs`, with every run reported under `key`_runs.
void set_runs(Report& r, const std::string& key, const std::vector<double>& runs) {
  if (runs.empty()) return r.set_null(key);
  r.set(key, median(runs));
  r.set_json(key + "_runs", Report::Json(runs));
}

// fio beside kdn: the same file, block size and depth as the baselines, moving the bytes a
// kdn pass moves (a disk behind a host cache is faster for short bursts: like for like).
struct FioPair {
  std::string fio, file;
  uint64_t bytes = 0, block = 0;
  uint32_t depth = 0;
  std::optional<double> run(const std::string& rw) const {
    if (fio.empty() || file.empty()) return std::nullopt;
    return run_fio(fio, file, bytes, rw, block, depth, 0, nullptr, bytes);
  }
};

void main_phases(Report& r, const DiskOptions& o, const std::string& root, const kdn_model_desc& desc,
                 const FioPair& fio) {
  const uint64_t chunk = kdn_chunk_bytes(&desc);
  const uint32_t docs = uint32_t(std::max<uint64_t>(2, o.data_mib * kMiB / (chunk * kDocChunks)));
  const uint64_t data = uint64_t(docs) * kDocChunks * chunk;
  const uint64_t codec_docs = std::max<uint64_t>(1, o.codec_mib * kMiB / (chunk * kDocChunks));
  const uint64_t codec_arena = (codec_docs * kDocChunks * chunk + 256 * kMiB) / kMiB * kMiB;
  std::vector<std::string> args = {
      "--set", "tier.disk.dirs=" + root + "/kdn",
      "--set", "tier.disk.bytes=" + std::to_string((data + data / 4 + 256 * kMiB) / kMiB) + "M",
      "--set", "tier.disk.queue_depth=" + std::to_string(o.queue_depth),
      "--set", "tier.disk.read_ahead=" + std::to_string(o.queue_depth),
      "--set", "tier.disk.encode_queue=65536",  // every demotion encoded: the codec figures are the codec's
      "--set", "tier.disk.flush_on_stop=false"};
  if (!o.no_codecs)
    for (const char* c : kCodecs) {
      const std::string ns = std::string("namespace.bench-") + c + ".";
      args.insert(args.end(), {"--set", ns + "disk_codec=" + c, "--set",
                               ns + "max_bytes=" + std::to_string(codec_arena / kMiB) + "M", "--set",
                               ns + "disk_bytes=" + std::to_string(2 * codec_arena / kMiB) + "M"});
    }
  std::fprintf(stderr, "kdn-bench disk: starting kdnd (arena %llu MiB, disk tier in %s/kdn)\n",
               (unsigned long long)((data + 256 * kMiB) >> 20), root.c_str());
  auto k = start_kdnd(o, root, "kdnd", (data + 256 * kMiB) / kMiB * kMiB, args);
  if (!k.ok()) return;
  AdminClient admin(k->socket, "default");
  if (!admin.ok()) {
    std::fprintf(stderr, "kdn-bench disk: no admin connection (is this uid in admin_uids?)\n");
    return;
  }
  // Store, then write everything down: the demotion rate. Each pass is paired with an fio
  // overwrite run right before it, so both see the same machine.
  std::vector<std::vector<uint8_t>> content(1, std::vector<uint8_t>(chunk));
  for (uint64_t i = 0; i < chunk; ++i) content[0][i] = uint8_t(i * 131 + 7);
  std::vector<double> writes, write_pairs, seq_write_pairs, reads, read_pairs, fio_w, fio_sw, fio_r;
  for (uint32_t pass = 0; pass < o.read_passes; ++pass) {
    if (pass > 0) {  // start over: drop every copy (an operator's evict --all), store again
      if (!admin.evict_all()) break;
    }
    {
      Engine e(k->socket, "default", desc, Role::kWriter);
      std::fprintf(stderr, "kdn-bench disk: pass %u: storing %u documents (%.2f GiB) in the arena...\n", pass + 1, docs,
                   double(data) / double(1ull << 30));
      if (!e.ok() || !store_docs(e, 0, docs, content)) {
        std::fprintf(stderr, "kdn-bench disk: storing failed\n");
        return;
      }
    }
    const auto before = admin.disk_stats();
    const auto fw = fio.run("randwrite");
    const auto fsw = fio.run("write");  // sequential: the order the slab allocator writes in
    std::fprintf(stderr, "kdn-bench disk: pass %u: demotion of everything to disk...\n", pass + 1);
    uint64_t t0 = now_ns();
    const bool demoted = admin.demote_all();
    const uint64_t write_ns = now_ns() - t0;
    const auto after = admin.disk_stats();
    if (!demoted || !before || !after || after->demoted_bytes - before->demoted_bytes < data) {
      std::fprintf(stderr, "kdn-bench disk: the demotion did not write everything\n");
      break;
    }
    const double w = gb_per_s(after->demoted_bytes - before->demoted_bytes, write_ns);
    writes.push_back(w);
    if (fw) {
      fio_w.push_back(*fw);
      write_pairs.push_back(w / *fw);
    }
    if (fsw) {
      fio_sw.push_back(*fsw);
      seq_write_pairs.push_back(w / *fsw);
    }
    r.set("kdn.fixed_buffers", (after->flags & ipc::kTierStatsFixedBuffers) != 0);
    // Promotion of all of it, in random document order.
    const auto fr = fio.run("randread");
    std::fprintf(stderr, "kdn-bench disk: pass %u: promotion...\n", pass + 1);
    auto g = read_all(k->socket, "default", desc, docs, o.lessees, 7 + pass);
    if (!g) {
      std::fprintf(stderr, "kdn-bench disk: a promotion failed\n");
      break;
    }
    reads.push_back(*g);
    if (fr) {
      fio_r.push_back(*fr);
      read_pairs.push_back(*g / *fr);
    }
  }
  set_runs(r, "kdn.t2_write_gbps", writes);
  set_runs(r, "kdn.t2_read_gbps", reads);
  set_runs(r, "baselines.paired.fio_overwrite_gbps", fio_w);
  set_runs(r, "baselines.paired.fio_seqwrite_gbps", fio_sw);
  set_runs(r, "ratios.paired.write_vs_fio_seqwrite", seq_write_pairs);
  set_runs(r, "baselines.paired.fio_randread_gbps", fio_r);
  set_runs(r, "ratios.paired.write_vs_fio", write_pairs);
  set_runs(r, "ratios.paired.read_vs_fio", read_pairs);
  if (auto after = admin.disk_stats()) {
    r.set("kdn.disk.reads", after->reads);
    r.set("kdn.disk.faults_crc", after->fault_crc);
    r.set("kdn.disk.retries", after->retries);
    r.set("kdn.disk.short_transfers", after->short_transfers);
  }
  // Prefetch before a prefill: how much of the cold read it hides.
  {
    Engine e(k->socket, "default", desc);
    std::vector<double> hidden, cold_s, wait_s;
    const uint32_t T = kdn_model_chunk_tokens(e.m);
    for (uint32_t i = 0; i < std::min(o.prefetch_docs, docs) && e.ok(); ++i) {
      if (!admin.demote_all()) break;
      uint64_t a = now_ns();
      if (!lease_doc(e, i)) break;
      const uint64_t cold = now_ns() - a;
      if (!admin.demote_all()) break;
      auto tok = doc_tokens(i, T);
      if (kdn_prefetch(e.c, e.m, tok.data(), tok.size()) != KDN_OK) break;
      a = now_ns();
      while (now_ns() - a < cold) {  // the engine's prefill, as long as the cold read took
      }
      const uint64_t w0 = now_ns();
      if (!lease_doc(e, i)) break;
      const uint64_t wait = now_ns() - w0;
      hidden.push_back(std::max(0.0, 1.0 - double(wait) / double(cold)));
      cold_s.push_back(double(cold) / 1e9);
      wait_s.push_back(double(wait) / 1e9);
    }
    set_runs(r, "kdn.prefetch_hidden_fraction", hidden);
    set_runs(r, "kdn.prefetch_cold_lease_s", cold_s);
    set_runs(r, "kdn.prefetch_lease_after_prefill_s", wait_s);
  }
  // Lookup latency, idle and under promotions that keep the disk busy.
  {
    Engine probe(k->socket, "default", desc);
    const uint32_t T = kdn_model_chunk_tokens(probe.m);
    auto tok = doc_tokens(0, T);
    kdn_lease* pin = nullptr;  // document 0 stays in the arena: lookups measure the control path
    if (probe.ok() && kdn_retrieve_lease(probe.c, probe.m, tok.data(), tok.size(), 0, &pin) == KDN_OK) {
      // The keys, hashed once, for the keys-only lookups (what kdn-bench node's lookup_rtt times).
      std::vector<kdn_key> keys(tok.size() / T);
      size_t n_keys = 0;
      const bool keyed = kdn_prefix_keys(&desc, tok.data(), tok.size(), keys.data(), keys.size(), &n_keys) == KDN_OK;
      // Lookups from token ids, and (when `with_keys`) each followed by one from the keys, so both
      // kinds see the same moment of the machine and of kdnd.
      auto sample = [&](uint32_t n, std::vector<uint64_t>* keys_ns) {
        std::vector<uint64_t> ns;
        ns.reserve(n);
        kdn_lookup_result res{};
        for (uint32_t i = 0; i < n; ++i) {
          uint64_t a = now_ns();
          if (kdn_lookup(probe.c, probe.m, tok.data(), tok.size(), &res) != KDN_OK || res.hit_chunks != kDocChunks)
            break;
          ns.push_back(now_ns() - a);
          if (keys_ns == nullptr) continue;
          a = now_ns();
          if (kdn_lookup_keys(probe.c, probe.m, keys.data(), n_keys, &res) != KDN_OK || res.hit_chunks != kDocChunks)
            break;
          keys_ns->push_back(now_ns() - a);
        }
        return summarize_ns(ns);
      };
      std::vector<uint64_t> keys_ns;
      const LatencySummary idle = sample(o.lookup_samples, keyed ? &keys_ns : nullptr);
      if (keyed && !keys_ns.empty()) {
        const LatencySummary by_keys = summarize_ns(keys_ns);
        r.set("kdn.lookup.idle_keys_p50_us", by_keys.p50_us);
        r.set("kdn.lookup.idle_keys_p99_us", by_keys.p99_us);
        r.set("kdn.lookup.tokens_per_lookup", uint64_t(tok.size()));
      }
      std::atomic<bool> stop{false};
      std::atomic<uint64_t> promoted{0};
      std::thread load([&] {
        AdminClient a2(k->socket, "default");
        Engine e(k->socket, "default", desc);
        for (uint32_t pass = 0; !stop && e.ok() && a2.ok(); ++pass) {
          if (!a2.demote_all()) break;
          for (uint32_t d = 1; d < docs && !stop; ++d)
            if (lease_doc(e, d)) promoted += kDocChunks;
        }
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the disk is busy by now
      const LatencySummary loaded = sample(o.lookup_samples, nullptr);
      stop = true;
      load.join();
      (void)kdn_lease_release(probe.c, pin);
      r.set("kdn.lookup.idle_p50_us", idle.p50_us);
      r.set("kdn.lookup.idle_p99_us", idle.p99_us);
      r.set("kdn.lookup.idle_max_us", idle.max_us);
      r.set("kdn.lookup.loaded_p50_us", loaded.p50_us);
      r.set("kdn.lookup.loaded_p99_us", loaded.p99_us);
      r.set("kdn.lookup.loaded_max_us", loaded.max_us);
      r.set("kdn.lookup.samples", uint64_t(idle.samples + loaded.samples));
      r.set("kdn.lookup.chunks_promoted_meanwhile", promoted.load());
    }
  }
  // Codecs: decoded bytes per second, and what they store.
  if (!o.no_codecs) {
    const auto synth = synthetic_content(desc, 8);
    std::vector<double> none_runs;
    for (const char* c : kCodecs) {
      const std::string ns = std::string("bench-") + c;
      AdminClient a(k->socket, ns);
      Engine e(k->socket, ns, desc, Role::kWriter);
      std::fprintf(stderr, "kdn-bench disk: codec %s: storing %llu documents of synthetic KV...\n", c,
                   (unsigned long long)codec_docs);
      if (!a.ok() || !e.ok() || !store_docs(e, 0, uint32_t(codec_docs), synth)) {
        r.set_null(std::string("kdn.t2_read_gbps_by_codec.") + c);
        continue;
      }
      const uint64_t t0 = now_ns();
      const bool ok = a.demote_all();
      const uint64_t enc_ns = now_ns() - t0;
      auto st = a.disk_stats();
      if (ok && st) {
        r.set(std::string("kdn.t2_write_gbps_by_codec.") + c, gb_per_s(st->demoted_bytes, enc_ns));
        if (st->stored_bytes_written)
          r.set(std::string("kdn.codec_ratio.") + c, double(st->raw_bytes_written) / double(st->stored_bytes_written));
      }
      std::vector<double> runs;
      for (uint32_t pass = 0; pass < o.read_passes; ++pass) {
        if (pass > 0 && !a.demote_all()) break;
        auto g = read_all(k->socket, ns, desc, uint32_t(codec_docs), o.lessees, 11 + pass);
        if (g) runs.push_back(*g);
      }
      set_runs(r, std::string("kdn.t2_read_gbps_by_codec.") + c, runs);
    }
  }
  if (auto v = r.number("kdn.t2_read_gbps")) r.set("kdn.t2_read_gbps_by_codec.none", *v);
  auto stopped = k->process->stop();
  r.set("kdnd.exit_after_sigterm", stopped.ok() ? describe_wait_status(*stopped) : std::string("not stopped"));
}

// 10,000 chunks of 64 KiB written through, SIGKILL, restart: the index rebuilt from headers.
void recovery_phase(Report& r, const DiskOptions& o, const std::string& root) {
  kdn_model_desc d = shaped_desc(2, 2, 64, 64, "kdn-bench/recovery-64k");
  const uint64_t chunk = kdn_chunk_bytes(&d);
  const uint32_t docs = (o.recovery_chunks + kDocChunks - 1) / kDocChunks;
  const uint64_t disk = (uint64_t(docs) * kDocChunks * (chunk + 4096) * 5 / 4 + 64 * kMiB) / kMiB;
  std::vector<std::string> args = {
      "--set", "tier.disk.dirs=" + root + "/recovery", "--set", "tier.disk.bytes=" + std::to_string(disk) + "M",
      "--set", "tier.disk.policy=write_through",       "--set", "tier.disk.slab_bytes=16M"};
  std::filesystem::create_directories(root + "/recovery");
  auto k = start_kdnd(o, root, "recovery", 256 * kMiB, args);
  if (!k.ok()) return;
  {
    Engine e(k->socket, "default", d, Role::kWriter);
    std::vector<std::vector<uint8_t>> content(1, std::vector<uint8_t>(chunk, 0x5A));
    std::fprintf(stderr, "kdn-bench disk: recovery: writing %u chunks of 64 KiB through to disk...\n",
                 docs * kDocChunks);
    if (!e.ok() || !store_docs(e, 0, docs, content)) return;
  }
  (void)k->process->kill();
  std::fprintf(stderr, "kdn-bench disk: recovery: kdnd SIGKILLed, restarting...\n");
  const uint64_t t0 = now_ns();
  auto again = start_kdnd(o, root, "recovery", 256 * kMiB, args);
  const double ready_s = double(now_ns() - t0) / 1e9;
  if (!again.ok()) return;
  std::ifstream in(again->log);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string log = ss.str();
  const std::regex re(
      R"(disk tier ready: (\d+) chunks \((\d+) MiB\) recovered from (\d+) slot headers in (\d+) slabs in ([0-9.]+) s)");
  std::smatch last;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it) last = *it;
  if (!last.empty()) {
    r.set("kdn.recovery_s_10k", std::stod(last[5].str()));
    r.set("kdn.recovery.chunks", uint64_t(std::stoull(last[1].str())));
    r.set("kdn.recovery.headers_read", uint64_t(std::stoull(last[3].str())));
  } else {
    r.set_null("kdn.recovery_s_10k");
  }
  r.set("kdn.recovery.restart_to_ready_s", ready_s);
  {
    Engine e(again->socket, "default", d);
    bool all = e.ok();
    for (uint32_t i = 0; all && i < docs; ++i) all = lease_doc(e, i);
    r.set("kdn.recovery.every_chunk_served", all);
  }
  (void)again->process->stop();
}

}  // namespace

int run_disk_bench(int argc, char** argv) {
  CLI::App app("kdn-bench disk: T2 (NVMe slab files, io_uring) against fio on the same directory");
  DiskOptions o;
  app.add_option("--dir", o.dir, "directory to measure (on the NVMe device T2 would use)")->required();
  app.add_flag("--json", o.json, "print JSON");
  app.add_option("--model", o.model, "chunk geometry of the main measurements (smollm2-135m, llama3-8b)")
      ->capture_default_str();
  app.add_option("--data-mib", o.data_mib, "chunk bytes written down and promoted (and fio's file size)")
      ->capture_default_str();
  app.add_option("--codec-mib", o.codec_mib, "chunk bytes per codec")->capture_default_str();
  app.add_option("--queue-depth", o.queue_depth, "io_uring depth of kdnd and fio")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  app.add_option("--lessees", o.lessees, "engine threads leasing during the promotion runs")
      ->check(CLI::Range(1u, 64u))
      ->capture_default_str();
  app.add_option("--read-passes", o.read_passes, "write and read passes, each paired with an fio run (median)")
      ->check(CLI::Range(1u, 20u))
      ->capture_default_str();
  app.add_option("--fio-seconds", o.fio_seconds, "seconds per fio baseline run")->capture_default_str();
  app.add_option("--recovery-chunks", o.recovery_chunks, "64 KiB chunks of the restart measurement")
      ->capture_default_str();
  app.add_option("--lookup-samples", o.lookup_samples, "lookups per latency measurement")->capture_default_str();
  app.add_option("--prefetch-docs", o.prefetch_docs, "documents of the prefetch measurement")->capture_default_str();
  app.add_option("--kdnd", o.kdnd, "kdnd binary (default: next to kdn-bench)");
  app.add_flag("--no-codecs", o.no_codecs, "skip the per-codec runs");
  app.add_option("--doc-chunks", o.doc_chunks, "chunks per document (32: 8K tokens)")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  kDocChunks = o.doc_chunks;
  auto model = find_model(o.model);
  if (!model) {
    std::fprintf(stderr, "kdn-bench disk: unknown model %s\n", o.model.c_str());
    return 2;
  }
  if (!o.kdnd.empty() && ::access(o.kdnd.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "kdn-bench disk: no kdnd at %s\n", o.kdnd.c_str());
    return 2;
  }
  std::string tmpl = o.dir + "/kdn-bench-disk-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "kdn-bench disk: cannot create a directory in %s: %s\n", o.dir.c_str(), std::strerror(errno));
    return 2;
  }
  const std::string root = tmpl;
  std::filesystem::create_directories(root + "/kdn");
  struct Cleanup {
    std::string path;
    ~Cleanup() { std::filesystem::remove_all(path); }
  } cleanup{root};

  const kdn_model_desc desc = model_desc(*model);
  const uint64_t chunk = kdn_chunk_bytes(&desc);
  const uint32_t docs = uint32_t(std::max<uint64_t>(2, o.data_mib * kMiB / (chunk * kDocChunks)));
  const uint64_t data = uint64_t(docs) * kDocChunks * chunk;
  Report r;
  r.set("model", o.model);
  r.set("chunk_bytes", chunk);
  r.set("data_bytes", data);
  r.set("queue_depth", uint64_t(o.queue_depth));
  r.set("machine.loadavg_1m_start", load_average());

  // ---- fio on a file in the state of kdn's slab files
  const std::string fio = find_on_path("fio");
  const std::string fio_file = root + "/fio.dat";
  Report::Json fio_raw = Report::Json::object();
  if (fio.empty()) {
    std::fprintf(stderr, "kdn-bench disk: fio is not installed (scripts/setup.sh installs it): baselines are null\n");
  } else if (Status st = make_written_file(fio_file, data); !st.ok()) {
    std::fprintf(stderr, "kdn-bench disk: %s\n", describe(st).c_str());
  } else {
    std::fprintf(stderr, "kdn-bench disk: fio on %s (%.2f GiB, blocks of %llu bytes, depth %u)...\n", fio_file.c_str(),
                 double(data) / double(1ull << 30), (unsigned long long)chunk, o.queue_depth);
    nlohmann::json raw;
    r.set("baselines.fio_randread_gbps",
          run_fio(fio, fio_file, data, "randread", chunk, o.queue_depth, o.fio_seconds, &raw));
    r.set("baselines.fio_seqread_gbps",
          run_fio(fio, fio_file, data, "read", chunk, o.queue_depth, o.fio_seconds, &raw));
    r.set("baselines.fio_overwrite_gbps",
          run_fio(fio, fio_file, data, "randwrite", chunk, o.queue_depth, o.fio_seconds, &raw));
    r.set("baselines.fio_seqwrite_gbps",
          run_fio(fio, fio_file, data, "write", chunk, o.queue_depth, o.fio_seconds, &raw));
    r.set_json("baselines.fio", Report::Json::parse(raw.dump()));
  }
  if (!r.number("baselines.fio_randread_gbps")) r.set_null("baselines.fio_randread_gbps");
  if (!r.number("baselines.fio_seqread_gbps")) r.set_null("baselines.fio_seqread_gbps");
  if (!r.number("baselines.fio_overwrite_gbps")) r.set_null("baselines.fio_overwrite_gbps");
  if (!r.number("baselines.fio_seqwrite_gbps")) r.set_null("baselines.fio_seqwrite_gbps");

  FioPair pair{fio, std::filesystem::exists(fio_file) ? fio_file : "", data, chunk, o.queue_depth};
  main_phases(r, o, root, desc, pair);
  std::filesystem::remove(fio_file);
  recovery_phase(r, o, root);
  r.set("machine.loadavg_1m_end", load_average());

  // The ratios are the medians of the paired ones (each kdn pass against the fio run right
  // before it); the ratio of the medians against the baseline runs is shown beside them.
  const auto read = r.number("kdn.t2_read_gbps"), write = r.number("kdn.t2_write_gbps");
  r.set("ratios.read_vs_fio", r.number("ratios.paired.read_vs_fio"));
  r.set("ratios.write_vs_fio", r.number("ratios.paired.write_vs_fio"));
  r.set("ratios.write_vs_fio_seqwrite", r.number("ratios.paired.write_vs_fio_seqwrite"));
  r.set("ratios.read_vs_fio_baseline_run", ratio(read, r.number("baselines.fio_randread_gbps")));
  r.set("ratios.write_vs_fio_baseline_run", ratio(write, r.number("baselines.fio_overwrite_gbps")));
  r.set("ratios.read_vs_fio_seqread", ratio(read, r.number("baselines.fio_seqread_gbps")));
  const auto lp50 = r.number("kdn.lookup.loaded_p50_us"), ip50 = r.number("kdn.lookup.idle_p50_us");
  r.set("ratios.lookup_p50_loaded_vs_idle", ratio(lp50, ip50));
  r.set_bar("bars.read_vs_fio", r.number("ratios.read_vs_fio"), BarOp::kAtLeast, 0.9);
  r.set_bar("bars.write_vs_fio", r.number("ratios.write_vs_fio"), BarOp::kAtLeast, 0.85);
  r.set_bar("bars.recovery_s_10k", r.number("kdn.recovery_s_10k"), BarOp::kAtMost, 1.0);
  r.set_bar("bars.lookup_p50_loaded_vs_idle", r.number("ratios.lookup_p50_loaded_vs_idle"), BarOp::kAtMost, 2.0);
  r.set_bar("bars.lookup_max_loaded_us", r.number("kdn.lookup.loaded_max_us"), BarOp::kAtMost, 1000.0);
  std::printf("%s\n", o.json ? r.to_json().c_str() : r.to_table().c_str());
  return 0;
}

}  // namespace kdn::bench
