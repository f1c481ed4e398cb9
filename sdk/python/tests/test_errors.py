"""Every failure is a clear RewindError subclass carrying the agent's words,
and none of them damages an earlier good checkpoint."""

import os
import pickle
import socket
import time

import grpc
import pytest
import torch

import rewind
from rewind import errors, shard


def test_no_agent(tmp_path):
    path = str(tmp_path / "none.sock")
    with pytest.raises(rewind.NoAgentError, match="does not exist") as e:
        rewind.Client(socket=path, job="j")
    assert path in str(e.value) and isinstance(e.value, rewind.RewindError)


def test_stuck_agent_hits_the_deadline(tmp_path):
    """A socket that accepts connections but never answers: the call ends
    at its timeout instead of hanging the training loop."""
    path = str(tmp_path / "stuck.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(8)
    try:
        t0 = time.monotonic()
        with pytest.raises(rewind.NoAgentError):
            rewind.Client(socket=path, job="j", timeout=0.5)
        assert time.monotonic() - t0 < 5
    finally:
        s.close()


def test_agent_dies_and_comes_back(start_agent, job):
    a = start_agent()
    with rewind.Client(socket=a.socket, job=job, timeout=5) as c:
        c.save(1, {"w": torch.ones(4)})
        a.kill()
        with pytest.raises(rewind.NoAgentError, match="agent unavailable"):
            c.save(2, {"w": torch.zeros(4)})
        a.start()  # re-indexes shared memory: step 1 survives
        step, got = c.restore()
        assert step == 1 and torch.equal(got["w"], torch.ones(4))
        c.save(2, {"w": torch.zeros(4)})
        assert c.latest() == 2


# An outage long enough that grpc's own reconnect backoff (1 s, times 1.6
# per failed attempt, +-20% jitter) has grown: counted from the first failed
# connect, its attempts fall near 1, 2.6, 5.2, 9.3 (10.9 at the latest) and
# 15.8 s (12.8 at the earliest), so a channel left to that backoff finds an
# agent back at 11 s after about 13 s at best; the client must find it at once.
OUTAGE_S = 11.0
RECOVERY_S = 2.0


def test_existing_client_recovers_promptly_after_agent_restart(start_agent, job):
    """The agent is down for seconds, the training loop's saves fail, the
    agent comes back on the same socket: the client's next save succeeds,
    without waiting out grpc's reconnect backoff."""
    a = start_agent()
    with rewind.Client(socket=a.socket, job=job, timeout=5) as c:
        c.save(1, {"w": torch.ones(4)})
        a.kill()
        down = time.monotonic()
        while time.monotonic() < down + OUTAGE_S:  # a loop saving every half second meanwhile
            with pytest.raises(rewind.NoAgentError, match="agent unavailable"):
                c.save(2, {"w": torch.zeros(4)})
            time.sleep(max(0.0, min(0.5, down + OUTAGE_S - time.monotonic())))
        a.start(probe=False)  # a gRPC probe could reconnect c for it: grpc shares connections by default
        back = time.monotonic()
        while True:
            try:
                c.save(2, {"w": torch.zeros(4)})
                break
            except rewind.NoAgentError as e:
                waited = time.monotonic() - back
                assert waited < RECOVERY_S, f"saves still fail {waited:.1f} s after the agent came back: {e}"
                time.sleep(0.05)
        waited = time.monotonic() - back
        assert waited < RECOVERY_S, f"the first save to succeed returned {waited:.1f} s after the agent came back"
        assert c.latest() == 2


def test_state_larger_than_the_budget(start_agent, job):
    a = start_agent("--budget", "1MiB")
    with rewind.Client(socket=a.socket, job=job) as c:
        c.save(1, {"small": torch.ones(1000)})
        with pytest.raises(rewind.ResourceExhaustedError) as e:
            c.save(2, {"big": torch.ones(1 << 19)})  # 2 MiB
        msg = str(e.value)
        assert "save step 2" in msg and "budget" in msg, msg
        assert c.latest() == 1  # the earlier checkpoint is untouched
        step, got = c.restore()
        assert step == 1 and torch.equal(got["small"], torch.ones(1000))


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def latest_shard(c: rewind.Client):
    """The latest committed shard, once the agent's background verifier
    has read it: a byte flipped later is for the SDK to find (the agent
    would otherwise catch it first, and restore would skip the shard)."""
    deadline = time.monotonic() + 10
    while True:
        sh = max((s for s in c.list() if s.state == rewind.ShardState.SHARD_STATE_COMMITTED), key=lambda s: s.seq)
        if sh.verified or time.monotonic() > deadline:
            return sh
        time.sleep(0.01)


@pytest.mark.parametrize("where", ["data", "header"])
def test_flipped_byte_is_corrupt_and_never_served_again(client, where):
    client.save(1, {"w": torch.arange(10000.0), "note": "one"})
    client.save(2, {"w": torch.arange(10000.0) * 2, "note": "two"})
    sh = latest_shard(client)
    assert sh.step == 2
    with open(sh.path, "rb") as f:
        h = shard.decode_header(f.read())
    flip(sh.path, h.data_start + 1234 if where == "data" else h.data_start - 50 - len(h.objects))
    with pytest.raises(rewind.CorruptError) as e:
        client.restore()
    assert "restore" in str(e.value) and ("checksum" in str(e.value) or "header" in str(e.value))
    states = {s.step: s.state for s in client.list()}
    assert states[2] == rewind.ShardState.SHARD_STATE_CORRUPT, states
    for _ in range(2):
        step, got = client.restore()
        assert step == 1 and got["note"] == "one"
    assert client.latest() == 1


def test_restore_fallback_skips_corrupt_shards(client):
    client.save(1, {"w": torch.ones(100)})
    client.save(2, {"w": torch.ones(100) * 2})
    sh = latest_shard(client)
    flip(sh.path, sh.size_bytes - 1)
    step, got = client.restore(fallback=True)
    assert step == 1 and torch.equal(got["w"], torch.ones(100))


def test_invalid_input(agent, client):
    with pytest.raises(rewind.InvalidError, match="job id"):
        rewind.Client(socket=agent.socket, job="../etc")
    with pytest.raises(rewind.InvalidError, match="rank 3 out of range"):
        rewind.Client(socket=agent.socket, job="j", rank=3, world_size=2)
    with pytest.raises(rewind.InvalidError, match="non-negative"):
        client.save(-1, {})
    with pytest.raises(rewind.InvalidError, match="save step 1 .*cannot save .*at w/0"):
        client.save(1, {"w": [object()]})
    assert client.latest() is None


def test_load_shard_of_a_corrupt_copy(client, tmp_path):
    client.save(4, {"w": torch.arange(5000.0)})
    sh = latest_shard(client)
    copy = tmp_path / "copy.safetensors"
    copy.write_bytes(open(sh.path, "rb").read())
    flip(str(copy), sh.size_bytes - 8)
    with pytest.raises(rewind.CorruptError, match="tensor 'w'.*checksum"):
        rewind.load_shard(str(copy))
    _, tensors = rewind.load_shard(str(copy), verify=False)
    assert not torch.equal(tensors["w"], torch.arange(5000.0))
    copy.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(rewind.CorruptError, match="header length"):
        rewind.load_shard(str(copy))
    os.truncate(sh.path, sh.size_bytes)  # untouched original still verifies
    assert rewind.load_state(sh.path)[0] == 4


def test_latest_consistent_needs_a_coordinator(client):
    with pytest.raises(rewind.BusyError, match="without a coordinator"):
        client.latest_consistent()


def test_gang_broken_is_its_own_error():
    """An agent's Aborted answer (the coordinator is recovering the job
    after losing a node) is GangBrokenError, carrying the step to restore,
    so a training loop can exit and be restarted rather than retry."""
    import grpc

    from rewind.errors import from_rpc

    class Aborted(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.ABORTED

        def details(self):
            return "gang broken: job j: node n3 down; restoring step 41: exit, and the job restarts from it"

    e = from_rpc("save step 42", Aborted())
    assert isinstance(e, rewind.GangBrokenError) and isinstance(e, rewind.RewindError)
    assert "restoring step 41" in str(e)


@pytest.mark.parametrize("kind", [k for k in vars(errors).values()
                                  if isinstance(k, type) and issubclass(k, rewind.RewindError)])
def test_errors_survive_pickling(kind):
    """DCP sends a rank's exception to the other ranks pickled, and
    multiprocessing a worker's: each error comes back whole, the same
    kind with the same words."""
    e = kind("save step 3 of job j rank 1", "the agent's words", grpc.StatusCode.NOT_FOUND)
    e.extra = "kept"
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is kind
    assert str(back) == str(e) == "rewind: save step 3 of job j rank 1: the agent's words"
    assert (back.op, back.message, back.code, back.extra) == (e.op, e.message, e.code, "kept")
