"""tools/streampool_torch.py against the built libstreampool_torch.so, without PyTorch and
without a GPU: the ctypes layout of the stats matches the library's, and the calls that need no
device answer as documented. Run by CTest (torch.python_binding)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import streampool_torch  # noqa: E402


def main():
    path = streampool_torch.find_library(streampool_torch.CORE_LIBRARY)
    assert path is not None, "libstreampool_torch.so not found"
    assert os.path.dirname(path) == os.environ["STREAMPOOL_TORCH_LIB_DIR"], path
    lib = streampool_torch._core_library()  # raises if the stats layouts differ
    assert lib.streampool_torch_stats_size() == 22 * 8, lib.streampool_torch_stats_size()
    # No pool has been made on any device: no stats, and trim has nothing to do.
    assert streampool_torch.raw_stats(0) is None
    assert streampool_torch.memory_stats(0) == {}
    streampool_torch.empty_cache()
    streampool_torch.empty_cache(3)
    # Making a pool needs a GPU: refused with CUDA's reason where there is none; where there is
    # one, the pool is made with the limit.
    try:
        streampool_torch.set_memory_fraction(0.5, 0)
    except RuntimeError as e:
        assert "streampool_torch_set_memory_fraction" in str(e), e
        assert streampool_torch.raw_stats(0) is None
    else:
        assert streampool_torch.raw_stats(0)["reserved_limit"] > 0
        assert streampool_torch.memory_stats(0)["reserved_bytes.all.current"] == 0
    try:
        streampool_torch.set_memory_fraction(1.5, 0)
        raise AssertionError("a fraction of 1.5 was taken")
    except RuntimeError as e:
        assert "(0, 1]" in str(e), e
    # grant_access of a device whose pool cannot be made without a GPU: CUDA's reason; with a GPU,
    # a peer that does not exist (63) is refused.
    try:
        streampool_torch.grant_access(0, 63)
        raise AssertionError("device 63 was granted access")
    except RuntimeError as e:
        assert "streampool_torch_grant_access" in str(e), e
    print("python binding: 1 passed, 0 failed")


if __name__ == "__main__":
    main()
