// streampool-bench: replay allocation traces, tune the pool's configuration, compare it with every
// peer, stress it with real multi-stream work. The command line is cli.hpp's; `--help` on each
// subcommand lists its options (docs/bench.md describes them all).
#include "cli.hpp"

#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  return streampool::bench::bench_main(std::vector<std::string>(argv + 1, argv + argc), std::cout,
                                       std::cerr);
}
