// streampool: a stream-ordered caching allocator for CUDA. The umbrella header. Not included, as
// they need CCCL's headers: <streampool/memory_resource.hpp>, <streampool/thrust_allocator.hpp>.
#pragma once

#include <streampool/capture_pool.hpp>
#include <streampool/cuda_device.hpp>
#include <streampool/device.hpp>
#include <streampool/device_pools.hpp>
#include <streampool/error.hpp>
#include <streampool/fake_device.hpp>
#include <streampool/size_classes.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pool_options.hpp>
#include <streampool/pool_stats.hpp>
#include <streampool/pooled_buffer.hpp>
#include <streampool/reserved_limit.hpp>
#include <streampool/trace_recorder.hpp>
#include <streampool/stream_ops.hpp>
#include <streampool/version.hpp>

#ifndef __CUDACC__  // fmt 9's headers do not compile under nvcc 13
#include <streampool/format.hpp>
#endif
