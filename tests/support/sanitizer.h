// Which sanitizer this test binary is built with, for the few tests whose
// subject the sanitizer's own runtime gets in the way of (each says why
// where it looks): SHMCACHE_TEST_UNDER_TSAN, SHMCACHE_TEST_UNDER_ASAN,
// defined to 1 or not at all. GCC says it with __SANITIZE_*__, clang with
// __has_feature.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define SHMCACHE_TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SHMCACHE_TEST_UNDER_TSAN 1
#endif
#endif

#if defined(__SANITIZE_ADDRESS__)
#define SHMCACHE_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHMCACHE_TEST_UNDER_ASAN 1
#endif
#endif
