#!/usr/bin/env python3
"""tools/torch_ddp.py's run_world must end a world whose rank died: the others block in their
collectives (NCCL's watchdog: 10 min by default) and the driver waited out --timeout (1800 s by
default, past the device tool's 600 s a command; found in review, 2026-12-07). A stand-in torch:
rank 1 fails at once, rank 0 blocks as in an all-reduce whose peer is gone. Run by CTest
(torch.ddp_dead_rank); no PyTorch, no GPU."""
import os
import sys
import tempfile
import textwrap
import time
import types

FAKE = textwrap.dedent("""
    import os, time, types
    def manual_seed(seed): pass
    def use_deterministic_algorithms(*a, **k): pass
    backends = types.SimpleNamespace(cudnn=types.SimpleNamespace())
    class _Cuda:
        @staticmethod
        def set_device(rank):
            if os.environ["RANK"] == "1":
                raise RuntimeError("rank 1 failed at set-up")
            time.sleep(3600)
    cuda = _Cuda()
""")

with tempfile.TemporaryDirectory() as fake:
    os.makedirs(os.path.join(fake, "torch", "distributed"))
    with open(os.path.join(fake, "torch", "__init__.py"), "w") as f:
        f.write(FAKE)
    open(os.path.join(fake, "torch", "distributed", "__init__.py"), "w").close()
    os.environ["PYTHONPATH"] = fake
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "tools"))
    import torch_ddp

    args = types.SimpleNamespace(gpus=2, timeout=60.0, seed=1, steps=1, seq=8, gpt2_batch=1)
    start = time.time()
    results = torch_ddp.run_world(args, "torch")
    took = time.time() - start
    print(f"run_world: {took:.1f} s, return codes {[r['returncode'] for r in results]}")
    if took > 20:  # 5 s of grace after the failure; the deadline is 60 s
        print("FAIL: the driver waited out the deadline after rank 1 had died")
        sys.exit(1)
    print("PASS")
