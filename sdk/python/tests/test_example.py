"""examples/pytorch/train.py, SIGKILLed mid-training and started again,
continues with exactly the loss sequence of an uninterrupted run."""

import os
import re
import signal
import subprocess
import sys

from conftest import REPO

TRAIN = REPO / "examples" / "pytorch" / "train.py"
STEPS = 30
LINE = re.compile(r"step (\d+) loss (\S+)$")


def env_for(agent, job):
    env = dict(os.environ, REWIND_SOCKET=agent.socket, REWIND_JOB=job, PYTHONUNBUFFERED="1")
    for k in ("REWIND_RANK", "REWIND_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "RANK", "WORLD_SIZE"):
        env.pop(k, None)
    return env


def losses(text: str) -> dict[int, str]:
    return {int(m[1]): m[2] for m in map(LINE.match, text.splitlines()) if m}


def run(agent, job, *extra) -> str:
    out = subprocess.run([sys.executable, str(TRAIN), "--steps", str(STEPS), *extra], env=env_for(agent, job),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def run_and_kill(agent, job, kill_after: int) -> str:
    p = subprocess.Popen([sys.executable, str(TRAIN), "--steps", str(STEPS), "--step-delay", "0.02"],
                         env=env_for(agent, job), stdout=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in p.stdout:
            lines.append(line)
            m = LINE.match(line.strip())
            if m and int(m[1]) >= kill_after:
                p.send_signal(signal.SIGKILL)
                break
    finally:
        p.kill()
        p.wait()
    assert p.returncode == -signal.SIGKILL
    return "".join(lines)


def test_kill_and_resume_matches_uninterrupted_run(agent, job):
    reference = losses(run(agent, job + "-ref"))
    assert sorted(reference) == list(range(1, STEPS + 1))
    assert len(set(reference.values())) > STEPS // 2  # it does train

    first = run_and_kill(agent, job, kill_after=12)
    second = run(agent, job)
    resumed = re.search(r"resumed from step (\d+)", second)
    assert resumed, second
    at = int(resumed[1])
    before, after = losses(first), losses(second)
    assert 11 <= at <= max(before), (at, sorted(before))
    assert sorted(after) == list(range(at + 1, STEPS + 1))
    merged = {**{s: v for s, v in before.items() if s <= at}, **after}
    assert merged == reference
    for s in set(before) & set(after):  # a step redone after the kill
        assert before[s] == after[s]
