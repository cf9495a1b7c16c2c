#!/usr/bin/env python3
"""PyTorch on streampool, checked on a GPU (docs/pytorch.md): training runs, record_stream and
CUDA graphs, each allocator in a process of its own (an allocator can be changed only before the
first CUDA allocation), at the same seed.

  python3 tools/torch_check.py [--steps N] [--models gpt2,resnet50] [--json PATH]

Allocators ("routes"):
  torch     PyTorch's own caching allocator, the reference
  hooks     route 1: streampool as the current allocator, with the C++ hooks
            (libstreampool_torch_hooks.so; only where it was built)
  plain     route 1 without the hooks (plain CUDAPluggableAllocator): trained where the hooks
            were not built; in the record_stream and graph checks the negative control, expected
            to fail there (a note says when it does not: the check then proved nothing)
  mem_pool  route 2: a torch.cuda.MemPool on streampool, PyTorch's cache on top

What it checks, for each model (GPT-2 small from a GPT2Config and ResNet-50 from torchvision,
random init, synthetic batches; deterministic algorithms on):
  - the losses of every step equal those of the torch run (the max abs difference is printed;
    a second torch run gives the noise floor of the kernels that stay nondeterministic);
  - median step time and peak reserved memory side by side (streampool's rows from streampool's
    own stats; mem_pool's also PyTorch's, which counts the pool's segments);
and, per allocator, a record_stream pattern (a copy stream fills each batch, a compute stream
reads it long after the tensor is freed) and a torch.cuda.graph capture + replay of a training
step, against eager results. Prints a markdown table and writes the JSON file.
Exit status: 0 when every expected result holds, 1 otherwise.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


# --- the worker: one allocator, one job, in this process ------------------------------------

def setup(route, seed):
    import streampool_torch
    import torch

    pool = None
    if route in ("hooks", "plain"):
        taken = streampool_torch.install(hooks=(route == "hooks"))
        assert taken == route, taken
    elif route == "mem_pool":
        pool = streampool_torch.mem_pool()
    torch.manual_seed(seed)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    return pool


def peak_reserved(route):
    import streampool_torch
    import torch

    out = {}
    if route in ("torch", "mem_pool"):
        out["torch_peak_reserved"] = torch.cuda.max_memory_reserved()
        out["torch_peak_allocated"] = torch.cuda.max_memory_allocated()
    if route != "torch":
        stats = streampool_torch.memory_stats()
        out["streampool_peak_reserved"] = stats.get("reserved_bytes.all.peak", 0)
        out["streampool_peak_requested"] = stats.get("requested_bytes.all.peak", 0)
        out["streampool_stats"] = stats
    return out


def make_model(name, args):
    import torch

    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_positions=args.seq, n_embd=768, n_layer=12, n_head=12)
        model = GPT2LMHeadModel(config).cuda()

        def batch(step, generator):
            ids = torch.randint(0, config.vocab_size, (args.gpt2_batch, args.seq),
                                generator=generator, device="cpu").cuda()
            return ids, ids

        def loss_of(model, inputs, labels):
            return model(input_ids=inputs, labels=labels).loss
    else:
        import torchvision

        model = torchvision.models.resnet50(weights=None).cuda()
        criterion = torch.nn.CrossEntropyLoss()

        def batch(step, generator):
            images = torch.randn(args.resnet_batch, 3, 224, 224, generator=generator).cuda()
            labels = torch.randint(0, 1000, (args.resnet_batch,), generator=generator).cuda()
            return images, labels

        def loss_of(model, inputs, labels):
            return criterion(model(inputs), labels)
    return model, batch, loss_of


def train(model, batch, loss_of, steps, generator):
    """`steps` AdamW steps of `model` on batches from `batch`: each step's loss, and its seconds
    (from a synchronized start to the loss on the host)."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses, times = [], []
    for step in range(steps):
        inputs, labels = batch(step, generator)
        torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(model, inputs, labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # synchronizes
        times.append(time.perf_counter() - start)
        del inputs, labels, loss
    return losses, times


def median_step_ms(times):
    """The median step past the first ten (warm-up), in milliseconds."""
    return 1000 * statistics.median(times[min(10, len(times) - 1):])


def job_train(args):
    import torch

    mem_pool = setup(args.route, args.seed)
    context = _pool_context(mem_pool)
    with context:
        model, batch, loss_of = make_model(args.model, args)
        generator = torch.Generator().manual_seed(args.seed + 1)
        losses, times = train(model, batch, loss_of, args.steps, generator)
    result = {"losses": losses, "median_step_ms": median_step_ms(times)}
    result.update(peak_reserved(args.route))
    return result


def core_library_missing():
    """True (and says so) where libstreampool_torch.so was not built."""
    import streampool_torch

    if streampool_torch.find_library(streampool_torch.CORE_LIBRARY) is not None:
        return False
    print("libstreampool_torch.so not found: build the target streampool_torch first",
          file=sys.stderr)
    return True


def _pool_context(mem_pool):
    import contextlib

    if mem_pool is None:
        return contextlib.nullcontext()
    import streampool_torch

    return streampool_torch.use_mem_pool(mem_pool)


def job_streams(args):
    """record_stream: batches filled on a copy stream and read on a compute stream. Each batch
    is freed right after the compute stream's (long) work on it is enqueued, and the next batch
    is allocated and filled on the copy stream at once: memory recycled before the compute
    stream is done with it is overwritten, and the sums come out wrong."""
    import torch

    mem_pool = setup(args.route, args.seed)
    out = {}
    with _pool_context(mem_pool):
        copy = torch.cuda.Stream()
        compute = torch.cuda.Stream()
        n = 2048
        weight = torch.randn(n, n, device="cuda") / n ** 0.5
        host = [torch.full((n, n), float(i + 1)).pin_memory() for i in range(args.stream_batches)]
        sums = []
        torch.cuda.synchronize()
        for i in range(args.stream_batches):
            with torch.cuda.stream(copy):
                x = torch.empty(n, n, device="cuda")
                x.copy_(host[i], non_blocking=True)
            compute.wait_stream(copy)
            with torch.cuda.stream(compute):
                acc = torch.zeros(n, n, device="cuda")
                for _ in range(args.stream_reads):  # reads x again and again, long after
                    acc = torch.tanh(acc @ weight) + x
                sums.append(acc.sum())
                x.record_stream(compute)
            del x  # freed on the copy stream while the compute stream still reads it
        torch.cuda.synchronize()
        out["sums"] = [s.item() for s in sums]
    out.update(peak_reserved(args.route))
    return out


def job_graph(args):
    """torch.cuda.graph: a training step of a small network captured once, replayed on new
    batches, against the same steps run eagerly (in this process, same allocator)."""
    import torch

    mem_pool = setup(args.route, args.seed)
    out = {}

    def build():
        torch.manual_seed(args.seed)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                    torch.nn.Linear(4096, 1024)).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        return model, optimizer

    generator = torch.Generator().manual_seed(args.seed + 2)
    batches = [(torch.randn(256, 1024, generator=generator),
                torch.randn(256, 1024, generator=generator)) for _ in range(args.graph_replays)]

    def step(model, optimizer, x, y):
        optimizer.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    # Eager reference.
    model, optimizer = build()
    eager = []
    for x, y in batches:
        eager.append(step(model, optimizer, x.cuda(), y.cuda()).item())

    # Captured: warm up on a side stream (as PyTorch's docs ask), capture, replay.
    model, optimizer = build()
    static_x = batches[0][0].cuda()
    static_y = batches[0][1].cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        warm_model, warm_optimizer = build()  # warm-up on copies: the real model stays untouched
        for _ in range(3):
            step(warm_model, warm_optimizer, static_x, static_y)
        del warm_model, warm_optimizer
    torch.cuda.current_stream().wait_stream(side)
    # Gradients must exist before capture (zero_grad(set_to_none=False) inside it).
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    graph = torch.cuda.CUDAGraph()
    replayed = []
    try:
        pool_id = mem_pool.id if mem_pool is not None else None
        with torch.cuda.graph(graph, pool=pool_id):
            static_loss = step(model, optimizer, static_x, static_y)
        for x, y in batches:
            static_x.copy_(x)
            static_y.copy_(y)
            graph.replay()
            replayed.append(static_loss.item())
        out["captured"] = True
    except Exception as e:  # the plain route is expected to land here
        out["captured"] = False
        out["error"] = f"{type(e).__name__}: {e}"[:400]
    out["eager"] = eager
    out["replayed"] = replayed
    if replayed:
        out["max_abs_diff"] = max(abs(a - b) for a, b in zip(eager, replayed))
    out.update(peak_reserved(args.route))
    if args.route != "torch" and out["captured"]:
        import streampool_torch

        held = streampool_torch.memory_stats().get("reserved_bytes.all.current", 0)
        del graph, static_loss
        import gc

        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # hooks: the reset hook returns the released graph pool
        out["reserved_before_release"] = held
        out["reserved_after_release"] = (
            streampool_torch.memory_stats().get("reserved_bytes.all.current", 0))
    return out


