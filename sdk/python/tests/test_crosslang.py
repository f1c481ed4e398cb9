"""Python and Go read each other's shards; a shard copied out of shared
memory loads without any agent."""

import json
import shutil
import subprocess

import numpy as np
import torch

import rewind

from test_golden import SPECS, fill


def committed(c: rewind.Client):
    return max((s for s in c.list() if s.state == rewind.ShardState.SHARD_STATE_COMMITTED), key=lambda s: s.seq)


def test_python_shard_verifies_with_go(client, rewind_bin, tmp_path):
    gen = torch.Generator().manual_seed(3)
    st = {"w": torch.randn(700_000, generator=gen), "h": torch.randn(33, generator=gen).half(),
          "b": torch.randn(9, generator=gen).bfloat16(), "m": torch.rand(4, generator=gen) > 0.5,
          "ids": torch.arange(5), "z": torch.zeros(0), "np": np.arange(3, dtype=np.uint32), "note": "ü<&>"}
    client.save(11, st)
    path = committed(client).path
    out = subprocess.run([rewind_bin, "inspect", "--verify", path], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "every checksum matches" in out.stdout
    js = subprocess.run([rewind_bin, "inspect", "--json", "--verify", path], capture_output=True, text=True, check=True)
    doc = json.loads(js.stdout)
    assert "step" in js.stdout and "11" in js.stdout, doc

    # A file copied out of /dev/shm, read without any agent.
    copy = tmp_path / "shard.safetensors"
    shutil.copyfile(path, copy)
    h, tensors = rewind.load_shard(str(copy))
    assert h.meta == rewind.ShardMeta(client.job, 0, 1, 11)
    assert torch.equal(tensors["w"], st["w"]) and torch.equal(tensors["b"], st["b"])
    assert isinstance(tensors["np"], torch.Tensor) or isinstance(tensors["np"], np.ndarray)
    step, state = rewind.load_state(str(copy))
    assert step == 11 and state["note"] == "ü<&>" and isinstance(state["np"], np.ndarray)
    assert torch.equal(state["m"], st["m"]) and state["z"].shape == (0,)


def test_go_sdk_shard_restores_in_python(agent, job, gowriter):
    subprocess.run([gowriter, "save", agent.socket, job], check=True)
    with rewind.Client(socket=agent.socket, job=job) as c:
        step, state = c.restore()
    assert step == 5
    assert state["__objects__"] == {"from": "go", "step": 5}
    for k, (name, dtype, shape) in enumerate(SPECS):
        t = state[name]
        assert tuple(t.shape) == shape, name
        want = fill(k, rewind.format.dtypes.num_bytes(dtype, shape))
        if dtype == "BOOL":  # gowriter's bytes are not 0/1: compare truth values
            assert t.reshape(-1).tolist() == [b != 0 for b in want], name
            continue
        arr = t if isinstance(t, np.ndarray) else t.contiguous().reshape(-1).view(torch.uint8).numpy()
        assert arr.tobytes() == want, name
