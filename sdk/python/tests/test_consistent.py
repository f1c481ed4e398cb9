"""Restore with a coordinator: every rank resumes from the job's latest
consistent step, never from a step only some ranks committed."""

import os
import shutil
import socket
import subprocess
import tempfile
import time

import torch

import rewind


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_restore_uses_the_jobs_consistent_step(rewind_bin, start_agent, job):
    data = tempfile.mkdtemp(prefix="rewind-coord-")
    addr = f"127.0.0.1:{_free_port()}"
    log = os.path.join(data, "coordinator.log")
    # Failure detection off: its default port may be taken by another
    # cluster on the machine (a demo), and this test needs none.
    with open(log, "wb") as out:
        coord = subprocess.Popen([rewind_bin, "coordinator", "--listen", addr, "--data", os.path.join(data, "store"),
                                  "--metrics", "", "--gossip", ""], stdout=out, stderr=subprocess.STDOUT)
    try:
        agent = start_agent("--coordinator", addr, "--gossip", "")
        ranks = [rewind.Client(socket=agent.socket, job=job, rank=r, world_size=2, timeout=10) for r in (0, 1)]
        for r, c in enumerate(ranks):
            c.save(1, {"w": torch.full((4,), float(r))})
        ranks[0].save(2, {"w": torch.full((4,), 20.0)})  # rank 1 never saves step 2
        deadline = time.monotonic() + 15
        while True:  # the agent reports to the coordinator asynchronously
            try:
                if ranks[0].latest_consistent() == 1:
                    break
            except rewind.CoordinatorUnavailableError:
                pass  # still starting
            assert coord.poll() is None, f"the coordinator exited:\n{open(log).read()}"
            assert time.monotonic() < deadline, f"step 1 never became consistent; coordinator:\n{open(log).read()}"
            time.sleep(0.05)
        assert ranks[0].latest() == 2
        step, state = ranks[0].restore()
        assert step == 1
        assert torch.equal(state["w"], torch.zeros(4))
        for c in ranks:
            c.close()
    finally:
        coord.kill()
        coord.wait()
        shutil.rmtree(data, ignore_errors=True)
