// Line coverage from forked children: a child that ends with _exit (as a test's child must, so as
// not to run the parent's exit handlers twice) would drop its counts, and the coverage report
// (tools/coverage.sh) would miss everything only children run, the model check's runs among
// them. In a STREAMPOOL_COVERAGE build the child writes them first; otherwise this does nothing.
#pragma once

#if defined(STREAMPOOL_COVERAGE)
extern "C" void __gcov_dump(void);
#endif

// Call in a forked child right before _exit.
inline void flush_coverage() noexcept {
#if defined(STREAMPOOL_COVERAGE)
  __gcov_dump();
#endif
}
