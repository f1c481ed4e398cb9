"""DCP save through rewind.dcp.Writer against DCP's FileSystemWriter.

    python3 bench_dcp.py --rewind-bin bin/rewind --world 4 --mib 256 --runs 5

Starts a rewind agent (its shared memory under /dev/shm) and a gang of
--world gloo processes on the CPU. Each rank holds its Shard(0) pieces of
eight float32 DTensors, --mib MiB in all (the global state), and in every
run saves the same state with dcp.save three ways, in turn: rewind.dcp.Writer,
FileSystemWriter to a directory in /dev/shm, FileSystemWriter to a
directory on local disk (--disk-dir; DCP's defaults: one file per rank,
fsync), after two untimed warm-up saves of each kind (so that both of a
rank's slots are sized and mapped, as in every save after a job's first
two). A save's time runs from a barrier before it to the last rank done;
between runs, untimed, the agent finishes its background re-read of the
last save (a training loop overlaps it with its next step).
Then dcp.async_save through the writer and through FileSystemWriter to
/dev/shm (DCP's own staging): how long each call blocks the loop, and the
time to its future's completion. A second and third gang
load the last rewind step with rewind.dcp.Reader at the same world size
and at world size - 1 (resharding: every rank reads pieces of several
saved ranks). Medians over --runs; a table for docs/performance.md.

With --device cuda each rank holds its pieces on its own GPU (NCCL), and
every writer's save includes the copies to host memory.

Needs torch 2.x (make bench-dcp runs it in the trixie root).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SDK = os.path.dirname(os.path.abspath(__file__))
TENSORS = 8
COLS = 1024


def worker(args) -> None:
    import faulthandler

    faulthandler.dump_traceback_later(float(os.environ.get("BENCH_DCP_HANG_S", "600")), exit=True)  # a hung gang prints where, and ends
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    sys.path.insert(0, SDK)
    import rewind.dcp

    backend = "gloo"
    if args.device == "cuda":  # one GPU per rank, NCCL between them
        torch.cuda.set_device(args.rank % torch.cuda.device_count())
        backend = "cpu:gloo,cuda:nccl"  # dcp.async_save needs a CPU backend beside NCCL
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank, world_size=args.world)
    mesh = init_device_mesh(args.device, (args.world,))
    rows = max(1, args.mib * (1 << 20) // 4 // COLS // args.tensors)
    g = torch.Generator().manual_seed(1)
    sd = {f"layer{i}.weight": distribute_tensor(torch.randn(rows, COLS, generator=g).to(args.device), mesh, [Shard(0)])
          for i in range(args.tensors)}
    sd["step"] = 0
    times: dict[str, list[float]] = {}

    def timed(name, fn):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        times.setdefault(name, []).append(time.perf_counter() - t0)

    def settle():
        """Untimed: the agent's background re-read of the last saves is
        done (a real loop overlaps it with its training step)."""
        if args.rank == 0:
            c = rewind.dcp._client(None, None, 60)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and any(
                    s.state == rewind.ShardState.SHARD_STATE_COMMITTED and not s.verified for s in c.list()):
                time.sleep(0.01)
        dist.barrier()

    if args.action == "save":
        for warm in range(2):  # both slots of every rank sized and mapped; DCP's imports and caches warm
            dcp.save(sd, storage_writer=rewind.dcp.Writer(step=1000 + warm))
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(os.path.join(args.shm_dir, "warm")))
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(os.path.join(args.disk_dir, "warm")))
        settle()
        for run in range(args.runs):
            shm_dir = os.path.join(args.shm_dir, f"r{run}")
            disk_dir = os.path.join(args.disk_dir, f"r{run}")
            timed("rewind", lambda: dcp.save(sd, storage_writer=rewind.dcp.Writer(step=2000 + run)))
            last = rewind.dcp._client(None, None, 60).last_save
            times.setdefault("rewind_write", []).append(last.total if last else float("nan"))
            settle()
            timed("fs_shm", lambda: dcp.save(sd, storage_writer=dcp.FileSystemWriter(shm_dir)))
            timed("fs_disk", lambda: dcp.save(sd, storage_writer=dcp.FileSystemWriter(disk_dir)))
            dist.barrier()
            if args.rank == 0:  # only the newest copy is kept, as a checkpointer keeps few
                shutil.rmtree(shm_dir, ignore_errors=True)
                shutil.rmtree(disk_dir, ignore_errors=True)
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(os.path.join(args.shm_dir, "load")))  # for the loads
        for run in range(args.runs):
            settle()
            dist.barrier()
            t0 = time.perf_counter()
            fut = dcp.async_save(sd, storage_writer=rewind.dcp.Writer(step=3000 + run))
            times.setdefault("async_blocked", []).append(time.perf_counter() - t0)
            fut.result()
            times.setdefault("async_total", []).append(time.perf_counter() - t0)
            # The same through FileSystemWriter to /dev/shm: DCP's own
            # staging, what a storage that does not stage gets.
            dist.barrier()
            t0 = time.perf_counter()
            fut = dcp.async_save(sd, storage_writer=dcp.FileSystemWriter(os.path.join(args.shm_dir, f"a{run}")))
            times.setdefault("fs_async_blocked", []).append(time.perf_counter() - t0)
            fut.result()
            times.setdefault("fs_async_total", []).append(time.perf_counter() - t0)
            dist.barrier()
            if args.rank == 0:
                shutil.rmtree(os.path.join(args.shm_dir, f"a{run}"), ignore_errors=True)
    else:
        for _ in range(args.runs):
            timed("load", lambda: dcp.load(sd, storage_reader=rewind.dcp.Reader()))
            timed("fs_load", lambda: dcp.load(sd, storage_reader=dcp.FileSystemReader(os.path.join(args.shm_dir, "load"))))
    worst = {k: [max(x) for x in zip(*_gather(dist, v))] for k, v in times.items()}
    if args.rank == 0:
        with open(args.out, "w") as f:
            json.dump(worst, f)
    dist.barrier()
    # Not destroy_process_group: with gloo it sometimes never returns on
    # one rank after the others have gone. Everything is written.
    os._exit(0)


def _gather(dist, v):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, v)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gang(args, action: str, world: int, env: dict, out: str) -> dict:
    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", action, "--rank", str(r), "--world", str(world),
                               "--port", str(port), "--mib", str(args.mib), "--runs", str(args.runs), "--out", out,
                               "--shm-dir", args.shm_dir, "--disk-dir", args.disk_dir, "--device", args.device,
                               "--tensors", str(args.tensors)], env=env)
             for r in range(world)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"bench_dcp: {action} at world size {world}: exit codes {codes}")
    with open(out) as f:
        return json.load(f)


def start_agent(binary: str, root: str) -> tuple[subprocess.Popen, str]:
    sock = os.path.join(root, "a.sock")
    log = open(os.path.join(root, "agent.log"), "wb")
    p = subprocess.Popen([binary, "agent", "--node", "bench", "--shm-root", os.path.join(root, "shm"), "--socket", sock,
                          "--listen", "", "--metrics", ""], stdout=log, stderr=subprocess.STDOUT)
    sys.path.insert(0, SDK)
    import rewind

    for _ in range(400):  # 20 s
        if p.poll() is not None:
            raise SystemExit(f"bench_dcp: agent exited with {p.returncode}")
        try:
            rewind.Client(socket=sock, job="probe", timeout=2).close()
            return p, sock
        except rewind.NoAgentError:
            time.sleep(0.05)
    p.kill()
    raise SystemExit("bench_dcp: the agent did not answer within 20 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rewind-bin", default=os.path.join(SDK, "..", "..", "bin", "rewind"))
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--mib", type=int, default=256, help="global state in MiB")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tensors", type=int, default=TENSORS, help="Shard(0) DTensors the state is split into")
    ap.add_argument("--disk-dir", default="/var/tmp")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the state lives: cuda puts each rank on its own GPU (NCCL; --world at most the GPUs)")
    ap.add_argument("--worker", dest="action")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--port", type=int)
    ap.add_argument("--out")
    ap.add_argument("--shm-dir")
    args = ap.parse_args()
    if args.action:
        worker(args)
        return
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < args.world:
            raise SystemExit(f"bench_dcp: --device cuda needs {args.world} GPUs (one per rank); "
                             f"this machine has {torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    root = tempfile.mkdtemp(prefix="rewind-bench-dcp-", dir="/dev/shm")
    args.shm_dir = os.path.join(root, "fs")
    args.disk_dir = tempfile.mkdtemp(prefix="rewind-bench-dcp-", dir=args.disk_dir)
    agent, sock = start_agent(args.rewind_bin, root)
    try:
        env = dict(os.environ, REWIND_SOCKET=sock, REWIND_JOB=f"bench-dcp-{os.getpid()}", USE_LIBUV="0",
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        out = os.path.join(root, "out.json")
        saves = gang(args, "save", args.world, env, out)
        load_same = gang(args, "load", args.world, env, out)
        load_other = gang(args, "load", args.world - 1, env, out) if args.world > 1 else None
    finally:
        agent.kill()
        agent.wait()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(args.disk_dir, ignore_errors=True)
    report(args, saves, load_same, load_other)


def report(args, saves: dict, load_same: dict, load_other: dict | None) -> None:
    gb = args.mib * (1 << 20) / 1e9
    med = {k: statistics.median(v) for k, v in saves.items()}
    print(f"dcp.save of {args.mib} MiB ({args.tensors} Shard(0) float32 DTensors, on {args.device}) at world size {args.world}, "
          f"medians of {args.runs} (load average {os.getloadavg()[0]:.1f}):")
    print("| writer | save | GB/s | rewind faster by |")
    print("| --- | --- | --- | --- |")
    for k, label in (("rewind", "`rewind.dcp.Writer`"), ("fs_shm", "`FileSystemWriter`, /dev/shm"),
                     ("fs_disk", "`FileSystemWriter`, local disk")):
        print(f"| {label} | {med[k] * 1e3:.0f} ms | {gb / med[k]:.2f} | {med[k] / med['rewind']:.1f}x |")
    print(f"| of which the rank's shard written and committed (`save_tensors`) | {med['rewind_write'] * 1e3:.0f} ms | "
          f"{gb / args.world / med['rewind_write']:.2f} per rank | |")
    print(f"| `dcp.async_save`, rewind | blocks {med['async_blocked'] * 1e3:.0f} ms | "
          f"done after {med['async_total'] * 1e3:.0f} ms | |")
    print(f"| `dcp.async_save`, `FileSystemWriter`, /dev/shm (DCP's staging) | blocks {med['fs_async_blocked'] * 1e3:.0f} ms | "
          f"done after {med['fs_async_total'] * 1e3:.0f} ms | {med['fs_async_blocked'] / med['async_blocked']:.2f} of rewind's block |")
    same, fs_same = statistics.median(load_same["load"]), statistics.median(load_same["fs_load"])
    print(f"| `dcp.load`, rewind, world size {args.world} | {same * 1e3:.0f} ms | {gb / same:.2f} | {fs_same / same:.1f}x |")
    print(f"| `dcp.load`, `FileSystemReader`, /dev/shm, world size {args.world} | {fs_same * 1e3:.0f} ms | {gb / fs_same:.2f} | |")
    if load_other is not None:
        other, fs_other = statistics.median(load_other["load"]), statistics.median(load_other["fs_load"])
        print(f"| `dcp.load`, rewind, world size {args.world - 1} (resharding) | {other * 1e3:.0f} ms | "
              f"{gb / other:.2f} | {fs_other / other:.1f}x; {same / other:.2f} of same size |")
        print(f"| `dcp.load`, `FileSystemReader`, /dev/shm, world size {args.world - 1} | {fs_other * 1e3:.0f} ms | "
              f"{gb / fs_other:.2f} | |")
    print("runs (s):", json.dumps({k: [round(x, 4) for x in v] for k, v in saves.items()}))


if __name__ == "__main__":
    main()
