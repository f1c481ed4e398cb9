"""The Python format and checksum agree with the Go ones, byte for byte.

tests/testdata/gowriter writes a shard with shm.NewLayout and shm.CopyAndSum
from a fixed set of tensors; here the same set goes through rewind.format
and rewind.checksum and must give the identical file.
"""

import struct
import subprocess

import numpy as np
import pytest

from rewind import checksum, copier, shard
from rewind import format as fmt

# The same set as gowriter's specs, in the same order.
SPECS = [
    ("a/weight", "F32", (3, 5)),
    ('b<&>"q"\\', "U8", (7,)),
    ("ctrl\n\t\x01\x7f", "I16", (2, 2)),
    ("ünï\u2028\u2029", "BF16", (9,)),
    ("empty", "F64", (0, 4)),
    ("scalar", "I64", ()),
    ("big", "F32", (655360,)),
    ("flag", "BOOL", (5,)),
    ("half", "F16", (3,)),
    ("i8", "I8", (4,)),
    ("i32", "I32", (6,)),
    ("u32", "U32", (2,)),
]
CHUNKS = {  # gowriter's chunks
    "a/weight": {"global_shape": [6, 5], "offsets": [3, 0]},
    'b<&>"q"\\': {"global_shape": [20], "offsets": [13]},
    "scalar": {"global_shape": [], "offsets": []},
}
OBJECTS = b'{"format":"go-test","s":"<a&b>\\n\\u2028 \xc3\xbc","n":[1,2.5,null,true]}'


def fill(k: int, n: int) -> bytes:
    i = np.arange(n, dtype=np.int64)
    return ((i * 31 + k * 7 + (i >> 9)) & 0xFF).astype(np.uint8).tobytes()


def python_shard() -> tuple[bytes, str]:
    specs = [fmt.TensorInfo(n, d, s, chunk=CHUNKS.get(n)) for n, d, s in SPECS]
    layout = fmt.Layout(fmt.ShardMeta("golden", 1, 4, 42), specs, OBJECTS)
    data = {n: fill(k, fmt.dtypes.num_bytes(d, s)) for k, (n, d, s) in enumerate(SPECS)}
    buf = bytearray(layout.size)
    for i, t in enumerate(layout.tensors):
        buf[layout.data_start + t.begin : layout.data_start + t.end] = data[t.name]
        layout.set_sum(i, checksum.tree_sum(data[t.name]))
    buf[: layout.data_start] = layout.header
    return bytes(buf), layout.header_sum()


@pytest.fixture(scope="module")
def go_shard(gowriter, tmp_path_factory):
    path = tmp_path_factory.mktemp("golden") / "go.safetensors"
    out = subprocess.run([gowriter, "file", str(path)], check=True, capture_output=True, text=True)
    return path.read_bytes(), out.stdout.strip()


def test_python_writes_the_go_bytes(go_shard):
    go_bytes, go_header_sum = go_shard
    py_bytes, py_header_sum = python_shard()
    assert py_header_sum == go_header_sum
    assert len(py_bytes) == len(go_bytes)
    n = struct.unpack_from("<Q", go_bytes)[0] + 8
    assert py_bytes[8:n].decode() == go_bytes[8:n].decode()  # a readable diff first
    assert py_bytes == go_bytes


def test_python_decodes_and_verifies_the_go_shard(go_shard):
    buf = go_shard[0]
    h = shard.decode_header(buf)
    assert h.meta == fmt.ShardMeta("golden", 1, 4, 42)
    assert h.objects == OBJECTS.decode()
    assert h.data_start % fmt.ALIGNMENT == 0
    assert {t.name for t in h.tensors} == {n for n, _, _ in SPECS}
    shard.verify(h, buf)
    big = h.tensor("big")
    assert checksum.num_leaves(big.nbytes) == 3
    assert {t.name: t.chunk for t in h.tensors if t.chunk is not None} == CHUNKS


def test_copy_and_sum_matches_sequential_sum():
    """The threaded leaf-by-leaf pass gives the same sums as tree_sum."""
    src = np.random.default_rng(1).integers(0, 255, size=(21 << 20) + 123, dtype=np.uint8)
    dst = bytearray(len(src) + 4096)
    mv = memoryview(dst)
    srcmv = memoryview(src)
    cuts = [0, 5, 5, (3 << 20) + 1, 12 << 20, len(src)]

    def leaf_copier(lo):
        def copy(a, b):
            mv[4096 + lo + a : 4096 + lo + b] = srcmv[lo + a : lo + b]
        return copy

    ts = [copier.Transfer(4096 + lo, hi - lo, copy_leaf=leaf_copier(lo)) for lo, hi in zip(cuts, cuts[1:])]
    sums = copier.copy_and_sum(mv, ts, workers=3)
    assert bytes(mv[4096:]) == src.tobytes()
    assert sums == [checksum.tree_sum(srcmv[lo:hi]) for lo, hi in zip(cuts, cuts[1:])]


def test_empty_checksum_is_hash_of_no_leaves():
    assert checksum.tree_sum(b"") == checksum.xxhash.xxh3_64_intdigest(b"")


@pytest.mark.parametrize("s", ["plain", "<&>", "a\"b\\c", "\x00\x1f\x7f", "\b\f\n\r\t", "ü\u2028\u2029", "\ud800x"])
def test_go_quote_is_valid_json(s):
    import json

    q = fmt.go_quote(s)
    assert q.isascii() or not any(c in q for c in "<>&\u2028\u2029")
    assert json.loads(q) == s.replace("\ud800", "\ufffd")


def test_header_finds_tensors_by_name_as_its_list_changes():
    """Header.tensor indexes the names of its list; the list replaced or
    grown (shard.decode assigns it after construction) is indexed anew."""
    ts = [fmt.TensorInfo(f"t{i}", "F32", (2,)) for i in range(1000)]
    h = fmt.Header(meta=None, tensors=ts)
    assert h.tensor("t999") is ts[999] and h.tensor("t0") is ts[0] and h.tensor("nope") is None
    h.tensors.append(fmt.TensorInfo("late", "U8", (1,)))
    assert h.tensor("late") is h.tensors[-1]
    h.tensors = [fmt.TensorInfo("t0", "I64", (3,))]
    assert h.tensor("t0").dtype == "I64" and h.tensor("t999") is None