JOBS = {"train": job_train, "streams": job_streams, "graph": job_graph}


# --- the driver -------------------------------------------------------------------------------

def run_worker(args, job, route, model=None):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out_path = f.name
    command = [sys.executable, os.path.abspath(__file__), "--worker", job, "--route", route,
               "--out", out_path, "--seed", str(args.seed), "--steps", str(args.steps),
               "--seq", str(args.seq), "--gpt2-batch", str(args.gpt2_batch),
               "--resnet-batch", str(args.resnet_batch),
               "--stream-batches", str(args.stream_batches),
               "--stream-reads", str(args.stream_reads),
               "--graph-replays", str(args.graph_replays)]
    if model:
        command += ["--model", model]
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    start = time.time()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    result = {"job": job, "route": route, "model": model, "seconds": round(time.time() - start, 1),
              "returncode": done.returncode}
    try:
        with open(out_path) as f:
            result.update(json.load(f))
    except (OSError, ValueError):
        result["error"] = (done.stderr or done.stdout)[-2000:]
    finally:
        if os.path.exists(out_path):
            os.unlink(out_path)
    if done.returncode != 0:
        result.setdefault("error", (done.stderr or "")[-2000:])
    print(f"# {job} {model or ''} {route}: rc={done.returncode}, {result['seconds']} s",
          file=sys.stderr)
    return result


