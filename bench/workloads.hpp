// Embedded synthetic workloads: traces the bench replays with no file. Deterministic for a seed,
// on every standard library (std::mt19937_64 and draws of our own). Each frees everything it
// allocates (left_live == 0) and replays on the fake device in milliseconds.
#pragma once

#include "trace.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace streampool::bench {

// RMM's random-allocations benchmark shape: `count` allocations of sizes drawn uniformly from
// [1, max_size], interleaved with frees of random live allocations, on one stream. As in RMM, an
// allocation happens 73 times in 100 while the live bytes stay under a cap (1 GiB here), so the
// peak is within max_size of 1 GiB. Throws std::invalid_argument when max_size is 0.
Trace random_workload(std::uint64_t seed, std::size_t count = 20000,
                      std::size_t max_size = std::size_t{4} << 20);
// Transformer training: persistent weights and optimizer state, then steps that allocate
// activations layer by layer (sizes scaled by a sequence length that changes between steps, as
// in GPT-2 fine-tuning with bucketed lengths), free them in reverse during the backward pass while
// gradients come and go, on one stream. GPT-2 small's layers, vocabulary and context at width 384
// and batch 2 under bf16 autocast, AdamW: about 6,800 allocations and a peak of 1.6 GB at the
// default 6 steps; lengths 512, 384, 512, 256 in an order shuffled per four steps.
Trace transformer_workload(std::uint64_t seed, int steps = 6);
// A multi-stream pipeline: a producer stream allocates batches that a consumer stream uses and
// frees (PooledBuffer::record_stream in the replay), with scratch allocations on both. Streams:
// 0 is the consumer (ResNet-18 inference, fp16, batch 64), 1 the producer, one to three batches
// ahead; every input's free has stream 1 and used_on 0. Peak about 310 MB.
Trace pipeline_workload(std::uint64_t seed, int batches = 200);

// The embedded workloads by name: "random", "transformer", "pipeline".
std::vector<std::string> workload_names();
// Throws std::invalid_argument for an unknown name.
Trace make_workload(const std::string& name, std::uint64_t seed = 1);

}  // namespace streampool::bench
