// Entry points: gather (engine -> chunk), scatter (chunk -> engine), rope_scatter (K rotated by a
// position delta on the way), rope_chunk (the same rotation in place on a canonical chunk).
//
// Every op takes raw pointers, POD views and an Executor; none allocates. Arguments are validated
// before any byte moves: a bad geometry or view returns kInvalidArgument. On the CPU, slots are
// checked too (a slot >= view.slot_limit fails the whole op before anything is written); slots < 0
// are skipped. On CUDA the slot mapping lives in device memory and is not read by the host: an
// out-of-bounds slot is skipped like -1, never written.
//
// `layers` restricts an op to layers [begin, end) of the chunk (end 0: all), so loads can be
// pipelined layer by layer. Chunk and view must agree on layers, kv_heads and head_dim.
//
// Thread safety: ops on disjoint destinations may run concurrently; the CPU launcher uses the
// calling thread plus oneTBB workers (Executor::cpu_threads bounds how many).
#pragma once

#include <kdn/common/status.h>
#include <kdn/kernels/executor.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/rope.h>

#include <cstdint>

namespace kdn::kernels {

struct LayerRange {
  uint32_t begin = 0;
  uint32_t end = 0;  // 0: through the last layer
};

// engine -> canonical chunk. Tokens whose slot is < 0 keep their previous chunk contents.
Status gather(const EngineView& src, void* chunk, const ChunkGeometry& geo, const Executor& ex,
              LayerRange layers = {}) noexcept;

// canonical chunk -> engine. Tokens whose slot is < 0 are not written.
Status scatter(const void* chunk, const ChunkGeometry& geo, const EngineView& dst, const Executor& ex,
               LayerRange layers = {}) noexcept;

// canonical chunk -> engine, rotating K by the table's deltas (V and channels >= rotary_dim are
// copied as by scatter). table.rotary_dim must be even and <= head_dim.
Status rope_scatter(const void* chunk, const ChunkGeometry& geo, const EngineView& dst, const RopeTable& table,
                    const Executor& ex, LayerRange layers = {}) noexcept;

// Rotates the K plane of a canonical chunk in place (V untouched).
Status rope_chunk(void* chunk, const ChunkGeometry& geo, const RopeTable& table, const Executor& ex,
                  LayerRange layers = {}) noexcept;

}  // namespace kdn::kernels
