// Compiled by clang++ (a CTest test) and by nvcc (the GPU tests include it as a .cu): the public
// headers must build under every compiler a user may include them from.
#include <streampool/streampool.hpp>

#ifndef STREAMPOOL_HEADERS_COMPILE_NO_MAIN
int main() { return 0; }
#endif
