"""rewind.dcp when a save fails part way, and when a step is saved
again: a rank that raises while the others commit their shards leaves
the step before as the one a load gets, and a load never returns a state
made of two saves of a step (dcp_failures_worker.py).

Needs torch 2.x (make test-python-dcp runs it in a Debian trixie root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed.checkpoint.metadata", reason="needs torch 2.x")
try:
    import rewind.dcp
except ImportError as e:
    pytest.skip(f"rewind.dcp: {e}", allow_module_level=True)

from test_dcp import gang  # noqa: E402

WORKER = Path(__file__).with_name("dcp_failures_worker.py")
KEYS = ["n", "p", "r", "w"]


def run(action: str, world: int, agent, job: str, out: Path, *flags: str) -> list[dict]:
    return gang(action, world, agent, job, out, *flags, worker=WORKER)


def saved(res: list[dict]) -> None:
    assert [r["error"] for r in res] == [None] * len(res), res


def loaded(res: list[dict], step: int, salt: int) -> None:
    """Every rank loaded step, every value of the save with salt."""
    for r in res:
        assert r["error"] is None, r
        assert (r["loaded_step"], r["salts"]) == (step, dict.fromkeys(KEYS, salt)), r


def refused_as_two_saves(res: list[dict]) -> None:
    """Every rank's load failed, naming the two saves the step's shards
    come from: no state of two saves loaded."""
    for r in res:
        assert r["error"] is not None, f"a state of two saves loaded: {r}"
        assert r["error"].startswith("CheckpointException") and "come from 2 saves" in r["error"], r


def test_a_rank_failing_mid_save_leaves_the_step_before(agent, tmp_path):
    """Step 4 saved; step 6's save fails on rank 1 of 2 in write_data
    while rank 0 commits its shard: both ranks raise DCP's
    CheckpointException naming the failure, and a load of the latest
    step gets step 4, every value, at world size 2 and 3."""
    job = f"dcp-midsave-{os.getpid()}"
    saved(run("save", 2, agent, job, tmp_path, "--step", "4", "--salt", "4"))
    for r in run("save", 2, agent, job, tmp_path, "--step", "6", "--salt", "6", "--fail-rank", "1"):
        assert (r["error"] or "").startswith("CheckpointException") and "injected failure" in r["error"], r
    with rewind.Client(socket=agent.socket, job=job) as c:  # the failure came after rank 0's commit
        assert sorted((s.rank, s.step) for s in c.list(job) if s.step == 6) == [(0, 6)]
    loaded(run("load", 2, agent, job, tmp_path), 4, 4)
    loaded(run("load", 3, agent, job, tmp_path), 4, 4)


def test_a_step_saved_again(agent, tmp_path):
    """Step 4 saved, then saved again with other values (a job that went
    back to an older step and came to 4 again): a load gets the second
    save's values on every rank, as the file system's overwrite does.
    A third save of step 4 fails on rank 1 after rank 0 committed: a
    load of step 4 then fails on every rank, naming the two saves its
    shards come from, rather than load a state of both (a DTensor whose
    rows come from two saves)."""
    job = f"dcp-again-{os.getpid()}"
    saved(run("save", 2, agent, job, tmp_path, "--step", "4", "--salt", "1"))
    saved(run("save", 2, agent, job, tmp_path, "--step", "4", "--salt", "2"))
    loaded(run("load", 2, agent, job, tmp_path), 4, 2)
    for r in run("save", 2, agent, job, tmp_path, "--step", "4", "--salt", "3", "--fail-rank", "1"):
        assert (r["error"] or "").startswith("CheckpointException"), r
    res = run("load", 2, agent, job, tmp_path)
    refused_as_two_saves(res)
    for r in res:
        # The ranks of each save are named (torch 2.6 raises the reader's
        # NotFoundError; 2.14 keeps only its message, in an AssertionError).
        assert "ranks 0:" in r["error"] and "ranks 1:" in r["error"], r


def test_a_writer_saving_again_after_a_failure(agent, tmp_path):
    """One Writer per rank saves step 4 twice with no checkpoint_id (a
    retry loop: DCP calls no reset between them), the second time with
    other values, failing on rank 1 after rank 0 committed: each save has
    its own id, so a load of step 4 fails on every rank naming the two
    saves, rather than load rank 0's rows of the second save beside rank
    1's of the first."""
    job = f"dcp-retry-{os.getpid()}"
    for r in run("save-twice", 2, agent, job, tmp_path, "--step", "4", "--salt", "1", "--salt2", "2",
                 "--fail-rank", "1"):
        assert r["error"] is None, r
        assert (r["error2"] or "").startswith("CheckpointException") and "injected failure" in r["error2"], r
    refused_as_two_saves(run("load", 2, agent, job, tmp_path))


