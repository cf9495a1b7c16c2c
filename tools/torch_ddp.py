#!/usr/bin/env python3
"""Data-parallel training over NCCL with streampool as PyTorch's allocator in every process
(issue 13, docs/pytorch.md): GPT-2 small, one process per GPU, torch.distributed with the NCCL
backend and DistributedDataParallel, at the same seed with PyTorch's own allocator and with
streampool (route 1, the hooks where they were built), each run in processes of its own.

  python3 tools/torch_ddp.py [--gpus N] [--steps N] [--json PATH]

--gpus defaults to every GPU CUDA sees; with one GPU the run is a world of one process (NCCL and
DDP still run their code; what crosses GPUs needs two). Each rank trains on batches of its own
(its rank in the seed); DDP averages the gradients across ranks.

What it checks, rank by rank: every step's loss equals the loss of the run with PyTorch's
allocator (a second torch run gives the noise floor of kernels that stay nondeterministic: a
difference within 10x of it passes), the runs end without error (NCCL's own buffers and streams
beside the pool), and it prints median step time and peak reserved memory per rank side by side
(streampool's from its own stats, PyTorch's from torch.cuda.max_memory_reserved). Writes the
JSON file. Exit status: 0 when every check holds, 1 otherwise.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


# --- one rank: in this process ------------------------------------------------------------------

def rank_main(args):
    import torch
    import torch.distributed as dist

    import torch_check

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    # The allocator first: torch.cuda.set_device initializes CUDA, after which PyTorch's
    # allocator can no longer be replaced.
    torch_check.setup(args.route, args.seed)
    torch.cuda.set_device(rank)
    try:
        dist.init_process_group("nccl", rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
    except TypeError:  # PyTorch before 2.3: no device_id (the current device is the rank's)
        dist.init_process_group("nccl", rank=rank, world_size=world)
    model, batch, loss_of = torch_check.make_model("gpt2", args)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    generator = torch.Generator().manual_seed(args.seed + 1 + 1000 * rank)
    # DDP's all-reduce of the gradients runs in each step's backward, on NCCL's streams.
    losses, times = torch_check.train(model, batch, loss_of, args.steps, generator)
    # Every rank has the same weights after DDP's averaged steps: a checksum shows it.
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    sums = torch.tensor([checksum], dtype=torch.float64, device="cuda")
    gathered = [torch.zeros_like(sums) for _ in range(world)]
    dist.all_gather(gathered, sums)
    result = {"rank": rank, "world": world, "losses": losses,
              "median_step_ms": torch_check.median_step_ms(times),
              "weights_checksums": [float(g.item()) for g in gathered],
              "nccl_version": str(torch.cuda.nccl.version())}
    result.update(torch_check.peak_reserved(args.route))
    result.pop("streampool_stats", None)
    dist.barrier()
    dist.destroy_process_group()
    return result


# --- the driver ---------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(args, route):
    """One training run: a process per GPU, all with `route`. A list of the ranks' results."""
    port = free_port()
    outs, logs, procs = [], [], []
    start = time.time()
    for rank in range(args.gpus):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            outs.append(f.name)
        # Output to a file, not a pipe: a rank blocked on a full pipe would stall the others in
        # their collectives.
        logs.append(tempfile.TemporaryFile(mode="w+"))
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.gpus), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   CUBLAS_WORKSPACE_CONFIG=":4096:8")
        command = [sys.executable, os.path.abspath(__file__), "--rank-of", route,
                   "--out", outs[-1], "--seed", str(args.seed), "--steps", str(args.steps),
                   "--seq", str(args.seq), "--gpt2-batch", str(args.gpt2_batch)]
        procs.append(subprocess.Popen(command, env=env, stdout=logs[-1],
                                      stderr=subprocess.STDOUT, text=True))
    # One deadline for the whole world; and a rank that fails ends it (after a grace for the
    # others' own errors): its peers would block in their collectives until NCCL's watchdog.
    deadline = start + args.timeout
    failed_at = None
    while True:
        codes = [p.poll() for p in procs]  # every rank's, each time
        if all(code is not None for code in codes):
            break
        now = time.time()
        if failed_at is None and any(code not in (None, 0) for code in codes):
            failed_at = now
        if now >= deadline or (failed_at is not None and now >= failed_at + 5):
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.2)
    results = []
    for rank, (proc, out, log) in enumerate(zip(procs, outs, logs)):
        proc.wait()
        result = {"route": route, "rank": rank, "returncode": proc.returncode}
        try:
            with open(out) as f:
                result.update(json.load(f))
        except (OSError, ValueError):
            pass
        finally:
            if os.path.exists(out):
                os.unlink(out)
        log.seek(0)
        if proc.returncode != 0 or "losses" not in result:
            result["error"] = log.read()[-2000:]
        log.close()
        results.append(result)
    print(f"# {route}: {args.gpus} rank(s), {time.time() - start:.1f} s, return codes "
          f"{[r['returncode'] for r in results]}", file=sys.stderr)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=0, help="processes, one per GPU (0: all)")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--seq", type=int, default=512, help="GPT-2 sequence length")
    parser.add_argument("--gpt2-batch", type=int, default=8, help="per rank")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a run may take")
    parser.add_argument("--json", default="torch-ddp.json", help="where the JSON goes")
    parser.add_argument("--rank-of", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("steps", "seq", "gpt2_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    args.route = args.rank_of

    if args.rank_of:
        result = rank_main(args)
        with open(args.out, "w") as f:
            json.dump(result, f)
        return 0

    import streampool_torch
    import torch

    import torch_check

    if torch_check.core_library_missing():
        return 1
    available = torch.cuda.device_count()
    if args.gpus == 0:
        args.gpus = available
    if args.gpus < 1 or args.gpus > available:
        print(f"--gpus {args.gpus}: CUDA sees {available} GPU(s)", file=sys.stderr)
        return 1
    have_hooks = streampool_torch.find_library(streampool_torch.HOOKS_LIBRARY) is not None
    streampool_route = "hooks" if have_hooks else "plain"
    runs = {"torch": run_world(args, "torch"),
            streampool_route: run_world(args, streampool_route),
            "torch (again)": run_world(args, "torch")}

    failures = []
    reference = runs["torch"]
    noise = 0.0
    for name, ranks in runs.items():
        for result, ref in zip(ranks, reference):
            a, b = ref.get("losses"), result.get("losses")
            result["max_abs_loss_diff"] = (max(abs(x - y) for x, y in zip(a, b))
                                           if a and b and len(a) == len(b) else None)
            if name == "torch (again)" and result["max_abs_loss_diff"] is not None:
                noise = max(noise, result["max_abs_loss_diff"])
            if result.get("returncode") != 0 or b is None:
                lines = [x for x in (result.get("error") or "").splitlines() if x.strip()]
                failures.append(f"{name} rank {result['rank']}: "
                                f"{lines[-1].strip() if lines else 'no result'}")
            sums = result.get("weights_checksums") or []
            if sums and max(sums) != min(sums):
                failures.append(f"{name} rank {result['rank']}: the ranks' weights differ "
                                f"after training ({sums})")
    for result in runs[streampool_route]:
        diff = result.get("max_abs_loss_diff")
        if diff is not None and not (diff == 0.0 or diff <= 10 * noise):
            failures.append(f"{streampool_route} rank {result['rank']}: losses differ by {diff} "
                            f"(torch against itself: {noise})")

    def mib(value):
        return f"{value / 2**20:,.0f}" if value else "-"

    lines = [f"## GPT-2 small, DistributedDataParallel over NCCL, {args.gpus} GPU(s), "
             f"{args.steps} steps, batch {args.gpt2_batch} x {args.seq} per rank", "",
             "| allocator | rank | steps | max abs loss diff | median step (ms) | "
             "peak reserved (MiB) | peak requested/allocated (MiB) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, ranks in runs.items():
        for r in ranks:
            own = r.get("streampool_peak_reserved") or r.get("torch_peak_reserved")
            requested = r.get("streampool_peak_requested") or r.get("torch_peak_allocated")
            step = r.get("median_step_ms")
            lines.append(f"| {name} | {r['rank']} | {len(r.get('losses') or [])} | "
                         f"{r.get('max_abs_loss_diff')} | "
                         f"{'-' if step is None else f'{step:.1f}'} | {mib(own)} | "
                         f"{mib(requested)} |")
    lines += ["", f"NCCL {reference[0].get('nccl_version', '?')}; "
              f"Result: {'PASS' if not failures else 'FAIL'}"]
    lines += [f"- {f}" for f in failures]
    print("\n".join(lines))
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "runs": runs, "failures": failures}, f, indent=1)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
