// `kdn-bench kernels`: throughput of the layout, RoPE, blend and codec kernels against memcpy (and, on a
// GPU, against device-to-device copy) measured in the same run. docs/kernels.md describes the
// method and every field.
//
//   kdn-bench kernels [--json] [--model llama3-8b|smollm2-135m] [--chunks N] [--reps N]
//                     [--threads P] [--kv-dir DIR] [--gpu] [--seed S]
#include "baseline_figures.h"
#include "baselines.h"
#include "commands.h"
#include "report.h"

#include <kdn/common/median.h>
#include <kdn/common/model_presets.h>
#include <kdn/kernels/blend.h>
#include <kdn/kernels/cpu_rows.h>
#include <kdn/kernels/device.h>
#include <kdn/kernels/kv_file.h>
#include <kdn/kernels/ops.h>
#include <kdn/kernels/presets.h>
#include <kdn/kernels/synthetic.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#if __has_include(<kdn/kernels/codec.h>)
#define KDN_KERNELS_BENCH_CODEC 1
#include "codec_speed.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/codec_cuda.h>
#endif

namespace kdn::bench {
namespace {

using namespace kdn::kernels;

struct Options {
  std::string model = "llama3-8b";
  int chunks = 0;  // 0: enough chunks for a 256 MiB working set (well beyond the caches)
  int reps = 5;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::string kv_dir;
  bool gpu = false;
  bool json = false;
  uint64_t seed = 1;
};

struct ModelShape {
  uint32_t layers, kv_heads, head_dim;
  RopeConfig rope;
};

bool model_shape(const std::string& name, ModelShape* out) {
  const ModelPreset* p = find_model_preset(name);
  if (p == nullptr) return false;
  out->layers = p->layers;
  out->kv_heads = p->kv_heads;
  out->head_dim = p->head_dim;
  return rope_config_from_desc(preset_desc(*p, name), &out->rope).ok();
}

std::string describe(const Status& s) { return std::string(code_name(s.code())) + ": " + s.what(); }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Median GB/s of `reps` timed passes (after one untimed warm-up pass) of `pass`, which moves
// `bytes` per pass. A failing pass fails the measurement.
Result<double> median_gbps(uint64_t bytes, int reps, const std::function<Status()>& pass) {
  KDN_RETURN_IF_ERROR(pass());
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    KDN_RETURN_IF_ERROR(pass());
    gbps.push_back(static_cast<double>(bytes) / seconds_since(t0) / 1e9);
  }
  return kdn::median(std::move(gbps));
}

void record(Report& report, const std::string& key, const Result<double>& r) {
  if (r.ok()) {
    report.set(key, r.value());
    return;
  }
  report.set_null(key);
  report.set("errors." + key, describe(r.status()));
  progress("%s: %s", key.c_str(), describe(r.status()).c_str());
}

// N canonical chunks (copies of one synthetic chunk) and an engine pool that holds them all,
// each chunk on its own random blocks.
struct Workload {
  ChunkGeometry g;
  int n = 0;
  std::vector<uint8_t> chunks;
  std::vector<uint8_t> copy_target;  // memcpy destination for the paired baseline
  PagedShape shape;
  std::vector<std::vector<uint8_t>> layers;
  std::vector<void*> bases;
  std::vector<std::vector<int64_t>> slots;
  EngineView view;

  uint64_t chunk_bytes() const { return kernels::chunk_bytes(g); }
  uint8_t* chunk(int i) { return chunks.data() + static_cast<size_t>(i) * chunk_bytes(); }
  EngineView view_for(int i) const {
    EngineView v = view;
    v.slot_mapping = slots[i].data();
    return v;
  }
};

Status build_pool(Workload& w, EngineLayoutKind kind, uint64_t seed) {
  const int64_t blocks = static_cast<int64_t>(w.n) * w.g.tokens / w.shape.block_size;
  w.shape.num_blocks = blocks;
  const bool split = engine_layout_splits_kv(kind);
  const size_t bytes = engine_layer_elements(kind, w.shape) * dtype_size(w.shape.dtype);
  w.layers.assign(w.g.layers * (split ? 2 : 1), std::vector<uint8_t>(bytes, 0));  // zeroed = pre-faulted
  w.bases.clear();
  for (auto& l : w.layers) w.bases.push_back(l.data());
  std::vector<int64_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  CounterRng rng(seed);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.next_below(i)]);
  w.slots.assign(w.n, std::vector<int64_t>(w.g.tokens));
  for (int c = 0; c < w.n; ++c)
    for (uint32_t t = 0; t < w.g.tokens; ++t) {
      const int64_t logical = (int64_t{c} * w.g.tokens + t) / w.shape.block_size;
      w.slots[c][t] = order[logical] * w.shape.block_size + t % w.shape.block_size;
    }
  return preset_view(kind, w.shape, w.bases.data(), split ? w.bases.data() + w.g.layers : nullptr, false, &w.view);
}

