// The worked example's stream-ordered code (producer_consumer.hpp): kernels for the GPU, host
// bodies for the fake device, one function for both.
#include "producer_consumer.hpp"

#include <streampool/pooled_buffer.hpp>

#include <algorithm>
#include <numeric>

namespace example {
namespace {

__global__ void fill(float* data, std::size_t n, float value) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    data[i] = value;
  }
}

__global__ void sum(const float* data, std::size_t n, float* total) {
  float mine = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    mine += data[i];
  }
  atomicAdd(total, mine);
}

constexpr unsigned threads = 256;
constexpr unsigned blocks = 64;

}  // namespace

using streampool::CopyKind;
using streampool::PooledBuffer;
using streampool::reads;
using streampool::writes;

// guide-begin produce_and_consume
float produce_and_consume(streampool::StreamOps& ops, streampool::MemoryPool& pool,
                          cudaStream_t producer, cudaStream_t consumer, std::size_t n,
                          Mistake mistake) {
  auto data = PooledBuffer<float>::alloc_async(pool, n, producer);
  float* values = data.data();
  ops.enqueue(
      producer, "fill", {writes(data)},
      [&](cudaStream_t s) { fill<<<blocks, threads, 0, s>>>(values, n, 1.0f); },
      [=] { std::fill_n(values, n, 1.0f); });

  // The consumer reads what the producer wrote: it must wait for it...
  if (mistake != Mistake::no_event_wait) ops.order_after(consumer, producer);
  // ...and the pool must not give the buffer to anyone before the consumer is done with it.
  if (mistake != Mistake::no_record_stream) data.record_stream(consumer);

  auto total = PooledBuffer<float>::alloc_async(pool, 1, consumer);
  float* sum_at = total.data();
  ops.set(sum_at, 0, sizeof(float), consumer, "zero the sum");
  ops.enqueue(
      consumer, "sum", {reads(data), writes(total)},
      [&](cudaStream_t s) { sum<<<blocks, threads, 0, s>>>(values, n, sum_at); },
      [=] { *sum_at = std::accumulate(values, values + n, 0.0f); });

  float result = 0;
  ops.copy(&result, sum_at, sizeof result, CopyKind::device_to_host, consumer, "read the sum");
  data.reset();  // dropped on the producer's stream while the consumer may still be reading it
  ops.synchronize(consumer);
  return result;
}
// guide-end
}  // namespace example
