"""Client.save_tensors (named tensors with chunk records, as rewind.dcp
stores DCP's items) and Client.open_shard (any rank's shard of the job)."""

import json

import numpy as np
import pytest
import torch

import rewind


def test_save_tensors_and_open_from_another_rank(agent, job):
    w = torch.arange(6.0).reshape(2, 3).requires_grad_()
    raw = np.frombuffer(b"\x00\x01 bytes", dtype=np.uint8)
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=2) as r0, \
            rewind.Client(socket=agent.socket, job=job, rank=1, world_size=2) as r1:
        r0.save_tensors(3, {"w@2,0": w, "b": raw}, objects=b'{"k":1}',
                        chunks={"w@2,0": {"global_shape": [4, 3], "offsets": [2, 0]}})
        with r1.open_shard(0, 3) as sh:
            assert sh.header.meta == rewind.ShardMeta(job, 0, 2, 3)
            assert sh.header.tensor("w@2,0").chunk == {"global_shape": [4, 3], "offsets": [2, 0]}
            assert sh.header.tensor("b").chunk is None and json.loads(sh.header.objects) == {"k": 1}
            sh.verify(["w@2,0", "b"])
            assert torch.equal(sh.view("w@2,0").view(2, 3), w.detach())
            assert bytes(sh.raw("b")) == raw.tobytes()
        with pytest.raises(rewind.NotFoundError):
            r1.open_shard(0, 4)


def test_open_shard_verify_finds_a_flipped_byte(agent, job):
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=1) as c:
        c.save_tensors(1, {"x": torch.ones(1 << 18)})
        sh = c.list()[0]
        # Opened before the byte flips: the agent's own background check
        # may find it first, and then serves the shard no more.
        with c.open_shard(0, 1) as opened, pytest.raises(rewind.CorruptError, match="checksum"):
            with open(sh.path, "r+b") as f:
                f.seek(sh.size_bytes - 5)
                f.write(b"\x7f")
            opened.verify(["x"])
        with pytest.raises(rewind.RewindError):  # the agent was told: it serves that shard no more
            c.open_shard(0, 1).close()


@pytest.mark.parametrize("chunk", [
    {"global_shape": [3], "offsets": [2]},  # the piece (2 rows) does not fit at 2 of 3
    {"global_shape": [4, 3], "offsets": [0]},  # dimensions disagree
    {"offsets": [0]},
])
def test_bad_chunk_records_are_invalid(agent, job, chunk):
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=1) as c:
        with pytest.raises(rewind.InvalidError, match="chunk|does not fit"):
            c.save_tensors(1, {"x": torch.ones(2)}, chunks={"x": chunk})
