// A mutex clang's thread-safety analysis understands, and the annotations for the state it
// guards. libstdc++'s std::mutex carries no capability attributes, so GUARDED_BY on fields
// locked through it checks nothing; kdn::Mutex and kdn::MutexLock do.
//
//   kdn::Mutex mu_;
//   std::deque<Job> jobs_ GUARDED_BY(mu_);
//   ...
//   kdn::MutexLock lock(mu_);
//   while (jobs_.empty()) lock.wait(cv_);   // the condition is checked with the lock held
//
// Builds with clang and -DKDN_THREAD_SAFETY=ON (-Wthread-safety) check every access; with other
// compilers the annotations are empty. Thread-safe as std::mutex is.
#pragma once

#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define KDN_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KDN_THREAD_ANNOTATION(x)
#endif

#define KDN_CAPABILITY(x) KDN_THREAD_ANNOTATION(capability(x))
#define KDN_SCOPED_CAPABILITY KDN_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) KDN_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) KDN_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) KDN_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) KDN_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) KDN_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) KDN_THREAD_ANNOTATION(release_capability(__VA_ARGS__))

namespace kdn {

class KDN_CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class KDN_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& m) ACQUIRE(m) : lock_(m.mu_) {}
  ~MutexLock() RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Sleeps until `cv` is notified (or wakes spuriously); the lock is held again on return, so
  // the caller re-checks its condition in a loop.
  void wait(std::condition_variable& cv) { cv.wait(lock_); }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace kdn