def last_line(text):
    """The last non-empty line of a worker's error output (the exception, for a traceback)."""
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def max_diff(a, b):
    if not a or not b or len(a) != len(b):
        return None
    return max(abs(x - y) for x, y in zip(a, b))


def mib(value):
    return f"{value / 2**20:,.0f}" if value else "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--models", default="gpt2,resnet50")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--seq", type=int, default=512, help="GPT-2 sequence length")
    parser.add_argument("--gpt2-batch", type=int, default=8)
    parser.add_argument("--resnet-batch", type=int, default=64)
    parser.add_argument("--stream-batches", type=int, default=12)
    parser.add_argument("--stream-reads", type=int, default=30)
    parser.add_argument("--graph-replays", type=int, default=20)
    parser.add_argument("--json", default="torch-check.json", help="where the JSON goes")
    parser.add_argument("--worker", choices=sorted(JOBS), help=argparse.SUPPRESS)
    parser.add_argument("--route", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("steps", "seq", "gpt2_batch", "resnet_batch", "stream_batches", "stream_reads",
                 "graph_replays"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    if args.worker:
        result = JOBS[args.worker](args)
        with open(args.out, "w") as f:
            json.dump(result, f)
        return 0

    import streampool_torch

    if core_library_missing():
        return 1
    have_hooks = streampool_torch.find_library(streampool_torch.HOOKS_LIBRARY) is not None
    # Route 1 trains with the hooks where they were built, else plain.
    routes = ["torch", "hooks" if have_hooks else "plain", "mem_pool"]
    if not have_hooks:
        print("# libstreampool_torch_hooks.so not built: route 1 checked as plain only",
              file=sys.stderr)
    report = {"args": {k: v for k, v in vars(args).items()
                       if k not in ("worker", "route", "model", "out")},
              "hooks_built": have_hooks, "train": [], "streams": [], "graph": []}
    failures = []
    notes = []  # what weakens a check without failing it

    for model in [m for m in args.models.split(",") if m]:
        runs = {route: run_worker(args, "train", route, model) for route in routes}
        runs["torch (again)"] = run_worker(args, "train", "torch", model)
        reference = runs["torch"].get("losses")
        for name, run in runs.items():
            run["name"] = name
            run["max_abs_loss_diff"] = max_diff(reference, run.get("losses"))
            report["train"].append(run)
            if run.get("returncode") != 0 or run.get("losses") is None:
                failures.append(f"train {model} {name}: {last_line(run.get('error'))}")
        # Identical losses are the expectation. Where kernels stay nondeterministic (the torch
        # run against itself differs), streampool's difference must be of that order (10x).
        noise = runs["torch (again)"]["max_abs_loss_diff"] or 0.0
        for name in routes[1:]:
            diff = runs[name]["max_abs_loss_diff"]
            if runs[name].get("losses") is None or reference is None:
                continue  # failed, and said so above
            if diff is not None and (diff == 0.0 or diff <= 10 * noise):
                continue
            failures.append(f"train {model} {name}: losses differ by {diff} "
                            f"(torch against itself: {noise})")

    stream_routes = ["torch"] + (["hooks"] if have_hooks else []) + ["mem_pool", "plain"]
    streams = {route: run_worker(args, "streams", route) for route in stream_routes}
    graphs = {route: run_worker(args, "graph", route) for route in stream_routes}
    for route, run in streams.items():
        run["max_abs_diff"] = max_diff(streams["torch"].get("sums"), run.get("sums"))
        run["expected"] = "differ" if route == "plain" else "equal"
        report["streams"].append(run)
        ok = run["max_abs_diff"] == 0.0
        if route != "plain" and not ok:
            failures.append(f"record_stream {route}: sums differ by {run['max_abs_diff']}")
        if route == "plain" and ok:
            notes.append("record_stream plain: the sums came out equal without the hook, so the "
                         "pattern did not expose early reuse this time (raise --stream-reads)")
    reference_replay = graphs["torch"].get("replayed")
    for route, run in graphs.items():
        run["expected"] = "capture fails" if route == "plain" else "replays equal eager"
        run["max_abs_diff_vs_torch_replay"] = max_diff(reference_replay, run.get("replayed"))
        report["graph"].append(run)
        if route == "plain":
            if run.get("captured"):
                notes.append("graph plain: the capture succeeded without the hooks (unexpected)")
            continue
        # Replays against eager steps of the same allocator: the same kernels on the same
        # inputs, so equal up to what capture changes in library choices (1e-5 relative).
        scale = max([1.0] + [abs(v) for v in run.get("eager", [])])
        if not (run.get("captured") and run.get("max_abs_diff") is not None
                and run["max_abs_diff"] <= 1e-5 * scale
                and len(run.get("replayed", [])) == args.graph_replays):
            failures.append(f"graph {route}: captured={run.get('captured')}, "
                            f"diff={run.get('max_abs_diff')}, {last_line(run.get('error'))}")

    # The report.
    lines = ["## Training (same seed; losses against the torch run)", "",
             "| model | allocator | steps | max abs loss diff | median step (ms) | "
             "peak reserved (MiB) | PyTorch's peak reserved (MiB) | peak requested/allocated (MiB) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for run in report["train"]:
        own = run.get("streampool_peak_reserved") or run.get("torch_peak_reserved")
        requested = run.get("streampool_peak_requested") or run.get("torch_peak_allocated")
        step = run.get("median_step_ms")
        lines.append(
            f"| {run['model']} | {run['name']} | {len(run.get('losses') or [])} | "
            f"{run['max_abs_loss_diff']} | {step:.1f} | {mib(own)} | "
            f"{mib(run.get('torch_peak_reserved'))} | {mib(requested)} |"
            if step is not None else
            f"| {run['model']} | {run['name']} | failed: "
            f"{last_line(run.get('error')).replace('|', '/')[:160]} | | | | | |")
    lines += ["", "## record_stream (copy stream + compute stream), sums against torch", "",
              "| allocator | expected | max abs diff | peak reserved (MiB) |",
              "| --- | --- | ---: | ---: |"]
    for run in report["streams"]:
        own = run.get("streampool_peak_reserved") or run.get("torch_peak_reserved")
        lines.append(f"| {run['route']} | {run['expected']} | {run.get('max_abs_diff')} | "
                     f"{mib(own)} |")
    lines += ["", "## torch.cuda.graph capture and replay of a training step, against eager", "",
              "| allocator | expected | captured | replays | max abs diff | diff vs torch's "
              "replays | streampool reserved before / after release (MiB) | error |",
              "| --- | --- | --- | ---: | ---: | ---: | --- | --- |"]
    for run in report["graph"]:
        release = (f"{mib(run['reserved_before_release'])} / "
                   f"{mib(run['reserved_after_release'])}"
                   if "reserved_after_release" in run else "-")
        error = last_line(run.get("error")).replace("|", "/")[:160]
        lines.append(f"| {run['route']} | {run['expected']} | {run.get('captured')} | "
                     f"{len(run.get('replayed') or [])} | {run.get('max_abs_diff')} | "
                     f"{run.get('max_abs_diff_vs_torch_replay')} | {release} | {error} |")
    lines += ["", f"Result: {'PASS' if not failures else 'FAIL'}"]
    lines += [f"- {f}" for f in failures]
    lines += [f"- note: {n}" for n in notes]
    print("\n".join(lines))
    report["failures"] = failures
    report["notes"] = notes
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
