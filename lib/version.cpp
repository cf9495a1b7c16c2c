#include <streampool/version.hpp>

namespace streampool {

// Compiled into the library, so that it reports the library's version, not the caller's headers'.
std::string_view version() noexcept { return STREAMPOOL_VERSION_STRING; }

}  // namespace streampool
