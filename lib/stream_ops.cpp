// StreamOps: the operations both devices share, through the Device seam.
#include <streampool/error.hpp>
#include <streampool/stream_ops.hpp>

namespace streampool {

cudaEvent_t StreamOps::create_event() {
  cudaEvent_t event = nullptr;
  throw_on_cuda_error(device_->event_create(&event), "cudaEventCreateWithFlags");
  return event;
}

void StreamOps::destroy_event(cudaEvent_t event) {
  throw_on_cuda_error(device_->event_destroy(event), "cudaEventDestroy");
}

void StreamOps::record(cudaEvent_t event, cudaStream_t stream) {
  throw_on_cuda_error(device_->event_record(event, stream), "cudaEventRecord");
}

void StreamOps::wait(cudaStream_t stream, cudaEvent_t event) {
  throw_on_cuda_error(device_->stream_wait_event(stream, event), "cudaStreamWaitEvent");
}

void StreamOps::order_after(cudaStream_t waiter, cudaStream_t awaited) {
  const cudaEvent_t event = create_event();
  try {
    record(event, awaited);
    wait(waiter, event);
  } catch (...) {
    device_->event_destroy(event);
    throw;
  }
  destroy_event(event);
}

void StreamOps::synchronize(cudaStream_t stream) {
  throw_on_cuda_error(device_->stream_synchronize(stream), "cudaStreamSynchronize");
}

}  // namespace streampool
