// never_destroyed<T>(): one T for the process, made at the first call and never destroyed (it may
// be used by threads that exit after static destruction), in static storage rather than on the
// heap, so that the first call, which may come from a function that must not throw, cannot fail.
#pragma once

#include <new>

namespace streampool::detail {

template <class T>
T& never_destroyed() noexcept {
  alignas(T) static unsigned char storage[sizeof(T)];
  static T* const instance = new (storage) T;
  return *instance;
}

}  // namespace streampool::detail
