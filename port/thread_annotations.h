// Clang's thread-safety annotations (-Wthread-safety): which mutex guards a
// member, which functions need it held or must not hold it. They are checked
// by the clang build in scripts/test.sh; on compilers without the attributes
// (GCC) they expand to nothing.
//
// Model: leveldb's port/thread_annotations.h, with the capability names of
// clang's documentation (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html).
#pragma once

#if defined(__clang__)
#define SHMCACHE_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define SHMCACHE_THREAD_ANNOTATION(x)
#endif

// A class that is a lock (a capability); `x` names its kind in messages.
#define CAPABILITY(x) SHMCACHE_THREAD_ANNOTATION(capability(x))
// An RAII class that holds a capability for its lifetime.
#define SCOPED_CAPABILITY SHMCACHE_THREAD_ANNOTATION(scoped_lockable)

// The member is read and written only with the mutex held.
#define GUARDED_BY(x) SHMCACHE_THREAD_ANNOTATION(guarded_by(x))
// What the pointer member points to is accessed only with the mutex held.
#define PT_GUARDED_BY(x) SHMCACHE_THREAD_ANNOTATION(pt_guarded_by(x))

// Mutexes of the same object taken in this order.
#define ACQUIRED_BEFORE(...) SHMCACHE_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) SHMCACHE_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))

// The caller must hold (REQUIRES) or must not hold (EXCLUDES) the mutexes.
#define REQUIRES(...) SHMCACHE_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) SHMCACHE_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

// The function takes / gives back the mutexes (none named: `this`).
#define ACQUIRE(...) SHMCACHE_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) SHMCACHE_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) SHMCACHE_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// The function checks (or, where it cannot, promises) that the calling
// thread holds the mutex; the analysis takes it as held from there on.
#define ASSERT_CAPABILITY(x) SHMCACHE_THREAD_ANNOTATION(assert_capability(x))

// The function returns a reference to the mutex.
#define RETURN_CAPABILITY(x) SHMCACHE_THREAD_ANNOTATION(lock_returned(x))

// Turns the analysis off for one function. Each use says why in place.
#define NO_THREAD_SAFETY_ANALYSIS SHMCACHE_THREAD_ANNOTATION(no_thread_safety_analysis)
