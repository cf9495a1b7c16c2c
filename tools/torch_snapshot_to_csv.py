#!/usr/bin/env python3
"""Convert a PyTorch CUDA memory snapshot into a trace that streampool-bench replays.

Input: the pickle that torch.cuda.memory._dump_snapshot(path) writes (the dict that
torch.cuda.memory._snapshot() returns), recorded under torch.cuda.memory._record_memory_history().
Its 'device_traces' holds one list of allocator events per device; each event is a dict with
'action', 'addr', 'size', 'stream', 'time_us' (absent in older PyTorch) and 'frames'.

Output: CSV with the columns of RMM's logging adaptor, in PyTorch's vocabulary (bench/trace.hpp
says how streampool-bench reads it):

    Thread,Time,Action,Pointer,Size,Stream
    0,34874,alloc,0x7fd465400000,3072,0x0

  - Action: alloc, free_requested and free_completed, as PyTorch names them. segment_alloc,
    segment_free, segment_map, segment_unmap, oom, snapshot and any other action are skipped
    (counted on stderr): they are the cache's own traffic, not the program's requests.
  - Time: microseconds since the first event written; an event without time_us gets the time of
    the event before it (0 when the snapshot has no times at all).
  - Pointer and Stream in hexadecimal, Size in decimal bytes as recorded. Thread is always 0:
    PyTorch does not record it.
  - A trace that starts mid-run (recording began late, or the ring buffer of max_entries dropped
    its oldest events) frees blocks it never allocated; those lines are written as they are, and
    the bench counts and drops them.

One device per file: --device N (default 0). The output is gzip'd when its name ends in .gz.
Only the standard library is needed (no torch import): the snapshot is plain Python data. As with
any pickle, convert only snapshots you trust.

    tools/torch_snapshot_to_csv.py snapshot.pickle trace.csv.gz [--device N]
    tools/torch_snapshot_to_csv.py --self-test
"""

import argparse
import collections
import gzip
import io
import os
import pickle
import sys
import tempfile

HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"
KEPT_ACTIONS = ("alloc", "free_requested", "free_completed")


class ConversionError(Exception):
    pass


def device_events(snapshot, device):
    """The event list of one device of a snapshot dict."""
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise ConversionError(
            "not a memory snapshot with a trace (no 'device_traces'): record it under "
            "torch.cuda.memory._record_memory_history() and save it with "
            "torch.cuda.memory._dump_snapshot()")
    traces = snapshot["device_traces"]
    if not 0 <= device < len(traces):
        raise ConversionError(
            "no device {} in the snapshot: it has {} ({})".format(
                device, len(traces), describe_devices(traces)))
    return traces[device]


def describe_devices(traces):
    return ", ".join(
        "device {}: {} events".format(index, sum(1 for e in events if e.get("action") in KEPT_ACTIONS))
        for index, events in enumerate(traces)) or "no devices"


def convert(snapshot, out, device=0):
    """Writes the CSV of `device`'s events to the text stream `out`; returns the counts of the
    actions written and of those skipped."""
    events = device_events(snapshot, device)
    kept = [e for e in events if e.get("action") in KEPT_ACTIONS]
    if not kept:
        raise ConversionError(
            "device {} has no alloc or free events ({})".format(
                device, describe_devices(snapshot["device_traces"])))
    first = next((e["time_us"] for e in kept if e.get("time_us") is not None), 0)
    written = collections.Counter()
    skipped = collections.Counter(e.get("action", "?") for e in events
                                  if e.get("action") not in KEPT_ACTIONS)
    out.write(HEADER)
    time = 0
    for event in kept:
        if event.get("time_us") is not None:
            time = event["time_us"] - first
        out.write("0,{},{},{:#x},{},{:#x}\n".format(
            time, event["action"], event["addr"], event["size"], event.get("stream", 0)))
        written[event["action"]] += 1
    return written, skipped


def open_output(path):
    if path == "-":
        return sys.stdout
    if path.endswith(".gz"):
        return gzip.open(path, "wt", newline="")
    return open(path, "w", newline="")


def load_snapshot(path):
    with open(path, "rb") as file:
        return pickle.load(file)


def run(snapshot_path, output_path, device):
    snapshot = load_snapshot(snapshot_path)
    text = io.StringIO()  # converted whole first, so that a refusal leaves no partial file
    written, skipped = convert(snapshot, text, device)
    out = open_output(output_path)
    try:
        out.write(text.getvalue())
    finally:
        if out is not sys.stdout:
            out.close()
    summary = ", ".join("{} {}".format(n, a) for a, n in sorted(written.items()))
    if skipped:
        summary += "; skipped " + ", ".join("{} {}".format(n, a) for a, n in sorted(skipped.items()))
    print("{}: device {}: {}".format(output_path, device, summary), file=sys.stderr)


# --- self-test ------------------------------------------------------------------------------------