Status build_workload(const ModelShape& m, const Options& o, Workload* w) {
  w->g = ChunkGeometry{m.layers, m.kv_heads, m.head_dim, 256, DType::kF16};
  const uint64_t bytes = kernels::chunk_bytes(w->g);
  w->n = o.chunks > 0 ? o.chunks : static_cast<int>(std::max<uint64_t>(2, (256ull << 20) / bytes));
  w->chunks.assign(static_cast<size_t>(w->n) * bytes, 0);
  w->copy_target.assign(w->chunks.size(), 0);
  SyntheticKvParams p;
  p.seed = o.seed;
  KDN_RETURN_IF_ERROR(fill_synthetic_kv(w->chunk(0), w->g, p));
  for (int i = 1; i < w->n; ++i) memcpy(w->chunk(i), w->chunk(0), bytes);
  w->shape = PagedShape{m.layers, m.kv_heads, m.head_dim, 0, 16, DType::kF16};
  return build_pool(*w, EngineLayoutKind::kVllmFlashNhd, o.seed + 1);
}

// One pass of `op` over every chunk, on `threads` CPU threads (the op parallelizes inside).
using ChunkOp = std::function<Status(Workload&, int chunk, const Executor&)>;

Status run_pass(Workload& w, const Executor& ex, const ChunkOp& op) {
  for (int i = 0; i < w.n; ++i) KDN_RETURN_IF_ERROR(op(w, i, ex));
  return OkStatus();
}

Result<double> cpu_op_gbps(Workload& w, int reps, unsigned threads, const ChunkOp& op) {
  const Executor ex = Executor::cpu(static_cast<int>(threads));
  return median_gbps(w.chunk_bytes() * w.n, reps, [&] { return run_pass(w, ex, op); });
}

// The op on one thread, each timed pass right after a timed memcpy of the same bytes, so the
// ratio compares passes that saw the same machine load: the median of per-pass ratios, over
// at least kMinPairs pairs (a pair takes tens of milliseconds).
constexpr int kMinPairs = 21;
Result<double> paired_ratio_vs_memcpy(Workload& w, int reps, const ChunkOp& op) {
  reps = std::max(reps, kMinPairs);
  const Executor ex = Executor::cpu(1);
  const double bytes = static_cast<double>(w.chunks.size());
  KDN_RETURN_IF_ERROR(run_pass(w, ex, op));
  std::vector<double> ratios;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    memcpy(w.copy_target.data(), w.chunks.data(), w.chunks.size());
    const double memcpy_gbps = bytes / seconds_since(t0) / 1e9;
    t0 = std::chrono::steady_clock::now();
    KDN_RETURN_IF_ERROR(run_pass(w, ex, op));
    ratios.push_back(bytes / seconds_since(t0) / 1e9 / memcpy_gbps);
  }
  return kdn::median(std::move(ratios));
}

void bench_copy_ops(Report& report, Workload& w, const ModelShape& m, const Options& o) {
  std::vector<float> inv(m.head_dim / 2), table(m.head_dim);
  const int64_t delta = 1000;  // re-position every chunk by 1000 tokens
  const bool rope_ok = compute_inv_freq(m.rope, inv.data(), inv.size()).ok() &&
                       build_rope_table(inv.data(), m.head_dim, &delta, 1, table.data(), table.size()).ok();
  const RopeTable rt{m.rope.style, m.head_dim, table.data(), 0};
  const std::pair<const char*, ChunkOp> ops[] = {
      {"scatter", [](Workload& w, int i, const Executor& ex) { return scatter(w.chunk(i), w.g, w.view_for(i), ex); }},
      {"gather", [](Workload& w, int i, const Executor& ex) { return gather(w.view_for(i), w.chunk(i), w.g, ex); }},
      {"rope_scatter",
       [&](Workload& w, int i, const Executor& ex) {
         return rope_ok ? rope_scatter(w.chunk(i), w.g, w.view_for(i), rt, ex) : Status(Code::kInternal, "rope table");
       }},
  };
  for (const auto& [name, op] : ops) {
    progress("%s: %d chunks of %.1f MiB, 1 and %u threads", name, w.n, w.chunk_bytes() / 1048576.0, o.threads);
    record(report, std::string(name) + ".gbps_1t", cpu_op_gbps(w, o.reps, 1, op));
    record(report, std::string(name) + ".gbps_pt", cpu_op_gbps(w, o.reps, o.threads, op));
    record(report, std::string("ratios.") + name + "_vs_memcpy_paired", paired_ratio_vs_memcpy(w, o.reps, op));
  }
}

// Scatter into every engine layout kdn knows (1 thread): what generality costs.
void bench_layouts(Report& report, const ModelShape& m, const Options& o) {
  Workload w;
  if (!build_workload(m, o, &w).ok()) return;
  for (EngineLayoutKind kind : kAllEngineLayouts) {
    const std::string key = std::string("scatter_layouts.") + engine_layout_name(kind) + ".gbps_1t";
    const Status st = build_pool(w, kind, o.seed + 2);
    if (!st.ok()) {
      record(report, key, Result<double>(st));
      continue;
    }
    progress("scatter into %s", engine_layout_name(kind));
    record(report, key, cpu_op_gbps(w, std::max(1, o.reps / 2), 1, [](Workload& w, int i, const Executor& ex) {
             return scatter(w.chunk(i), w.g, w.view_for(i), ex);
           }));
  }
}

