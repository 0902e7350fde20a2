#pragma once
// GRAVAC_TEST_SANITIZED: 1 in a sanitizer build (whose runtime owns the allocator, so a test
// must not replace operator new there), 0 otherwise.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GRAVAC_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define GRAVAC_TEST_SANITIZED 1
#endif
#endif
#ifndef GRAVAC_TEST_SANITIZED
#define GRAVAC_TEST_SANITIZED 0
#endif
