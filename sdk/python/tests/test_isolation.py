"""Job isolation: on an agent started with --job-key, a client reaches its
own job's checkpoints with the job's token and no other job's."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import rewind


@pytest.fixture
def isolated(start_agent, rewind_bin, tmp_path):
    key = str(tmp_path / "job.key")
    subprocess.run([rewind_bin, "job-token", "--key", key, "--new"], check=True)
    agent = start_agent("--job-key", key)

    def token(job: str) -> str:
        out = subprocess.run([rewind_bin, "job-token", "--key", key, job], check=True, capture_output=True, text=True)
        return out.stdout.strip()

    return agent, token


def _state(step: int) -> dict:
    return {"w": np.arange(1000, dtype=np.float32) * step, "step": step}


def test_own_job_with_its_token(isolated, monkeypatch):
    agent, token = isolated
    # From the environment, as a launcher hands it to a rank.
    monkeypatch.setenv("REWIND_JOB_TOKEN", token("job-a"))
    with rewind.Client(socket=agent.socket, job="job-a", rank=0, world_size=1) as c:
        for step in (1, 2, 3):
            c.save(step, _state(step))
        assert not c.last_save.cold  # the third save goes into the first's slot, kept mapped
        step, st = c.restore()
        assert step == 3 and np.array_equal(st["w"], _state(3)["w"])
        assert [s.step for s in c.list()] == [2, 3]


def test_token_from_file(isolated, tmp_path, monkeypatch):
    agent, token = isolated
    path = tmp_path / "token"
    path.write_text(token("job-f") + "\n")
    monkeypatch.setenv("REWIND_JOB_TOKEN_FILE", str(path))
    with rewind.Client(socket=agent.socket, job="job-f", rank=0, world_size=1) as c:
        c.save(1, _state(1))
        assert c.restore()[0] == 1


@pytest.mark.parametrize("who", ["job A's token", "no token", "forged token"])
def test_other_job_refused(isolated, who, monkeypatch):
    agent, token = isolated
    monkeypatch.delenv("REWIND_JOB_TOKEN", raising=False)
    monkeypatch.delenv("REWIND_JOB_TOKEN_FILE", raising=False)
    with rewind.Client(socket=agent.socket, job="job-b", rank=0, world_size=1, token=token("job-b")) as b:
        b.save(1, _state(1))
    tok = {"job A's token": token("job-a"), "no token": "", "forged token": "rwj1." + "A" * 43}[who]
    why = "with no job token" if who == "no token" else "is not job job-b's"
    with rewind.Client(socket=agent.socket, job="job-b", rank=0, world_size=1, token=tok or None) as c:
        attempts = {
            "list": lambda: c.list(),
            "restore": lambda: c.restore(),
            "restore step": lambda: c.restore(step=1),
            "latest": lambda: c.latest(),
            "save": lambda: c.save(2, _state(2)),
            "delete": lambda: c.delete(),
        }
        for name, attempt in attempts.items():
            with pytest.raises(rewind.PermissionDeniedError) as e:
                attempt()
            assert why in e.value.message, (name, e.value.message)
    with rewind.Client(socket=agent.socket, job="job-b", rank=0, world_size=1, token=token("job-b")) as b:
        step, st = b.restore()
        assert step == 1 and np.array_equal(st["w"], _state(1)["w"])


def test_segments_out_of_another_users_reach(isolated):
    if os.geteuid() != 0:
        pytest.skip(f"running a process under another uid needs root; the tests run as uid {os.geteuid()}")
    agent, token = isolated
    with rewind.Client(socket=agent.socket, job="job-u", rank=0, world_size=1, token=token("job-u")) as c:
        c.save(1, _state(1))
        path = c.list()[0].path
    os.chmod(agent.dir, 0o755)  # the directory above the root open to all, as /dev/shm is
    # setpriv switches to the other uid in the child, after exec:
    # subprocess.run(user=...) forks this process, whose threads (torch's
    # OpenMP pool, once a test ran it) can leave the child hung before it
    # execs.
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    for argv in (["ls", agent.root], ["cat", path]):
        r = subprocess.run(nobody + argv, capture_output=True, text=True)
        assert r.returncode != 0 and "Permission denied" in r.stderr, (argv, r)
