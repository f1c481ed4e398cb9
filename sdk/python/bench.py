#!/usr/bin/env python3
"""Blocking time of a save: rewind's client.save against torch.save.

For each size, the same state dict of float32 tensors is saved
  - with client.save into the agent's shared memory (warm: after two
    warm-up saves, so both slots are sized and mapped; before each run the
    bench waits, untimed, for the agent's background re-read of the
    previous save, which a real loop overlaps with its training step);
  - with torch.save to a file on local disk, in a directory under the
    repository (no fsync: the bytes may still be in the page cache when
    torch.save returns, which flatters torch.save; --fsync adds a row
    with an fsync inside the timing);
  - with torch.save to a file in /dev/shm;
and, as the physical limit measured in the same run, a plain copy of every
tensor into preallocated memory (torch copy_). Medians of --runs runs.

    make bench-python                        # 1GiB and 4GiB, 5 runs
    python3 sdk/python/bench.py --sizes 256MiB --runs 3

Without --socket it starts its own agent (bin/rewind, see --rewind-bin)
with its shared memory under /dev/shm and stops it at the end.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import rewind  # noqa: E402

UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_size(s: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B|)\s*", s)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {s!r} (e.g. 512MiB, 4GiB)")
    return int(float(m[1]) * UNITS[m[2]])


def human(n: float) -> str:
    for u in ("GiB", "MiB", "KiB"):
        if n >= UNITS[u]:
            return f"{n / UNITS[u]:.1f} {u}"
    return f"{n:.0f} B"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="client.save against torch.save, blocking time")
    p.add_argument("--sizes", default="1GiB,4GiB", help="comma-separated state sizes")
    p.add_argument("--runs", type=int, default=5, help="measured runs per figure (the median is printed)")
    p.add_argument("--tensors", type=int, default=64, help="tensors the state is split into")
    p.add_argument("--socket", help="use a running agent instead of starting one")
    p.add_argument("--rewind-bin", default=str(REPO / "bin" / "rewind"))
    p.add_argument("--shm-dir", default="/dev/shm")
    p.add_argument("--disk-dir", default=str(REPO), help="where the local-disk file goes (a temporary directory is made in it)")
    p.add_argument("--fsync", action="store_true", help="also time torch.save to disk followed by fsync")
    p.add_argument("--workers", type=int, default=0, help="copy threads of client.save (0: default)")
    p.add_argument("--no-agent-verify", action="store_true",
                   help="start the agent with --verify-after-commit=false (no background re-read of each save)")
    return p.parse_args()


def make_state(size: int, tensors: int) -> dict:
    n = size // 4 // tensors
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.empty(n).uniform_(-1, 1, generator=g) for i in range(tensors)}


def median_time(fn, runs: int, before=None) -> float:
    times = []
    for _ in range(runs):
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def wait_verified(client: rewind.Client, limit: float = 120) -> None:
    """Waits (untimed) until the agent has re-read the last save in the
    background, as it does during the training step that follows a save
    in a real loop; back to back, that re-read would compete with the
    next save for memory bandwidth and cores."""
    deadline = time.monotonic() + limit
    while any(s.state == rewind.ShardState.SHARD_STATE_COMMITTED and not s.verified for s in client.list()) and time.monotonic() < deadline:
        time.sleep(0.01)


def torch_save(state: dict, path: str, fsync: bool = False):
    def run():
        with open(path, "wb") as f:
            torch.save(state, f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    return run


def unlink(path: str):
    return lambda: os.path.exists(path) and os.unlink(path)


def bench_size(args, client: rewind.Client, size: int, disk: str) -> list[tuple[str, float]]:
    state = make_state(size, args.tensors)
    nbytes = sum(t.numel() * 4 for t in state.values())
    dst = {k: torch.empty_like(v) for k, v in state.items()}
    rows = [("memcpy (torch copy_, the limit)", median_time(lambda: [dst[k].copy_(v) for k, v in state.items()], args.runs))]
    dst.clear()  # the copies' memory, before the next figures
    step = iter(range(1, 1 << 30))
    for _ in range(2):  # warm-up: both slots sized and mapped
        client.save(next(step), state)
    rows.append(("client.save (warm)", median_time(lambda: client.save(next(step), state), args.runs,
                                                    lambda: wait_verified(client))))
    client.delete()
    shm_file = os.path.join(args.shm_dir, f"rewind-bench-{os.getpid()}.pt")
    rows.append(("torch.save to /dev/shm", median_time(torch_save(state, shm_file), args.runs, unlink(shm_file))))
    unlink(shm_file)()
    disk_file = os.path.join(disk, "state.pt")
    rows.append(("torch.save to local disk", median_time(torch_save(state, disk_file), args.runs, unlink(disk_file))))
    if args.fsync:
        rows.append(("torch.save to local disk + fsync",
                     median_time(torch_save(state, disk_file, True), args.runs, unlink(disk_file))))
    unlink(disk_file)()
    return [(name, t, nbytes) for name, t in rows]


def print_table(size: int, rows) -> None:
    save = next(t for name, t, _ in rows if name.startswith("client.save"))
    print(f"\nstate {human(size)} ({rows[0][2]} bytes of float32)")
    print(f"  {'method':34} {'blocking':>11} {'GB/s':>7} {'vs client.save':>15}")
    for name, t, n in rows:
        ratio = "" if name.startswith("client.save") else f"{t / save:.2f}x"
        print(f"  {name:34} {t * 1e3:9.1f} ms {n / t / 1e9:7.2f} {ratio:>15}")
    sys.stdout.flush()


class OwnAgent:
    """An agent started for the benchmark, stopped with it."""

    def __init__(self, binary: str, shm_dir: str, verify: bool):
        if not os.path.exists(binary):
            sys.exit(f"bench: {binary} not found; run `make build` or pass --rewind-bin/--socket")
        self.dir = tempfile.mkdtemp(prefix="rewind-bench-", dir=shm_dir)
        self.socket = os.path.join(self.dir, "a.sock")
        self.log = open(os.path.join(self.dir, "agent.log"), "wb")
        self.proc = subprocess.Popen([binary, "agent", "--node", "bench", "--shm-root", os.path.join(self.dir, "shm"),
                                      "--socket", self.socket, "--listen", "", "--metrics", "",
                                      f"--verify-after-commit={str(verify).lower()}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(200):
            if os.path.exists(self.socket):
                return
            time.sleep(0.05)
        sys.exit(f"bench: agent did not start; see {self.log.name}")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def main() -> int:
    args = parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    own = None if args.socket else OwnAgent(args.rewind_bin, args.shm_dir, not args.no_agent_verify)
    disk = tempfile.mkdtemp(prefix=".bench-python-", dir=args.disk_dir)
    try:
        client = rewind.Client(socket=args.socket or own.socket, job=f"bench-{os.getpid()}", rank=0, world_size=1,
                               workers=args.workers, timeout=120)
        print(f"rewind python bench: {args.runs} runs per figure (median), {args.tensors} float32 tensors, "
              f"torch {torch.__version__}, {len(os.sched_getaffinity(0))} CPUs; local disk: {disk} "
              f"({'with' if args.fsync else 'no'} fsync row), agent verify-after-commit "
              f"{('off' if args.no_agent_verify else 'on') if own else 'as configured'}")
        for size in sizes:
            print_table(size, bench_size(args, client, size, disk))
        client.close()
    finally:
        shutil.rmtree(disk, ignore_errors=True)
        if own:
            own.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