def test_a_rank_given_an_earlier_saves_plan(agent, tmp_path):
    """The second save of step 4 through one Writer per rank, where rank
    1's planner gives the first save's plan again (DCP's plan caching,
    DefaultSavePlanner(enable_plan_caching=True), does so for a rank whose
    local plan did not change): that plan carries the first save's id, so
    rank 1 refuses it before writing, the save fails on every rank, and a
    load of step 4 is refused rather than mix the two saves."""
    job = f"dcp-stale-{os.getpid()}"
    for r in run("save-twice", 2, agent, job, tmp_path, "--step", "4", "--salt", "1", "--salt2", "2",
                 "--stale-rank", "1"):
        assert r["error"] is None, r
        assert (r["error2"] or "").startswith("CheckpointException") and "an earlier save" in r["error2"], r
    refused_as_two_saves(run("load", 2, agent, job, tmp_path))


def test_ranks_saving_without_a_process_group(agent, tmp_path):
    """Three processes without torch.distributed (each DCP's coordinator
    of its own save, its rank REWIND_RANK) save step 4, each its own keys:
    every process loads every key, at step 4, in the same way (their
    shards carry no save id, as none is shared)."""
    job = f"dcp-alone-{os.getpid()}"
    saved(run("save-alone", 3, agent, job, tmp_path, "--step", "4", "--salt", "3"))
    for r in run("load-alone", 3, agent, job, tmp_path):
        assert r["error"] is None, r
        assert r["loaded_step"] == 4 and set(r["salts"].values()) == {3} and len(r["salts"]) == 6, r


def test_ranks_reading_two_saves_of_a_step(agent, tmp_path):
    """Step 4 saved; while it is loaded, another save of step 4 commits
    after rank 0 read the step's shard headers and before rank 1 did:
    each rank's set of shards is of one save, but not of the same one.
    The load is refused in its plan, on every rank, before any rank reads
    a byte, naming the two saves (a rank reading a shard that changed
    after its read_metadata would fail later, in read_data)."""
    job = f"dcp-race-{os.getpid()}"
    saved(run("save", 2, agent, job, tmp_path, "--step", "4", "--salt", "4"))
    for r in run("load-racing", 2, agent, job, tmp_path, "--step", "4"):
        assert r["error"] is not None, f"a state of two saves loaded: {r}"
        assert r["error"].startswith("CheckpointException") and "2 different sets of its shards" in r["error"], r
        assert "ranks 0: save" in r["error"] and "ranks 1: save" in r["error"], r


def test_agent_killed_mid_save(start_agent, monkeypatch, tmp_path):
    """Step 4 saved; during step 6's save the agent exits at a rank's
    commit (fault point agent/shard-copied, the fourth commit; the other
    rank's commit may be done or cut off with it): every rank's dcp.save
    raises, and the restarted agent, which re-indexes its shared memory,
    serves step 4 as the latest, every value, at world size 2 and 3."""
    monkeypatch.setenv("REWIND_FAULTS", "agent/shard-copied=3*off->exit(9)")
    a = start_agent("--fault-injection")
    monkeypatch.delenv("REWIND_FAULTS")
    job = f"dcp-agentdies-{os.getpid()}"
    saved(run("save", 2, a, job, tmp_path, "--step", "4", "--salt", "4"))
    for r in run("save", 2, a, job, tmp_path, "--step", "6", "--salt", "6"):
        assert (r["error"] or "").startswith("CheckpointException"), r
    assert a.proc is not None and a.proc.wait(timeout=30) == 9  # it exited at the fault point, not later
    a.start()
    with rewind.Client(socket=a.socket, job=job) as c:
        steps = sorted((s.rank, s.step) for s in c.list(job) if s.state == rewind.ShardState.SHARD_STATE_COMMITTED)
    # The agent exited at the second rank's commit of step 6; the first
    # rank's, running beside it, may or may not have been recorded.
    assert (0, 4) in steps and (1, 4) in steps and len([s for s in steps if s[1] == 6]) <= 1, steps
    loaded(run("load", 2, a, job, tmp_path), 4, 4)
    loaded(run("load", 3, a, job, tmp_path), 4, 4)
