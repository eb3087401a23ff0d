// The CPU launcher: runs a range body over an index space on the calling thread or oneTBB workers.
#pragma once

#include <kdn/kernels/executor.h>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <cstdint>

namespace kdn::kernels::detail {

// Calls fn(begin, end) over pieces of [0, n) of about `grain` indices. With one thread (or a
// range smaller than a grain) it runs inline: no task overhead for small ops.
template <class Fn>
void cpu_for(const Executor& ex, uint64_t n, uint64_t grain, const Fn& fn) {
  if (n == 0) return;
  if (grain == 0) grain = 1;
  if (ex.cpu_threads == 1 || n <= grain) {
    fn(uint64_t{0}, n);
    return;
  }
  auto run = [&] {
    oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<uint64_t>(0, n, grain),
                              [&](const oneapi::tbb::blocked_range<uint64_t>& r) { fn(r.begin(), r.end()); });
  };
  if (ex.cpu_threads <= 0) {
    run();
    return;
  }
  oneapi::tbb::task_arena arena(ex.cpu_threads);
  arena.execute(run);
}

}  // namespace kdn::kernels::detail