def fake_snapshot():
    """A snapshot as PyTorch writes it, with the cases the converter must handle."""
    side = 0x70E94310
    frames = [{"filename": "train.py", "line": 12, "name": "forward"}]
    device0 = [
        {"action": "segment_alloc", "addr": 0x7F0000000000, "size": 2097152, "stream": 0,
         "time_us": 1000, "frames": frames},
        # allocated before recording began: its free is kept, the bench counts it
        {"action": "free_requested", "addr": 0x7F00001FF000, "size": 512, "stream": 0,
         "time_us": 1001, "frames": frames},
        {"action": "free_completed", "addr": 0x7F00001FF000, "size": 512, "stream": 0,
         "time_us": 1001, "frames": frames},
        {"action": "alloc", "addr": 0x7F0000000000, "size": 3072, "stream": 0, "time_us": 1010,
         "frames": frames},
        {"action": "alloc", "addr": 0x7F0000000C00, "size": 1000, "stream": side,
         "time_us": 1020, "frames": frames},
        {"action": "oom", "addr": 0, "size": 1 << 40, "stream": 0, "time_us": 1021,
         "frames": frames, "device_free": 0},
        {"action": "free_requested", "addr": 0x7F0000000C00, "size": 1000, "stream": side,
         "time_us": 1030, "frames": frames},
        {"action": "alloc", "addr": 0x7F0000001000, "size": 64, "stream": 0, "frames": frames},
        {"action": "free_completed", "addr": 0x7F0000000C00, "size": 1000, "stream": side,
         "time_us": 1050, "frames": frames},
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 1060,
         "frames": []},
        {"action": "segment_free", "addr": 0x7F0000000000, "size": 2097152, "stream": 0,
         "time_us": 1070, "frames": frames},
    ]
    device1 = [
        {"action": "alloc", "addr": 0x7E0000000000, "size": 256, "stream": 7, "time_us": 5},
    ]
    return {"segments": [], "device_traces": [device0, device1]}


EXPECTED_DEVICE0 = [
    "Thread,Time,Action,Pointer,Size,Stream",
    "0,0,free_requested,0x7f00001ff000,512,0x0",
    "0,0,free_completed,0x7f00001ff000,512,0x0",
    "0,9,alloc,0x7f0000000000,3072,0x0",
    "0,19,alloc,0x7f0000000c00,1000,0x70e94310",
    "0,29,free_requested,0x7f0000000c00,1000,0x70e94310",
    "0,29,alloc,0x7f0000001000,64,0x0",  # no time_us: the previous event's
    "0,49,free_completed,0x7f0000000c00,1000,0x70e94310",
]
EXPECTED_DEVICE1 = [
    "Thread,Time,Action,Pointer,Size,Stream",
    "0,0,alloc,0x7e0000000000,256,0x7",
]


def self_test():
    failures = []

    def check(what, condition):
        if not condition:
            failures.append(what)

    with tempfile.TemporaryDirectory() as directory:
        snapshot_path = os.path.join(directory, "snapshot.pickle")
        with open(snapshot_path, "wb") as file:
            pickle.dump(fake_snapshot(), file)

        plain = os.path.join(directory, "trace.csv")
        run(snapshot_path, plain, 0)
        with open(plain, newline="") as file:
            check("device 0 is converted by default, keeping alloc and free events only",
                  file.read().splitlines() == EXPECTED_DEVICE0)

        packed = os.path.join(directory, "trace.csv.gz")
        run(snapshot_path, packed, 0)
        with open(packed, "rb") as file:
            check("an output named .gz is gzip'd", file.read(2) == b"\x1f\x8b")
        with gzip.open(packed, "rt", newline="") as file:
            check("the gzip'd output holds the same CSV", file.read().splitlines() == EXPECTED_DEVICE0)

        other = os.path.join(directory, "device1.csv")
        run(snapshot_path, other, 1)
        with open(other, newline="") as file:
            check("--device selects another device's events",
                  file.read().splitlines() == EXPECTED_DEVICE1)

        for device in (2, -1):
            try:
                run(snapshot_path, os.path.join(directory, "none.csv"), device)
                check("device {} is refused".format(device), False)
            except ConversionError as error:
                check("the refusal of device {} lists the devices".format(device),
                      "device 0: 7 events" in str(error))
                check("a refusal writes no file",
                      not os.path.exists(os.path.join(directory, "none.csv")))

        try:
            convert({"segments": []}, io.StringIO())
            check("a snapshot without device_traces is refused", False)
        except ConversionError:
            pass

    for failure in failures:
        print("self-test FAILED: " + failure, file=sys.stderr)
    if not failures:
        print("self-test passed", file=sys.stderr)
    return 1 if failures else 0


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Convert a PyTorch CUDA memory snapshot into a streampool-bench trace (CSV).")
    parser.add_argument("snapshot", nargs="?", help="the pickle torch.cuda.memory._dump_snapshot() wrote")
    parser.add_argument("output", nargs="?", help="the CSV to write ('-' for stdout; gzip'd if it ends in .gz)")
    parser.add_argument("--device", type=int, default=0, help="which device's events (default 0)")
    parser.add_argument("--self-test", action="store_true", help="convert a fake snapshot and check the CSV")
    args = parser.parse_args(argv)
    if args.self_test:
        return self_test()
    if args.snapshot is None or args.output is None:
        parser.error("a snapshot and an output are required")
    try:
        run(args.snapshot, args.output, args.device)
    except (ConversionError, OSError, pickle.UnpicklingError) as error:
        print("{}: {}".format(args.snapshot, error), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
