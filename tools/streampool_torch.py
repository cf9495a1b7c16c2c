"""streampool as PyTorch's CUDA allocator (docs/pytorch.md).

Two routes, both on the libraries built from torch/ (libstreampool_torch.so and, where PyTorch's
C++ headers were found at build time, libstreampool_torch_hooks.so):

  Route 1, streampool in place of PyTorch's allocator (before the first CUDA allocation):

      import streampool_torch
      streampool_torch.install()          # the hooks library if it was built, else plain
      ...
      streampool_torch.memory_stats()     # PyTorch's key names, from streampool's stats
      streampool_torch.empty_cache()

  Route 2, streampool under PyTorch's own cache, as a torch.cuda.MemPool's allocator:

      pool = streampool_torch.mem_pool()
      with streampool_torch.use_mem_pool(pool):   # every thread's allocations (backward's too)
          ...

The libraries are looked for in the folder given to the functions as `lib_dir`, if any, then in
STREAMPOOL_TORCH_LIB_DIR, then in the build folders of this source tree (build-torch/,
build-gpu/, build/: each one's torch/ folder).
"""

import contextlib
import ctypes
import os

CORE_LIBRARY = "libstreampool_torch.so"
HOOKS_LIBRARY = "libstreampool_torch_hooks.so"

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BUILD_DIRS = ("build-torch", "build-gpu", "build")


class _Stats(ctypes.Structure):
    """streampool_torch_stats of torch/streampool_torch.h, field for field."""

    _fields_ = [
        (name, ctypes.c_int64)
        for name in (
            "requested_bytes_current", "requested_bytes_peak", "requested_bytes_total",
            "reserved_bytes_current", "reserved_bytes_peak", "reserved_bytes_total",
            "live_allocations_current", "live_allocations_peak", "live_allocations_total",
            "segments",
        )
    ] + [
        (name, ctypes.c_uint64)
        for name in (
            "cache_hits", "cache_misses", "device_allocations", "device_frees",
            "fences_recorded", "cross_stream_reuses", "blocking_fallbacks", "oom_retries",
            "growth_waits", "failed_allocations", "out_of_memory", "reserved_limit",
        )
    ]


def find_library(name, lib_dir=None):
    """The path of `name` (CORE_LIBRARY or HOOKS_LIBRARY), or None where it was not built."""
    dirs = [lib_dir] if lib_dir else []
    if os.environ.get("STREAMPOOL_TORCH_LIB_DIR"):
        dirs.append(os.environ["STREAMPOOL_TORCH_LIB_DIR"])
    dirs += [os.path.join(_ROOT, build, "torch") for build in _BUILD_DIRS]
    for folder in dirs:
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    return None


_core = None
_route = None


def _core_library(lib_dir=None):
    global _core
    if _core is None:
        path = find_library(CORE_LIBRARY, lib_dir)
        if path is None:
            raise FileNotFoundError(
                f"{CORE_LIBRARY} not found (build the target streampool_torch, or set "
                "STREAMPOOL_TORCH_LIB_DIR)")
        lib = ctypes.CDLL(path)
        lib.streampool_torch_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats)]
        lib.streampool_torch_get_stats.restype = ctypes.c_int
        lib.streampool_torch_stats_size.restype = ctypes.c_size_t
        lib.streampool_torch_trim.argtypes = [ctypes.c_int]
        lib.streampool_torch_set_memory_fraction.argtypes = [ctypes.c_double, ctypes.c_int]
        lib.streampool_torch_grant_access.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.streampool_torch_last_error.restype = ctypes.c_char_p
        if lib.streampool_torch_stats_size() != ctypes.sizeof(_Stats):
            raise RuntimeError(f"{path}: its stats layout is not this module's; rebuild it")
        lib.path = path
        _core = lib
    return _core


def _error(lib):
    return lib.streampool_torch_last_error().decode(errors="replace")


def route():
    """How this process uses streampool: "hooks", "plain", "mem_pool", or None."""
    return _route


def install(hooks=None, lib_dir=None):
    """Route 1: makes streampool PyTorch's current CUDA allocator. Call it before the first CUDA
    allocation (PyTorch cannot swap an allocator in use).

    hooks=None uses the hooks library where it was built, True requires it, False takes the plain
    CUDAPluggableAllocator (then Tensor.record_stream does nothing, torch.cuda.graph fails, and
    torch.cuda.empty_cache does nothing: call this module's empty_cache). Returns the route taken,
    "hooks" or "plain".
    """
    global _route
    import torch

    if torch.cuda.is_initialized():
        raise RuntimeError("streampool_torch.install: CUDA is initialized already; call it "
                           "before the first CUDA allocation")
    core = _core_library(lib_dir)
    hooks_path = find_library(HOOKS_LIBRARY, lib_dir or os.path.dirname(core.path))
    if hooks is True and hooks_path is None:
        raise FileNotFoundError(f"{HOOKS_LIBRARY} not built (PyTorch's C++ headers were not "
                                "found when configuring)")
    if hooks is not False and hooks_path is not None:
        lib = ctypes.CDLL(hooks_path)
        lib.streampool_torch_install_error.restype = ctypes.c_char_p
        if lib.streampool_torch_install() != 0:
            raise RuntimeError("streampool_torch_install: " +
                               lib.streampool_torch_install_error().decode(errors="replace"))
        _route = "hooks"
    else:
        # The throwing form: PyTorch uses what the plain allocator returns unchecked.
        allocator = torch.cuda.memory.CUDAPluggableAllocator(
            core.path, "streampool_torch_alloc_or_throw", "streampool_torch_free")
        torch.cuda.memory.change_current_allocator(allocator)
        _route = "plain"
    return _route