void add_memcpy_baseline(Report& report, const char* key, unsigned threads, uint64_t total, int reps) {
  progress("memcpy baseline: %u thread(s), %.0f MiB", threads, total / 1048576.0);
  Result<MemcpyResult> r = memcpy_gbps(threads, total / threads, reps);
  record(report, key, r.ok() ? Result<double>(r->median_gbps) : Result<double>(r.status()));
}

#if KDN_KERNELS_BENCH_CODEC
struct ModeRun {
  const char* name;
  CodecConfig cfg;
};

// Every mode's config for chunks that start at `pos_base` (a chunk at position 0 carries its
// sequence's sink rows exactly in the quantized modes).
std::vector<ModeRun> codec_modes(int64_t pos_base) {
  CodecConfig raw, lossless, int8, kivi4, kivi4_packed, kivi4_rotated, kivi2;
  for (CodecConfig* c : {&raw, &lossless, &int8, &kivi4, &kivi4_packed, &kivi4_rotated, &kivi2}) c->pos_base = pos_base;
  raw.mode = CodecMode::kRaw;
  lossless.mode = CodecMode::kLossless;
  int8.mode = CodecMode::kInt8;
  kivi4.mode = CodecMode::kKivi4;
  kivi4_packed.mode = CodecMode::kKivi4;
  kivi4_packed.entropy = false;
  kivi4_rotated.mode = CodecMode::kKivi4;
  kivi4_rotated.rotate = true;
  kivi2.mode = CodecMode::kKivi2;
  return {{"raw", raw},     {"lossless", lossless},         {"int8", int8},
          {"kivi4", kivi4}, {"kivi4_packed", kivi4_packed}, {"kivi4_rotated", kivi4_rotated},
          {"kivi2", kivi2}};
}

// One chunk encoded with one mode: blob, decoded copy, quality.
struct Encoded {
  std::vector<uint8_t> blob;
  std::vector<uint8_t> decoded;
  CodecQuality quality;
};

const kdn_key kBenchFingerprint{0x6b646e2d62656e63ull, 0x6b65726e656c7321ull};

Status encode_chunk(const ChunkGeometry& g, const void* chunk, const CodecConfig& cfg, Encoded* out) {
  out->blob.assign(kvc1_max_encoded_size(g, cfg), 0);
  std::vector<uint8_t> scratch(kvc1_encode_scratch_bytes(g, cfg));
  size_t written = 0;
  KDN_RETURN_IF_ERROR(kvc1_encode(g, kBenchFingerprint, chunk, cfg, out->blob.data(), out->blob.size(), &written,
                                  scratch.data(), scratch.size()));
  out->blob.resize(written);
  out->decoded.assign(kernels::chunk_bytes(g), 0);
  KDN_RETURN_IF_ERROR(
      kvc1_decode(out->blob.data(), written, g, kBenchFingerprint, out->decoded.data(), out->decoded.size()));
  out->quality = kvc1_quality(g, chunk, out->decoded.data(), written);
  return OkStatus();
}

void set_quality(Report& report, const std::string& prefix, const CodecQuality& q) {
  report.set(prefix + ".ratio_vs_fp16", q.ratio_vs_fp16);
  report.set(prefix + ".rel_frobenius_error", q.rel_frobenius_error);
  report.set(prefix + ".cosine_min", q.cosine_min);
}

// Encode and decode GB/s (fp16 bytes in / out) of `mode` over `chunks` on `threads` threads,
// and the encode/decode ratio of the same repetitions (the bars read it).
// `tag` is 1t or pt.
void record_speed(Report& report, const std::string& prefix, const std::string& tag,
                  const std::vector<SpeedChunk>& chunks, const CodecConfig& cfg, unsigned threads, int reps) {
  Result<CodecSpeed> r = measure_codec_speed(chunks, cfg, threads, reps);
  if (!r.ok()) {
    record(report, prefix + ".encode.gbps_" + tag, Result<double>(r.status()));
    return;
  }
  report.set(prefix + ".encode.gbps_" + tag, r->encode_gbps);
  report.set(prefix + ".decode.gbps_" + tag, r->decode_gbps);
  report.set(prefix + ".encode_vs_decode_" + tag, r->encode_vs_decode);
}

// One chunk on 1 thread, and P chunks on P threads (one each, as a sidecar encodes and
// decodes independent chunks).
void codec_throughput(Report& report, const std::string& prefix, Workload& w, const ModeRun& mode, const Options& o) {
  const int reps = std::max(o.reps, 5);  // pairs are cheap now; more of them steady the ratio
  for (unsigned threads : {1u, o.threads}) {
    std::vector<SpeedChunk> chunks;
    for (int i = 0; i < static_cast<int>(std::min<unsigned>(threads, static_cast<unsigned>(w.n))); ++i)
      chunks.push_back({w.g, w.chunk(i), mode.cfg.pos_base});
    record_speed(report, prefix, threads == 1 ? "1t" : "pt", chunks, mode.cfg, threads, reps);
  }
  const auto memcpy_1t = report.number("baselines.memcpy_gbps_1t");
  report.set(prefix + ".encode_vs_memcpy_1t", ratio(report.number(prefix + ".encode.gbps_1t"), memcpy_1t));
  report.set(prefix + ".decode_vs_memcpy_1t", ratio(report.number(prefix + ".decode.gbps_1t"), memcpy_1t));
}

