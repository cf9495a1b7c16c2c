// How the fuzzer runs the model check on an input: shared by the fuzzer (pool_fuzz.cpp), the
// corpus maker (make_corpus.cpp) and the corpus replay in the test suite (model_pool.cpp), so
// that an input passes or fails the same way in each.
//
// An input is exactly a model input (pool_model::ByteSource): a failure the fuzzer saves replays
// in the test suite as STREAMPOOL_MODEL_BYTES=<hex> STREAMPOOL_MODEL_STEPS=<fuzz_max_steps>.
#pragma once

#include "../model/pool_model.hpp"

namespace pool_fuzz {

// The full profile, and more steps than the longest input decodes (tools/fuzz.sh passes
// -max_len=4096; an operation draws at least one byte): the input's length bounds a run, and an
// input that ends mid-operation reads zeros to the end of it, then tears down.
inline constexpr int fuzz_max_steps = 5000;

inline pool_model::RunOptions run_options() {
  pool_model::RunOptions options;
  options.profile = pool_model::Profile::full;
  options.max_steps = fuzz_max_steps;
  return options;
}

}  // namespace pool_fuzz