def mem_pool(lib_dir=None, **kwargs):
    """Route 2: a torch.cuda.MemPool whose segments come from streampool (kwargs go to MemPool).
    PyTorch's own cache sits on top: it asks streampool for whole segments, and keeps its stats,
    record_stream and graphs working as with its own allocator."""
    global _route
    import torch

    core = _core_library(lib_dir)
    # The segment entry points: null on failure (PyTorch's cache empties itself and retries on
    # null), and segments for graph captures that PyTorch begins without telling the allocator.
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        core.path, "streampool_torch_segment_alloc", "streampool_torch_segment_free")
    pool = torch.cuda.MemPool(allocator.allocator(), **kwargs)
    pool._streampool_allocator = allocator  # kept alive with the pool
    _route = _route or "mem_pool"
    return pool


@contextlib.contextmanager
def use_mem_pool(pool, all_threads=True, device=None):
    """Routes allocations to `pool` inside the block. all_threads=True routes every thread's
    (autograd runs backward on threads of its own, which torch.cuda.use_mem_pool leaves out);
    all_threads=False is torch.cuda.use_mem_pool itself."""
    import torch

    if not all_threads or not hasattr(torch._C, "_cuda_beginAllocateToPool"):
        with torch.cuda.use_mem_pool(pool, device=device):
            yield
        return
    index = torch.cuda.current_device() if device is None else torch.device("cuda", device).index
    try:
        torch._C._cuda_beginAllocateToPool(index, pool.id)
    except TypeError as e:  # a PyTorch whose private binding takes other arguments
        import warnings

        warnings.warn(f"_cuda_beginAllocateToPool: {e}; routing this thread's allocations only")
        with torch.cuda.use_mem_pool(pool, device=device):
            yield
        return
    try:
        yield
    finally:
        torch._C._cuda_endAllocateToPool(index, pool.id)
        torch._C._cuda_releasePool(index, pool.id)


def raw_stats(device=None, lib_dir=None):
    """streampool's own stats of `device` (default: the current device) under its own names, or
    None where streampool has no pool on it yet."""
    lib = _core_library(lib_dir)
    stats = _Stats()
    status = lib.streampool_torch_get_stats(_device_index(device), ctypes.byref(stats))
    if status < 0:
        raise RuntimeError("streampool_torch_get_stats: " + _error(lib))
    if status == 1:
        return None
    return {name: getattr(stats, name) for name, _ in _Stats._fields_}


def memory_stats(device=None, lib_dir=None):
    """The stats of streampool's pool on `device`, under the keys of torch.cuda.memory_stats that
    streampool knows (docs/pytorch.md lists them, and what each means here); {} where streampool
    has no pool on the device yet."""
    s = raw_stats(device, lib_dir)
    if s is None:
        return {}
    result = {}

    def triple(key, prefix):
        result[f"{key}.all.current"] = s[f"{prefix}_current"]
        result[f"{key}.all.peak"] = s[f"{prefix}_peak"]
        result[f"{key}.all.allocated"] = s[f"{prefix}_total"]
        result[f"{key}.all.freed"] = s[f"{prefix}_total"] - s[f"{prefix}_current"]

    triple("requested_bytes", "requested_bytes")
    # streampool does not count its blocks' rounded sizes: allocated is what was asked for.
    triple("allocated_bytes", "requested_bytes")
    triple("reserved_bytes", "reserved_bytes")
    triple("allocation", "live_allocations")
    result["segment.all.current"] = s["segments"]
    result["num_alloc_retries"] = s["oom_retries"]
    result["num_ooms"] = s["out_of_memory"]
    result["num_device_alloc"] = s["device_allocations"]
    result["num_device_free"] = s["device_frees"]
    # streampool's own, under its own prefix.
    for name in ("cache_hits", "cache_misses", "fences_recorded", "cross_stream_reuses",
                 "blocking_fallbacks", "growth_waits", "failed_allocations", "reserved_limit"):
        result[f"streampool.{name}"] = s[name]
    return dict(sorted(result.items()))


def empty_cache(device=None, lib_dir=None):
    """Returns streampool's cached memory to the device (all devices when `device` is None), as
    torch.cuda.empty_cache does for PyTorch's. Refused while a graph capture is under way."""
    lib = _core_library(lib_dir)
    index = -1 if device is None else _device_index(device)
    if lib.streampool_torch_trim(index) != 0:
        raise RuntimeError("streampool_torch_trim: " + _error(lib))


def grant_access(device, peer, lib_dir=None):
    """Kernels of GPU `peer` may use streampool's memory on `device`, every block handed out and
    every later one. Needed for peer-to-peer reads of streampool's memory (PyTorch's own
    enabling of peer access reaches memory from cudaMalloc only)."""
    lib = _core_library(lib_dir)
    if lib.streampool_torch_grant_access(_device_index(device), _device_index(peer)) != 0:
        raise RuntimeError("streampool_torch_grant_access: " + _error(lib))


def set_memory_fraction(fraction, device=None, lib_dir=None):
    """streampool's pool on `device` reserves at most `fraction` of the device's memory (the
    hooks route also takes torch.cuda.set_per_process_memory_fraction)."""
    lib = _core_library(lib_dir)
    if lib.streampool_torch_set_memory_fraction(float(fraction), _device_index(device)) != 0:
        raise RuntimeError("streampool_torch_set_memory_fraction: " + _error(lib))


def _device_index(device):
    if device is None:
        import torch

        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    import torch

    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index