// The encoder bars: encode at least this fraction of the same mode's decode rate, one thread.
struct EncodeBar {
  const char* mode;
  double at_least;
};
constexpr EncodeBar kEncodeBars[] = {{"kivi4", 0.75}, {"int8", 0.5}, {"lossless", 0.5}};

void set_encode_bars(Report& report, const std::string& prefix, const std::string& bar_prefix) {
  for (const EncodeBar& b : kEncodeBars)
    report.set_bar(bar_prefix + b.mode + "_encode_vs_decode_1t",
                   report.number(prefix + b.mode + ".encode_vs_decode_1t"), BarOp::kAtLeast, b.at_least);
}

void bench_codec(Report& report, Workload& w, const Options& o) {
  // Synthetic chunks stand for chunks inside a long context, one chunk past its start.
  for (const ModeRun& mode : codec_modes(static_cast<int64_t>(w.g.tokens))) {
    progress("codec %s: encode, decode, quality", mode.name);
    const std::string prefix = std::string("codec.modes.") + mode.name;
    Encoded e;
    const Status st = encode_chunk(w.g, w.chunk(0), mode.cfg, &e);
    if (!st.ok()) {
      record(report, prefix + ".ratio_vs_fp16", Result<double>(st));
      continue;
    }
    set_quality(report, prefix, e.quality);
    codec_throughput(report, prefix, w, mode, o);
    if (std::string(mode.name) == "kivi4") {  // the default mode is the headline
      for (const char* k : {"encode.gbps_1t", "encode.gbps_pt", "decode.gbps_1t", "decode.gbps_pt"}) {
        const auto v = report.number(prefix + "." + k);
        report.set(std::string("codec.") + k, v);
      }
    }
  }
  set_encode_bars(report, "codec.modes.", "bars.codec_");
}

// Real KV from --kv-dir: quality and ratio per mode, aggregated over every chunk file.
void bench_real_kv(Report& report, const Options& o) {
  size_t skipped = 0;
  Result<std::vector<KvFileInfo>> files = list_kv_dir(o.kv_dir, &skipped);
  if (!files.ok() || files->empty()) {
    report.set("errors.real", files.ok() ? "no valid *.kv/*.json pairs" : describe(files.status()));
    return;
  }
  report.set("real.files", files->size());
  report.set("real.skipped_files", skipped);
  std::vector<std::vector<uint8_t>> loaded;
  std::vector<SpeedChunk> chunks;
  for (const KvFileInfo& f : *files) {
    loaded.emplace_back(chunk_bytes(f.geo));
    if (const Status st = read_kv_file(f, loaded.back().data(), loaded.back().size()); !st.ok()) {
      report.set("errors.real", describe(st));
      return;
    }
  }
  for (size_t i = 0; i < files->size(); ++i)
    chunks.push_back({(*files)[i].geo, loaded[i].data(), (*files)[i].first_position});
  for (const ModeRun& run : codec_modes(0)) {
    progress("real KV, codec %s: %zu files", run.name, files->size());
    ModeRun mode = run;
    double fp16 = 0, encoded = 0, worst_err = 0, cos_min = 1;
    Status st;
    for (size_t i = 0; i < files->size(); ++i) {
      const KvFileInfo& f = (*files)[i];
      Encoded e;
      mode.cfg.pos_base = f.first_position;
      st = encode_chunk(f.geo, loaded[i].data(), mode.cfg, &e);
      if (!st.ok()) break;
      fp16 += chunk_elements(f.geo) * 2.0;
      encoded += static_cast<double>(e.blob.size());
      worst_err = std::max(worst_err, e.quality.rel_frobenius_error);
      cos_min = std::min(cos_min, e.quality.cosine_min);
    }
    const std::string prefix = std::string("real.codec.modes.") + mode.name;
    if (!st.ok()) {
      record(report, prefix + ".ratio_vs_fp16", Result<double>(st));
      continue;
    }
    set_quality(report, prefix, CodecQuality{fp16 / encoded, worst_err, cos_min});
    progress("real KV, codec %s: encode and decode speed, 1 thread", run.name);
    record_speed(report, prefix, "1t", chunks, run.cfg, 1, std::max(o.reps, 5));
  }
  set_encode_bars(report, "real.codec.modes.", "bars.real_codec_");
  report.set_bar("bars.real_kivi4_packed_ratio", report.number("real.codec.modes.kivi4_packed.ratio_vs_fp16"),
                 BarOp::kAtLeast, 3.5);
  report.set_bar("bars.real_kivi4_ratio", report.number("real.codec.modes.kivi4.ratio_vs_fp16"), BarOp::kAtLeast, 4.5);
  report.set_bar("bars.real_lossless_ratio", report.number("real.codec.modes.lossless.ratio_vs_fp16"), BarOp::kAtLeast,
                 1.25);
}
#endif  // KDN_KERNELS_BENCH_CODEC

