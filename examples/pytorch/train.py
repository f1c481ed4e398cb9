#!/usr/bin/env python3
"""A small real training loop that checkpoints every step with rewind.

It trains an MLP with dropout, Adam and a learning-rate schedule on
synthetic data generated in the script, saves model, optimizer, scheduler,
RNG and data-generator state after every step, and prints one line per
step with the loss. Killed and started again, it restores the last
committed step and continues; its loss sequence is then exactly that of a
run that was never interrupted.

    rewind agent --socket /tmp/rw.sock --shm-root /dev/shm/rw &
    REWIND_SOCKET=/tmp/rw.sock REWIND_JOB=demo python3 examples/pytorch/train.py --steps 100

Job, rank and socket come from the environment (REWIND_JOB, REWIND_SOCKET,
REWIND_RANK or OMPI_COMM_WORLD_RANK under an MPIJob) or from the flags.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

try:
    import rewind
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sdk", "python"))
    import rewind


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="train until this step")
    p.add_argument("--socket", default=None, help="agent socket (default: $REWIND_SOCKET or /run/rewind/agent.sock)")
    p.add_argument("--job", default=None,
                   help="job id (default: $REWIND_JOB, or NAMESPACE.NAME from $REWIND_NAMESPACE and $REWIND_JOB_NAME "
                        "as a Kubernetes pod sets them, else train-example)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep after each step (for demos)")
    return p.parse_args()


class Problem:
    """Synthetic regression: y = sin(x @ w) + noise, fresh batches drawn
    from a generator whose state is part of the checkpoint."""

    def __init__(self, seed: int, dim: int = 32):
        g = torch.Generator().manual_seed(seed)
        self.w = torch.randn(dim, 4, generator=g)
        self.gen = torch.Generator().manual_seed(seed + 1)
        self.dim = dim

    def batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, self.dim, generator=self.gen)
        y = torch.sin(x @ self.w) + 0.1 * torch.randn(n, 4, generator=self.gen)
        return x, y


def build(seed: int, dim: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(dim, 128), torch.nn.GELU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(128, 128), torch.nn.GELU(), torch.nn.Linear(128, 4))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.7)
    return model, opt, sched


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)  # one thread: the loss sequence is reproducible bit for bit
    problem = Problem(args.seed)
    model, opt, sched = build(args.seed, problem.dim)
    job = args.job
    if not job and not os.environ.get("REWIND_JOB") and not (os.environ.get("REWIND_NAMESPACE") and os.environ.get("REWIND_JOB_NAME")):
        job = "train-example"
    client = rewind.Client(socket=args.socket, job=job)
    step = 0
    if client.latest() is not None:
        step, state = client.restore(fallback=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        problem.gen.set_state(state["data_rng"])
        print(f"resumed from step {step}", flush=True)
    while step < args.steps:
        step += 1
        x, y = problem.batch(args.batch)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        # Printed before the save: every step up to the one restored has
        # been printed, a step killed after its print is simply redone.
        print(f"step {step} loss {loss.item()!r}", flush=True)
        stats = client.save(step, {
            "model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "torch_rng": torch.get_rng_state(), "data_rng": problem.gen.get_state(), "step": step})
        if step == 1 or step % 50 == 0:
            print(f"  saved {stats.bytes} bytes in {stats.total * 1e3:.2f} ms (copy {stats.copy * 1e3:.2f} ms)", flush=True)
        time.sleep(args.step_delay)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
