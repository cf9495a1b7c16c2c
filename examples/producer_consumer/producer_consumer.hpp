// The worked example of docs/testing-your-code.md: a producer fills a buffer on one stream and a
// consumer sums it on another, through a MemoryPool, written once against StreamOps so that the
// same function runs on a GPU (producer_consumer_main.cpp) and in a unit test on the fake device
// (test/examples/producer_consumer.cpp).
#pragma once

#include <streampool/memory_pool.hpp>
#include <streampool/stream_ops.hpp>

#include <cstddef>

namespace example {

// The two mistakes the fake device catches, each a runtime switch, so that one test runs all
// three versions.
enum class Mistake {
  none,
  no_event_wait,     // the consumer does not wait for the producer's fill
  no_record_stream,  // the buffer is dropped on the producer's stream without record_stream
};

// Fills `n` floats with 1 on `producer`, sums them on `consumer` and returns the sum (n when all
// is well). Synchronizes `consumer` before returning.
float produce_and_consume(streampool::StreamOps& ops, streampool::MemoryPool& pool,
                          cudaStream_t producer, cudaStream_t consumer, std::size_t n,
                          Mistake mistake = Mistake::none);

}  // namespace example
