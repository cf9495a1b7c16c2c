# Finds PyTorch's C++ libraries through the Python package, for the PyTorch peer of `compare`.
# Sets STREAMPOOL_TORCH_FOUND, _INCLUDE, _LIBRARIES and _CXX11_ABI. Optional: without PyTorch the
# bench builds and compares the other peers. A try_compile guards against an API that moved.
set(STREAMPOOL_TORCH_FOUND OFF)
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND AND NOT STREAMPOOL_NO_TORCH)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import torch, os; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.version.cuda or '')"
    OUTPUT_VARIABLE torch_info RESULT_VARIABLE torch_result ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(torch_result EQUAL 0)
    string(REPLACE "\n" ";" torch_info "${torch_info}")
    list(GET torch_info 0 torch_dir)
    list(GET torch_info 1 torch_abi)
    list(GET torch_info 2 torch_cuda)
    find_library(torch_c10 c10 PATHS ${torch_dir}/lib NO_DEFAULT_PATH)
    find_library(torch_c10_cuda c10_cuda PATHS ${torch_dir}/lib NO_DEFAULT_PATH)
    if(torch_c10 AND torch_c10_cuda AND NOT torch_cuda STREQUAL "")
      set(probe ${CMAKE_CURRENT_BINARY_DIR}/torch_probe.cpp)
      file(WRITE ${probe} "#include <c10/cuda/CUDACachingAllocator.h>\n#include <c10/cuda/CUDAFunctions.h>\nint main() { namespace a = c10::cuda::CUDACachingAllocator; a::init(c10::cuda::device_count()); void* p = a::raw_alloc_with_stream(256, nullptr); a::raw_delete(p); auto s = a::getDeviceStats(0); a::resetPeakStats(0); a::emptyCache(); return int(s.reserved_bytes[0].peak < 0); }\n")
      try_compile(torch_ok ${CMAKE_CURRENT_BINARY_DIR}/torch_probe SOURCES ${probe}
        COMPILE_DEFINITIONS -D_GLIBCXX_USE_CXX11_ABI=${torch_abi}
        CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${torch_dir}/include;${CUDAToolkit_INCLUDE_DIRS}"
        LINK_LIBRARIES ${torch_c10} ${torch_c10_cuda} CUDA::cudart
        CXX_STANDARD 17
        OUTPUT_VARIABLE torch_probe_output)
      if(torch_ok)
        set(STREAMPOOL_TORCH_FOUND ON)
        set(STREAMPOOL_TORCH_INCLUDE ${torch_dir}/include)
        set(STREAMPOOL_TORCH_LIBRARIES ${torch_c10} ${torch_c10_cuda})
        set(STREAMPOOL_TORCH_CXX11_ABI ${torch_abi})
        message(STATUS "streampool-bench: PyTorch peer from ${torch_dir} (CUDA ${torch_cuda})")
      else()
        message(STATUS "streampool-bench: PyTorch found but its allocator API did not compile; no PyTorch peer")
        file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/torch_probe.log "${torch_probe_output}")
      endif()
    endif()
  endif()
endif()
