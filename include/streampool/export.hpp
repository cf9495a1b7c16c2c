// STREAMPOOL_API marks what the library exports. It is built with hidden visibility
// (-fvisibility=hidden), so a shared libstreampool.so exports the public API and nothing of
// lib/'s internals; a static build is unaffected. The fake device's library uses the same mark.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define STREAMPOOL_API __attribute__((visibility("default")))
#else
#define STREAMPOOL_API
#endif
