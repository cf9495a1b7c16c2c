// streampool-bench's command line (CLI11): the subcommands, their options, and the checks every
// value passes before anything runs.
//
//   streampool-bench [replay] [TRACE...] [options]   the main job without arguments
//   streampool-bench tune | compare | workloads | stress [options]
//
// Each subcommand has its own --help and takes only its own options: any other, a second value
// for a single-valued option, or a value out of range (--threads 0, --top -3, --seed -1) is a bad
// command line. A first argument that is no subcommand is the start of a `replay` command line.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace streampool::bench {

// Runs the bench on `args` (argv without argv[0]), reports to `out` and messages to `err`.
// Returns the exit status: 0 when everything ran and nothing failed, 1 when something failed
// (an allocation of a replay, a check of stress, a file that cannot be read or written, a thread
// that cannot be created), 2 for a bad command line.
int bench_main(std::vector<std::string> args, std::ostream& out, std::ostream& err);

// A value of digits only (no sign, no fraction, no 0x), from `least` to `most`. CLI11 alone
// reads "-1" into an unsigned option as its wrapped value.
CLI::Validator whole_number(std::uint64_t least, std::uint64_t most);
// A finite number above zero.
CLI::Validator positive_number();

}  // namespace streampool::bench