// ---- GPU (--gpu): the same ops on device memory against device-to-device copy ------------------

// Frees device memory on scope exit.
struct DeviceMemory {
  std::vector<void*> blocks;
  ~DeviceMemory() {
    for (void* p : blocks) device_free(p);
  }
  Result<void*> alloc(size_t bytes, const void* init = nullptr) {
    void* p = nullptr;
    KDN_RETURN_IF_ERROR(device_alloc(bytes, &p));
    blocks.push_back(p);
    if (init != nullptr) KDN_RETURN_IF_ERROR(copy_to_device(p, init, bytes));
    return p;
  }
};

// The workload mirrored on the device; views point at device arrays.
struct DeviceWorkload {
  DeviceMemory mem;
  char* chunks = nullptr;
  char* copy_target = nullptr;
  std::vector<EngineView> views;  // one per chunk
};

Status upload(Workload& w, DeviceWorkload* d) {
  const size_t total = w.chunk_bytes() * w.n;
  Result<void*> c = d->mem.alloc(total, w.chunks.data());
  Result<void*> t = d->mem.alloc(total);
  if (!c.ok() || !t.ok()) return c.ok() ? t.status() : c.status();
  d->chunks = static_cast<char*>(*c);
  d->copy_target = static_cast<char*>(*t);
  std::vector<void*> layer_ptrs;
  for (auto& l : w.layers) {
    Result<void*> p = d->mem.alloc(l.size(), l.data());
    if (!p.ok()) return p.status();
    layer_ptrs.push_back(*p);
  }
  Result<void*> bases = d->mem.alloc(layer_ptrs.size() * sizeof(void*), layer_ptrs.data());
  if (!bases.ok()) return bases.status();
  const bool split = layer_ptrs.size() > w.g.layers;
  for (int i = 0; i < w.n; ++i) {
    Result<void*> slots = d->mem.alloc(w.slots[i].size() * sizeof(int64_t), w.slots[i].data());
    if (!slots.ok()) return slots.status();
    EngineView v = w.view;
    v.layer_base[0] = static_cast<void* const*>(*bases);
    v.layer_base[1] = split ? v.layer_base[0] + w.g.layers : v.layer_base[0];
    v.slot_mapping = static_cast<const int64_t*>(*slots);
    d->views.push_back(v);
  }
  return OkStatus();
}

