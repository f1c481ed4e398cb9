"""Fixtures: the rewind binary, real agents on a tmpfs, clients.

The tests need a real agent. The binary is $REWIND_BIN when set (make
test-python sets it to bin/rewind), else it is built with `go build` into a
temporary directory; so is the Go shard writer of the cross-language tests,
$REWIND_GOWRITER (a root without Go, such as the trixie one, is given both). Agents run as subprocesses with their shared-memory
root under /dev/shm and are killed at the end of the test or session.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

SDK = Path(__file__).resolve().parents[1]
REPO = SDK.parents[1]
sys.path.insert(0, str(SDK))  # the package from the source tree

import rewind  # noqa: E402

SHM = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _go_build(pkg: str, out: Path) -> Path:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    subprocess.run([go, "build", "-o", str(out), pkg], cwd=REPO, check=True)
    return out


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bin")


@pytest.fixture(scope="session")
def rewind_bin(build_dir) -> str:
    if os.environ.get("REWIND_BIN"):
        return os.path.abspath(os.environ["REWIND_BIN"])
    return str(_go_build("./cmd/rewind", build_dir / "rewind"))


@pytest.fixture(scope="session")
def gowriter(build_dir) -> str:
    """The Go helper that writes shards with the Go implementation."""
    if os.environ.get("REWIND_GOWRITER"):
        return os.path.abspath(os.environ["REWIND_GOWRITER"])
    return str(_go_build("./sdk/python/tests/testdata/gowriter", build_dir / "gowriter"))


class Agent:
    """A `rewind agent` subprocess with its own socket and tmpfs root."""

    def __init__(self, binary: str, *args: str):
        self.dir = tempfile.mkdtemp(prefix="rewind-pytest-", dir=SHM)
        self.socket = os.path.join(self.dir, "a.sock")
        self.root = os.path.join(self.dir, "shm")
        self.log = os.path.join(self.dir, "agent.log")
        self.binary, self.args = binary, args
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self, probe: bool = True) -> None:
        """Starts the agent and waits until it answers: through a gRPC
        Status call, or (probe=False) until its socket accepts connections,
        for tests of how an existing client notices the agent is back (a
        probe through a new Client would share grpc's connection to the
        socket with it, and reconnect it)."""
        cmd = [self.binary, "agent", "--node", "t", "--shm-root", self.root, "--socket", self.socket,
               "--listen", "", "--metrics", "", *self.args]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}:\n{open(self.log).read()}")
            if os.path.exists(self.socket) and (self._answers() if probe else self._listens()):
                return
            time.sleep(0.05 if probe else 0.01)
        raise RuntimeError(f"agent did not answer within 20 s:\n{open(self.log).read()}")

    def _answers(self) -> bool:
        try:
            rewind.Client(socket=self.socket, job="probe", timeout=2).close()
            return True
        except rewind.NoAgentError:
            return False

    def _listens(self) -> bool:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(self.socket)  # refused while only the killed agent's socket file is there
                return True
            except OSError:
                return False

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def agent(rewind_bin):
    """One agent shared by the tests; each test uses its own job id."""
    a = Agent(rewind_bin)
    yield a
    a.close()


@pytest.fixture
def start_agent(rewind_bin):
    """Starts dedicated agents (with extra flags) for one test."""
    started = []

    def start(*args: str) -> Agent:
        a = Agent(rewind_bin, *args)
        started.append(a)
        return a

    yield start
    for a in started:
        a.close()


_jobs = itertools.count()


@pytest.fixture
def job(request) -> str:
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:80]
    return f"{name}-{os.getpid()}-{next(_jobs)}"


@pytest.fixture
def client(agent, job):
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=1, timeout=30) as c:
        yield c
