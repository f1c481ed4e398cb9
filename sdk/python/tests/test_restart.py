"""A rank's client across the life of its node agent: the agent killed and
started again on the same shared memory between a save's Prepare and its
Commit, or while a restore reads. The save in flight fails with a clear
error, the client's next save succeeds (its kept mappings still name the
right segments), and the step before stays restorable, bit-identical."""

import pytest
import torch

import rewind
from rewind import shard

from test_roundtrip import assert_same


def state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(300, 70, generator=g), "ids": torch.randint(0, 1 << 30, (513,), generator=g),
            "empty": torch.zeros(0, 4), "step": step}


def committed(c: rewind.Client) -> dict:
    """step -> verified, of the client's rank's committed shards."""
    return {s.step: s.verified for s in c.list() if s.state == rewind.ShardState.SHARD_STATE_COMMITTED}


@pytest.mark.parametrize("back_before_commit", [False, True], ids=["down-at-commit", "restarted-before-commit"])
def test_agent_killed_between_prepare_and_commit(start_agent, job, back_before_commit):
    a = start_agent()
    with rewind.Client(socket=a.socket, job=job, timeout=5) as c:
        for step in (1, 2):  # both slots mapped and kept by the client
            c.save(step, state(step))
        call = c._call

        def dying(op, method, req, timeout=None):
            if method == "Commit":  # the copy into the segment is done
                a.kill()
                if back_before_commit:
                    a.start(probe=False)
            return call(op, method, req, timeout)

        c._call = dying
        with pytest.raises((rewind.NoAgentError, rewind.BusyError)) as e:
            c.save(3, state(3))
        c._call = call
        assert "save step 3" in str(e.value)
        if not back_before_commit:
            a.start(probe=False)
        # The restarted agent re-indexed step 2 (checked in full) and not
        # the abandoned save of step 3.
        assert c.latest() == 2
        assert committed(c) == {2: True}
        step, got = c.restore()
        assert step == 2
        assert_same(got, state(2))
        c.save(3, state(3))
        c.save(4, state(4))
        for s in (4, 3):
            step, got = c.restore(step=s)
            assert step == s
            assert_same(got, state(s))


def test_agent_killed_while_a_restore_reads(start_agent, job, monkeypatch):
    a = start_agent()
    with rewind.Client(socket=a.socket, job=job, timeout=5) as c:
        for step in (1, 2):
            c.save(step, state(step))
        copy_out = shard.copy_out

        def dying(*args, **kwargs):  # the shard is leased and mapped
            a.kill()
            return copy_out(*args, **kwargs)

        monkeypatch.setattr(shard, "copy_out", dying)
        step, got = c.restore()
        monkeypatch.setattr(shard, "copy_out", copy_out)
        assert step == 2
        assert_same(got, state(2))  # read from the mapping the lease gave
        a.start(probe=False)
        c.save(3, state(3))
        for s in (3, 2):
            step, got = c.restore(step=s)
            assert_same(got, state(s))


def test_many_small_and_empty_tensors_survive_a_restart(start_agent, job):
    """A shard of thousands of tiny tensors and empty ones, written by
    Python: the restarted agent re-checks every checksum (in Go) before it
    serves the shard again."""
    a = start_agent()
    many = {f"t{i}": torch.full((i % 3,), i, dtype=torch.int32) for i in range(5000)}
    many["nothing"] = torch.zeros(0, dtype=torch.bfloat16)
    with rewind.Client(socket=a.socket, job=job, timeout=30) as c:
        c.save(1, many)
        a.kill()
        a.start()
        assert committed(c) == {1: True}
        step, got = c.restore()
        assert step == 1
        assert_same(got, many)


def test_agent_restarted_between_a_restores_open_and_its_read(start_agent, job, monkeypatch):
    """The agent restarts after it leased the shard to the restore and
    before it passed its descriptor: the new agent does not know the
    lease. The checkpoint is there, so the restore must not say there is
    none (a training loop would start again from step 0): it opens the
    shard again."""
    a = start_agent()
    with rewind.Client(socket=a.socket, job=job, timeout=5) as c:
        for step in (1, 2):
            c.save(step, state(step))
        sock_open = c._segsock.open
        restarts = []

        def restarted(op, req, timeout):
            if req.WhichOneof("grant") == "lease" and not restarts:
                restarts.append(1)
                a.kill()
                a.start()
            return sock_open(op, req, timeout)

        monkeypatch.setattr(c._segsock, "open", restarted)
        step, got = c.restore()
        assert restarts and step == 2
        assert_same(got, state(2))