// Median GB/s over `reps` event-timed runs of `enqueue` (after one warm-up run).
Result<double> gpu_gbps(void* stream, uint64_t bytes, int reps, const std::function<Status()>& enqueue) {
  auto trampoline = +[](void* ctx) { return (*static_cast<const std::function<Status()>*>(ctx))(); };
  KDN_RETURN_IF_ERROR(enqueue());
  KDN_RETURN_IF_ERROR(stream_sync(stream));
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) {
    float ms = 0;
    KDN_RETURN_IF_ERROR(time_on_stream(stream, trampoline, const_cast<std::function<Status()>*>(&enqueue), &ms));
    gbps.push_back(static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  return kdn::median(std::move(gbps));
}

#if KDN_KERNELS_BENCH_CODEC
// Batch decode of `n` kivi4 blobs on the device, fp16 output bytes per second, into chunk-sized
// outputs of its own. With `validated`, the blobs are validated once before the timed runs, as a
// tier validates them on arrival (kvc1_decode_cuda_validated); otherwise every launch validates
// them on the host first (kvc1_decode_cuda), inside the timed span.
Result<double> gpu_codec_decode(Workload& w, DeviceWorkload& d, void* stream, int reps, int n, bool validated) {
  Encoded e;
  KDN_RETURN_IF_ERROR(encode_chunk(w.g, w.chunk(0), CodecConfig{}, &e));
  Result<void*> dblob = d.mem.alloc(e.blob.size(), e.blob.data());
  Result<void*> scratch = d.mem.alloc(kvc1_cuda_scratch_bytes(n));
  Result<void*> out = d.mem.alloc(w.chunk_bytes() * n);
  if (!dblob.ok()) return dblob.status();
  if (!scratch.ok()) return scratch.status();
  if (!out.ok()) return out.status();
  std::vector<const uint8_t*> host_blobs(n, e.blob.data()), dev_blobs(n, static_cast<const uint8_t*>(*dblob));
  std::vector<size_t> sizes(n, e.blob.size());
  std::vector<void*> outs(n);
  for (int i = 0; i < n; ++i) outs[i] = static_cast<char*>(*out) + i * w.chunk_bytes();
  const Kvc1CudaBatch batch{static_cast<uint32_t>(n), host_blobs.data(), sizes.data(), dev_blobs.data(), outs.data()};
  DecodeOptions opts;
  opts.cpu_threads = 0;
  if (validated) KDN_RETURN_IF_ERROR(kvc1_validate_batch(batch, w.g, kBenchFingerprint, opts));
  Result<double> r = gpu_gbps(stream, chunk_elements(w.g) * 2 * n, reps, [&] {
    return validated
               ? kvc1_decode_cuda_validated(batch, w.g, kBenchFingerprint, *scratch, kvc1_cuda_scratch_bytes(n), stream,
                                            opts)
               : kvc1_decode_cuda(batch, w.g, kBenchFingerprint, *scratch, kvc1_cuda_scratch_bytes(n), stream, opts);
  });
  KDN_RETURN_IF_ERROR(kvc1_cuda_result(*scratch, stream));
  return r;
}

// Batch encode of the workload's chunks (already on the device) in `mode`, fp16 input bytes per
// second; the first blob is checked against the CPU encoder's (they must be equal byte for byte).
Result<double> gpu_codec_encode(Workload& w, DeviceWorkload& d, void* stream, int reps, CodecMode mode, bool* equal) {
  CodecConfig cfg;
  cfg.mode = mode;
  const size_t cap = kvc1_max_encoded_size(w.g, cfg), sb = kvc1_cuda_encode_scratch_bytes(w.g, cfg, w.n);
  Result<void*> scratch = d.mem.alloc(sb);
  Result<void*> out = d.mem.alloc(cap * w.n);
  if (!scratch.ok()) return scratch.status();
  if (!out.ok()) return out.status();
  std::vector<const void*> chunks(w.n);
  std::vector<uint8_t*> outs(w.n);
  for (int i = 0; i < w.n; ++i) {
    chunks[i] = d.chunks + i * w.chunk_bytes();
    outs[i] = static_cast<uint8_t*>(*out) + i * ((cap + 15) / 16 * 16);
  }
  const Kvc1CudaEncodeBatch batch{static_cast<uint32_t>(w.n), chunks.data(), outs.data()};
  Result<double> r = gpu_gbps(stream, chunk_elements(w.g) * 2 * w.n, reps, [&] {
    return kvc1_encode_cuda(batch, w.g, kBenchFingerprint, cfg, *scratch, sb, stream);
  });
  std::vector<uint64_t> sizes(w.n);
  KDN_RETURN_IF_ERROR(kvc1_cuda_encode_result(*scratch, w.n, stream, sizes.data()));
  Encoded e;
  KDN_RETURN_IF_ERROR(encode_chunk(w.g, w.chunk(0), cfg, &e));
  std::vector<uint8_t> dev(sizes[0]);
  KDN_RETURN_IF_ERROR(copy_to_host(dev.data(), outs[0], dev.size()));
  *equal = dev == e.blob;
  return r;
}
#endif

void bench_gpu(Report& report, Workload& w, const ModelShape& m, const Options& o) {
  const int devices = cuda_device_count();
  report.set("gpu.available", devices > 0);
  if (devices == 0) {
    report.set("gpu.skipped", cuda_built() ? "no CUDA device" : "built without CUDA");
    progress("gpu: skipped (%s)", cuda_built() ? "no CUDA device" : "built without CUDA");
    return;
  }
  DeviceWorkload d;
  void* stream = nullptr;
  Status st = upload(w, &d);
  if (st.ok()) st = stream_create(&stream);
  if (!st.ok()) {
    record(report, "gpu.scatter.gbps", Result<double>(st));
    return;
  }
  const uint64_t total = w.chunk_bytes() * w.n;
  const Executor ex = Executor::cuda(stream);
  std::vector<float> inv(m.head_dim / 2), table(m.head_dim);
  const int64_t delta = 1000;
  Result<void*> dtable(Status(Code::kInternal, "rope table"));
  if (compute_inv_freq(m.rope, inv.data(), inv.size()).ok() &&
      build_rope_table(inv.data(), m.head_dim, &delta, 1, table.data(), table.size()).ok()) {
    dtable = d.mem.alloc(table.size() * sizeof(float), table.data());
  }
  const RopeTable rt{m.rope.style, m.head_dim, dtable.ok() ? static_cast<const float*>(*dtable) : nullptr, 0};
  auto per_chunk = [&](const std::function<Status(int)>& op) {
    return [&, op]() -> Status {
      for (int i = 0; i < w.n; ++i) KDN_RETURN_IF_ERROR(op(i));
      return OkStatus();
    };
  };
  progress("gpu: d2d copy, scatter, gather, rope_scatter over %.0f MiB", total / 1048576.0);
  record(report, "gpu.baselines.d2d_copy_gbps", gpu_gbps(stream, total, o.reps, [&] {
           return copy_device_to_device(d.copy_target, d.chunks, total, stream);
         }));
  char* base = d.chunks;
  const uint64_t cb = w.chunk_bytes();
  record(
      report, "gpu.scatter.gbps",
      gpu_gbps(stream, total, o.reps, per_chunk([&](int i) { return scatter(base + i * cb, w.g, d.views[i], ex); })));
  record(report, "gpu.gather.gbps",
         gpu_gbps(stream, total, o.reps, per_chunk([&](int i) { return gather(d.views[i], base + i * cb, w.g, ex); })));
  record(report, "gpu.rope_scatter.gbps", gpu_gbps(stream, total, o.reps, per_chunk([&](int i) {
                                                     return rope_scatter(base + i * cb, w.g, d.views[i], rt, ex);
                                                   })));
#if KDN_KERNELS_BENCH_CODEC
  // A batch as large as one 8K-token retrieve of the model (at least the workload's chunks).
  const int decode_n = std::max(w.n, static_cast<int>((8192 + w.g.tokens - 1) / w.g.tokens));
  report.set("gpu.codec.batch_chunks", decode_n);
  progress("gpu: codec kivi4 batch decode of %d chunks (validated on arrival, and validated per launch)", decode_n);
  record(report, "gpu.codec.decode.gbps", gpu_codec_decode(w, d, stream, o.reps, decode_n, true));
  record(report, "gpu.codec.decode_validating.gbps", gpu_codec_decode(w, d, stream, o.reps, decode_n, false));
  for (CodecMode mode : {CodecMode::kKivi4, CodecMode::kInt8}) {
    const std::string key = std::string("gpu.codec.encode.") + codec_mode_name(mode);
    progress("gpu: codec %s batch encode of %d chunks", codec_mode_name(mode), w.n);
    bool equal = false;
    record(report, key + ".gbps", gpu_codec_encode(w, d, stream, o.reps, mode, &equal));
    report.set(key + ".equals_cpu", equal);
  }
#endif
  stream_destroy(stream);
  report.set("gpu.ratios.scatter_vs_d2d",
             ratio(report.number("gpu.scatter.gbps"), report.number("gpu.baselines.d2d_copy_gbps")));
  report.set("gpu.ratios.rope_vs_d2d",
             ratio(report.number("gpu.rope_scatter.gbps"), report.number("gpu.baselines.d2d_copy_gbps")));
  report.set_bar("bars.gpu_scatter_vs_d2d", report.number("gpu.ratios.scatter_vs_d2d"), BarOp::kAtLeast, 0.7);
  report.set_bar("bars.gpu_codec_decode_gbps", report.number("gpu.codec.decode.gbps"), BarOp::kAtLeast, 100.0);
  report.set_bar("bars.gpu_codec_encode_kivi4_gbps", report.number("gpu.codec.encode.kivi4.gbps"), BarOp::kAtLeast,
                 100.0);
  report.set_bar("bars.gpu_codec_encode_int8_gbps", report.number("gpu.codec.encode.int8.gbps"), BarOp::kAtLeast,
                 100.0);
}

// The blend kernels on one check layer's K of a 32K-token context (a long RAG prompt): per
// token a row of kv_heads * head_dim f16 channels, fresh and cached. kv_deviation reads both
// (GB/s of the two inputs, and million tokens a second); select_top_k ranks every token and
// keeps 15% (LMCache's default ratio); merge_rows writes those rows into a context's rows.
void bench_blend(Report& report, const ModelShape& m, const Options& o) {
  constexpr uint32_t kTokens = 32768;
  const uint32_t width = m.kv_heads * m.head_dim;
  const uint64_t row_bytes = uint64_t{width} * 2;
  std::vector<uint8_t> fresh(kTokens * row_bytes), cached(kTokens * row_bytes), dst(kTokens * row_bytes);
  CounterRng rng(o.seed + 77);
  for (uint64_t i = 0; i < uint64_t{kTokens} * width; ++i) {
    store_f32(fresh.data(), int64_t(i), DType::kF16, float(rng.next_normal()), 1.0f);
    store_f32(cached.data(), int64_t(i), DType::kF16, float(rng.next_normal()), 1.0f);
  }
  const TokenRows f{fresh.data(), DType::kF16, width, width}, c{cached.data(), DType::kF16, width, width};
  std::vector<float> dev(kTokens);
  report.set("blend.tokens", kTokens);
  report.set("blend.row_channels", width);
  for (unsigned threads : {1u, o.threads}) {
    const Executor ex = Executor::cpu(int(threads));
    const std::string suffix = threads == 1 ? "_1t" : "_pt";
    auto gbps = median_gbps(2 * kTokens * row_bytes, o.reps,
                            [&] { return kv_deviation(f, c, kTokens, nullptr, dev.data(), ex); });
    record(report, "blend.kv_deviation.gbps" + suffix, gbps);
    if (gbps.ok())
      report.set("blend.kv_deviation.mtokens_per_s" + suffix, gbps.value() * 1e9 / double(2 * row_bytes) / 1e6);
  }
  // select_top_k and merge_rows run on the calling thread (the CPU path is one nth_element and
  // one row copy per selected token).
  const Executor cpu = Executor::cpu(1);
  const uint32_t k = recompute_count(kTokens, 0.15);
  auto scratch_bytes = top_k_scratch_bytes(kTokens, cpu);
  std::vector<uint8_t> scratch(scratch_bytes.ok() ? scratch_bytes.value() : 0);
  std::vector<int32_t> selected(k);
  uint32_t n_selected = 0;
  auto sel = median_gbps(uint64_t{kTokens} * sizeof(float), o.reps, [&] {
    return select_top_k(dev.data(), nullptr, kTokens, k, selected.data(), &n_selected, scratch.data(), scratch.size(),
                        cpu);
  });
  if (sel.ok()) {
    report.set("blend.select_top_k.mtokens_per_s", sel.value() * 1e9 / sizeof(float) / 1e6);
    report.set("blend.select_top_k.ms", double(kTokens) * sizeof(float) / (sel.value() * 1e9) * 1e3);
  } else {
    record(report, "blend.select_top_k.mtokens_per_s", sel);
  }
  report.set("blend.select_top_k.k", k);
  const MutableTokenRows d{dst.data(), DType::kF16, width, width};
  auto merge = median_gbps(uint64_t{n_selected} * row_bytes, o.reps,
                           [&] { return merge_rows(f, selected.data(), n_selected, d, kTokens, cpu); });
  record(report, "blend.merge_rows.gbps_1t", merge);
}

void add_ratios_and_bars(Report& report) {
  const auto memcpy_1t = report.number("baselines.memcpy_gbps_1t");
  const auto memcpy_pt = report.number("baselines.memcpy_gbps_pt");
  report.set("ratios.scatter_vs_memcpy", ratio(report.number("scatter.gbps_1t"), memcpy_1t));
  report.set("ratios.rope_vs_memcpy", ratio(report.number("rope_scatter.gbps_1t"), memcpy_1t));
  report.set("ratios.gather_vs_memcpy", ratio(report.number("gather.gbps_1t"), memcpy_1t));
  report.set("ratios.scatter_pt_vs_memcpy_pt", ratio(report.number("scatter.gbps_pt"), memcpy_pt));
  // The bars read the paired ratios: the ratio of two medians taken seconds apart moves with
  // whatever else the machine was doing in between (docs/benchmarks.md has runs of both).
  report.set_bar("bars.scatter_vs_memcpy", report.number("ratios.scatter_vs_memcpy_paired"), BarOp::kAtLeast, 0.7);
  report.set_bar("bars.rope_vs_memcpy", report.number("ratios.rope_scatter_vs_memcpy_paired"), BarOp::kAtLeast, 0.5);
  if (report.number("codec.decode.gbps_1t")) {
    report.set_bar("bars.codec_decode_gbps_1t", report.number("codec.decode.gbps_1t"), BarOp::kAtLeast, 1.5);
  }
}

int parse_options(int argc, char** argv, Options* o) {
  CLI::App app{
      "kdn-bench kernels: layout, RoPE, codec and blend (deviation, top-k, merge) kernels against same-run memcpy"};
  app.add_flag("--json", o->json, "print JSON");
  app.add_option("--model", o->model, "llama3-8b | smollm2-135m")->check(CLI::IsMember({"llama3-8b", "smollm2-135m"}));
  app.add_option("--chunks", o->chunks, "chunks in the working set (0: 256 MiB worth)")->check(CLI::Range(0, 4096));
  app.add_option("--reps", o->reps, "timed repetitions per figure (median reported)")->check(CLI::Range(1, 100));
  app.add_option("--threads", o->threads, "threads for the *_pt figures")->check(CLI::Range(1u, 1024u));
  app.add_option("--kv-dir", o->kv_dir, "directory of real canonical KV chunks (*.kv + *.json)");
  app.add_flag("--gpu", o->gpu, "also run the kernels on a CUDA device (skipped when none)");
  app.add_option("--seed", o->seed, "synthetic data seed");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? -1 : 2;  // -1: --help was printed
  }
  return 0;
}

}  // namespace
}  // namespace kdn::bench

