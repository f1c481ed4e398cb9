"""rewind.dcp with what DCP hands a storage layer beyond a model and its
optimizer: non-contiguous, 0-d and empty tensors, every common dtype,
DTensors sharded on either dimension with empty pieces, HSDP replicas,
pickled non-tensor state, ranks that write nothing; loaded at other world
sizes, in part, from an older step, by checkpoint_id (dcp_cases_worker.py).

Needs torch 2.x (make test-python-dcp runs it in a Debian trixie root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed.checkpoint.metadata", reason="needs torch 2.x")
try:
    import rewind.dcp  # noqa: F401
except ImportError as e:
    pytest.skip(f"rewind.dcp: {e}", allow_module_level=True)

import rewind  # noqa: E402
from test_dcp import gang  # noqa: E402

WORKER = Path(__file__).with_name("dcp_cases_worker.py")


def run(action: str, world: int, agent, job: str, out: Path, case: str, *flags: str) -> list[dict]:
    return gang(action, world, agent, job, out, case, *flags, worker=WORKER)


def check(results: list[dict], step: int, saved_world: int) -> None:
    for res in results:
        assert res["mismatch"] == [], res
        assert (res["loaded_step"], res["saved_world_size"]) == (step, saved_world), res


@pytest.fixture(scope="module")
def odd_saved(agent, tmp_path_factory):
    """The odd state saved at world size 4, step 3."""
    out = tmp_path_factory.mktemp("dcp-cases")
    job = f"dcp-odd-{os.getpid()}"
    run("save", 4, agent, job, out, "odd", "--step", "3")
    return job, out


@pytest.mark.parametrize("world", [4, 3, 2])
def test_odd_state_loads_at_world_size(odd_saved, agent, world):
    """Every value of the odd state, saved at world size 4, loads equal at
    4, 3 and 2."""
    job, out = odd_saved
    check(run("load", world, agent, job, out, "odd"), 3, 4)


def test_odd_state_saved_at_2_loads_at_4(agent, tmp_path):
    """Saved at world size 2 (async), loaded at 4 (HSDP on a 2-D mesh):
    a rank holds pieces of several saved ones, and some none."""
    job = f"dcp-odd2-{os.getpid()}"
    run("save", 2, agent, job, tmp_path, "odd", "--step", "5", "--async")
    check(run("load", 4, agent, job, tmp_path, "odd"), 5, 2)


def test_ranks_that_write_nothing(agent, tmp_path):
    """A lone replicated tensor goes to one rank of four: the other three
    commit shards with no items, and the step loads at 4 and 3."""
    job = f"dcp-tiny-{os.getpid()}"
    run("save", 4, agent, job, tmp_path, "tiny", "--step", "2")
    check(run("load", 4, agent, job, tmp_path, "tiny"), 2, 4)
    check(run("load", 3, agent, job, tmp_path, "tiny"), 2, 4)


def test_older_step_subset_and_checkpoint_id(agent, tmp_path):
    """Two saves in a row (by checkpoint_id rewind://JOB/step-N, then by
    Writer(step=)): the newer loads by default and by rewind://JOB, the
    older by Reader(step=) and by its checkpoint_id, and a state dict with
    only some of the saved keys loads those."""
    job = f"dcp-steps-{os.getpid()}"
    run("save", 2, agent, job, tmp_path, "odd", "--step", "4", "--id")
    run("save", 2, agent, job, tmp_path, "odd", "--step", "6")
    check(run("load", 2, agent, job, tmp_path, "odd"), 6, 2)
    check(run("load", 2, agent, job, tmp_path, "odd", "--id"), 6, 2)
    check(run("load", 2, agent, job, tmp_path, "odd", "--step", "4"), 4, 2)
    check(run("load", 3, agent, job, tmp_path, "odd", "--step", "4", "--id"), 4, 2)
    res = run("load", 3, agent, job, tmp_path, "odd", "--step", "4", "--keys", "dt/shard1_uneven,objs/step,dense/bf16")
    check(res, 4, 2)
    assert res[0]["keys"] == ["dense/bf16", "dt/shard1_uneven", "objs/step"]


def test_one_process_without_a_process_group(agent, job):
    """dcp.save and dcp.load in one process, torch.distributed not
    initialized (a notebook, a single-GPU script): the writer saves rank 0
    of 1, the reader loads it back."""
    import torch
    import torch.distributed.checkpoint as dcp

    sd = {"w": torch.arange(6.0).reshape(2, 3).t(), "n": 5, "b": torch.tensor(True)}
    md = dcp.save(sd, storage_writer=rewind.dcp.Writer(step=1, job=job, socket=agent.socket))
    assert md.storage_meta.checkpoint_id == f"rewind://{job}/step-1"
    got = {"w": torch.zeros(3, 2), "n": 0, "b": torch.tensor(False)}
    reader = rewind.dcp.Reader(job=job, socket=agent.socket)
    dcp.load(got, storage_reader=reader)
    assert reader.loaded_step == 1 and got["n"] == 5 and bool(got["b"])
    assert torch.equal(got["w"], sd["w"])



def test_reused_reader_follows_each_checkpoint_id(agent, job):
    """One Reader for several loads, as DCP's reset(checkpoint_id) allows:
    rewind://JOB/step-1 loads step 1, then rewind://JOB loads the latest
    (2), not step 1 again."""
    import torch
    import torch.distributed.checkpoint as dcp

    w = rewind.dcp.Writer(socket=agent.socket)
    for step in (1, 2):
        dcp.save({"x": torch.full((2,), float(step))}, checkpoint_id=f"rewind://{job}/step-{step}", storage_writer=w)
    r = rewind.dcp.Reader(socket=agent.socket)
    for cid, want in ((f"rewind://{job}/step-1", 1), (f"rewind://{job}", 2), (f"rewind://{job}/1", 1)):
        got = {"x": torch.zeros(2)}
        dcp.load(got, checkpoint_id=cid, storage_reader=r)
        assert (r.loaded_step, got["x"].tolist()) == (want, [float(want)] * 2), cid


def test_reused_writer_refuses_an_id_without_a_step(agent, job):
    """A Writer reused for rewind://JOB/step-1 and then given rewind://JOB
    (no step) refuses the save, as a new Writer does, rather than saving
    step 1 again over what it holds."""
    import torch
    import torch.distributed.checkpoint as dcp

    w = rewind.dcp.Writer(socket=agent.socket)
    dcp.save({"x": torch.ones(2)}, checkpoint_id=f"rewind://{job}/step-1", storage_writer=w)
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    with pytest.raises(CheckpointException, match="no step"):
        dcp.save({"x": torch.zeros(2)}, checkpoint_id=f"rewind://{job}", storage_writer=w)
    got = {"x": torch.full((2,), 7.0)}
    dcp.load(got, checkpoint_id=f"rewind://{job}/step-1", storage_reader=rewind.dcp.Reader(socket=agent.socket))
    assert got["x"].tolist() == [1.0, 1.0]


def test_save_with_a_process_group(agent, tmp_path):
    """dcp.save(..., process_group=G) by the two ranks of a subgroup of a
    gang of four (one replica group saving for all): a checkpoint of
    those two ranks, which loads at world size 2."""
    job = f"dcp-group-{os.getpid()}"
    run("save", 4, agent, job, tmp_path, "tiny", "--step", "2", "--group", "2")
    check(run("load", 2, agent, job, tmp_path, "tiny"), 2, 2)


def test_save_again_after_loading_at_another_world_size(odd_saved, agent):
    """Saved at 4 (step 3), loaded at 2, then the job goes on at 2 and
    saves step 8: step 8 loads at 2 and 3, and step 3 still at 2."""
    job, out = odd_saved
    check(run("load", 2, agent, job, out, "odd"), 3, 4)
    run("save", 2, agent, job, out, "odd", "--step", "8")
    check(run("load", 2, agent, job, out, "odd"), 8, 2)
    check(run("load", 3, agent, job, out, "odd", "--step", "8"), 8, 2)
    check(run("load", 2, agent, job, out, "odd", "--step", "3"), 3, 4)


def test_sharded_checkpoint_loads_whole_in_one_process(odd_saved, agent):
    """The odd state saved at world size 4 loads in one process without
    torch.distributed (an export for inference) into full tensors, and
    without a template (DCP's _load_state_dict_from_keys, which rebuilds
    the nesting from the metadata's planner_data)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    import dcp_cases_worker as w

    job, out = odd_saved
    ref = torch.load(out / "reference-3.pt", weights_only=False)
    sd = w.odd(1, 0, plain=True)
    dcp.load(sd, storage_reader=rewind.dcp.Reader(step=3, job=job, socket=agent.socket))
    got = {k: w.whole(v) for k, v in w.flat(sd)}
    assert sorted(got) == sorted(ref)
    assert [k for k in ref if not w.equal(ref[k], got[k])] == []
    # Every top-level key named: torch 2.6 loads nothing when keys is None.
    sd = _load_state_dict_from_keys({"dense", "dt", "objs"},
                                    storage_reader=rewind.dcp.Reader(step=3, job=job, socket=agent.socket))
    got = {k: w.whole(v) for k, v in w.flat(sd)}
    assert sorted(got) == sorted(ref)
    assert [k for k in ref if not w.equal(ref[k], got[k])] == []


def test_key_that_reads_like_a_piece_name(agent, tmp_path):
    """A DTensor w whose piece at offset 2 is rank 1's, and a plain
    tensor keyed "w@2" that DCP also gives to rank 1: both are saved, and
    each loads its own values (at 2 and at 3)."""
    job = f"dcp-at-{os.getpid()}"
    run("save", 2, agent, job, tmp_path, "at_sign", "--step", "1")
    check(run("load", 2, agent, job, tmp_path, "at_sign"), 1, 2)
    check(run("load", 3, agent, job, tmp_path, "at_sign"), 1, 2)


def test_a_ranks_failure_reaches_every_rank(agent, tmp_path):
    """One rank of three cannot reach its agent: every rank's dcp.save
    raises DCP's CheckpointException naming that rank's own error (no
    agent on its socket), rather than a pickling error on one rank and a
    collective that never ends on the others; and nothing of the step
    is committed."""
    job = f"dcp-fails-{os.getpid()}"
    res = run("save-fails", 3, agent, job, tmp_path, "tiny", "--step", "4", "--fail-rank", "1")
    for r in res:
        err = r["error"] or ""
        assert err.startswith("CheckpointException"), r
        assert "NoAgentError" in err and "no-agent.sock" in err, r
    with rewind.Client(socket=agent.socket, job=job) as c:
        assert [(s.rank, s.step) for s in c.list(job)] == []


def test_ranks_that_choose_different_steps_load_nothing(agent, tmp_path):
    """Two ranks name different steps (4 and 6), as ranks on lone agents
    may find different newest whole steps: every rank's dcp.load fails,
    naming each rank's step, rather than load a state of two steps."""
    job = f"dcp-mixed-{os.getpid()}"
    run("save", 2, agent, job, tmp_path, "tiny", "--step", "4")
    run("save", 2, agent, job, tmp_path, "tiny", "--step", "6")
    for r in run("load-mixed", 2, agent, job, tmp_path, "tiny", "--rank-steps", "4,6"):
        err = r["error"] or ""
        assert err.startswith("CheckpointException"), r
        assert "different steps" in err and "rank 0: job" in err and "step 4" in err and "step 6" in err, r
