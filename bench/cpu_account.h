// Where a timed pass's CPU went: this process (its loop and worker threads), a set of other
// processes (the Redis servers it talks to), and the whole machine (/proc/stat). A rate on a
// small machine is often bounded by cores rather than by the device or link under test; the
// difference of two samples says by how much (core-seconds per byte moved, and the rate the
// same work would reach with every core to itself).
#pragma once

#include "process.h"

#include <kdn/common/clock.h>

#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <span>
#include <string>

namespace kdn::bench {

struct CpuSample {
  double self_s = 0;    // user + system of this process, every thread
  double others_s = 0;  // user + system of the listed processes
  double busy_s = 0;    // every core's non-idle time (all processes, interrupts included)
  double wall_s = 0;    // the monotonic clock: a difference of samples is the pass's wall time
};

// Non-idle time of every core: the "cpu" line less idle and iowait.
inline double machine_busy_s() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  unsigned long long v[10] = {};
  if (!(f >> cpu) || cpu != "cpu") return 0;
  for (auto& x : v) f >> x;
  unsigned long long busy = 0;
  for (int i = 0; i < 8; ++i)
    if (i != 3 && i != 4) busy += v[i];  // user nice system [idle iowait] irq softirq steal
  return double(busy) / double(::sysconf(_SC_CLK_TCK));
}

inline CpuSample cpu_sample(std::span<const pid_t> others) {
  CpuSample s;
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  s.self_s = double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  for (pid_t p : others) {
    Result<double> c = process_cpu_seconds(p);
    if (c.ok()) s.others_s += *c;  // a server that is gone adds nothing
  }
  s.busy_s = machine_busy_s();
  s.wall_s = double(now_ns()) * 1e-9;
  return s;
}

inline CpuSample operator-(const CpuSample& a, const CpuSample& b) {
  return CpuSample{a.self_s - b.self_s, a.others_s - b.others_s, a.busy_s - b.busy_s, a.wall_s - b.wall_s};
}
inline CpuSample& operator+=(CpuSample& a, const CpuSample& b) {
  a.self_s += b.self_s, a.others_s += b.others_s, a.busy_s += b.busy_s, a.wall_s += b.wall_s;
  return a;
}

}  // namespace kdn::bench