int run_kernels_bench(int argc, char** argv) {
  using namespace kdn::bench;
  Options o;
  if (const int rc = parse_options(argc, argv, &o); rc != 0) return rc < 0 ? 0 : rc;
  ModelShape m;
  model_shape(o.model, &m);
  Report report;
  Workload w;
  if (const kdn::Status st = build_workload(m, o, &w); !st.ok()) {
    std::cerr << "kdn-bench kernels: " << describe(st) << "\n";
    return 1;
  }
  report.set("config.model", o.model);
  report.set("config.chunk_bytes", w.chunk_bytes());
  report.set("config.chunks", w.n);
  report.set("config.threads", o.threads);
  report.set("config.engine_layout", "vllm_flash_nhd, block 16, fp16");
  report.set("config.cpu_f16c", cpu_has_f16c());
  const uint64_t total = w.chunk_bytes() * w.n;
  add_memcpy_baseline(report, "baselines.memcpy_gbps_1t", 1, total, o.reps);
  add_memcpy_baseline(report, "baselines.memcpy_gbps_pt", o.threads, total, o.reps);
  bench_copy_ops(report, w, m, o);
  bench_layouts(report, m, o);
  bench_blend(report, m, o);
#if KDN_KERNELS_BENCH_CODEC
  bench_codec(report, w, o);
  if (!o.kv_dir.empty()) bench_real_kv(report, o);
#else
  report.set("codec.skipped", "built without kdn/kernels/codec.h");
#endif
  if (o.gpu) bench_gpu(report, w, m, o);
  add_ratios_and_bars(report);
  std::cout << (o.json ? report.to_json() : report.to_table()) << std::endl;
  const bool measured = report.number("baselines.memcpy_gbps_1t") && report.number("scatter.gbps_1t");
  return measured ? 0 : 1;
}
