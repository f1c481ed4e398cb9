"""The snapshot dcp.async_save writes from (rewind.dcp.Writer.stage).

dcp.async_save returns once its stager has staged the state dict, and the
save runs on (in a thread, or in DCP's checkpoint process) while the
training loop goes on and changes the tensors in place. Writer.stage
copies the bytes of every tensor (a DTensor's local piece, a
ShardedTensor's local shards) before it returns: each storage the state
dict's tensors view, once, over the span they cover, into a buffer of
host memory (page-locked when the tensor is on a GPU, so the copy runs at
the link's speed). The state dict it returns holds copies: each plain
tensor is the same view of the copy of its storage, each DTensor one over
such a view with the DTensor's spec, so the save reads the values of the
step it was called at wherever it runs. ShardedTensors and other tensors
with local shards stay the live ones, read through their copies by the
writer as it writes (Snapshot.staged), which only a save in this process
can do. The buffers of a finished save are reused by the next snapshot
of the same storages: in a loop that waits for one async_save before the
next, the snapshot costs one copy of the state and no allocation after
the first.
"""

from __future__ import annotations

import copy
import io
import mmap
import threading
import weakref
from dataclasses import dataclass

import torch

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch 2.0-2.3
    from torch.distributed._tensor import DTensor

from . import cuda, state
from .placement import untyped as _storage

_ALIGN = 64  # a span starts on a boundary every dtype's view of it can take

# The buffers of the last snapshot whose save is done, by (storage address,
# storage size, span, device type); a snapshot takes the ones it uses out
# of it.
_idle: dict[tuple, torch.Tensor] = {}
_idle_lock = threading.Lock()


@dataclass
class _Span:
    storage: torch.UntypedStorage
    lo: int
    hi: int
    buf: torch.Tensor | None = None


def _extent(t: torch.Tensor) -> int:
    """Bytes from t's first element to the end of its last."""
    return 0 if t.numel() == 0 else state.extent(t) * t.element_size()


_PIN_MIN = 1 << 20  # smaller buffers stay pageable: their copies are short either way


def _host_buffer(n: int, pinned: bool) -> torch.Tensor:
    """n bytes of host memory; pinned (and n at least _PIN_MIN): pages of
    their own (an anonymous mapping) page-locked for DMA from a GPU by
    registering exactly them (cudaHostRegister, as the SDK does its shard
    mappings), not through torch's pinned allocator, which rounds each
    block up to a power of two (up to twice the state). Unregistered when
    the buffer goes; if registration fails, a warning says so and the
    copies go through pageable memory."""
    if not pinned or n < _PIN_MIN:
        return torch.empty(n, dtype=torch.uint8)
    mm = mmap.mmap(-1, n)
    buf = torch.frombuffer(mm, dtype=torch.uint8)
    if cuda.pin(buf.data_ptr(), n, "a dcp.async_save staging buffer", stacklevel=4):
        # The finalizer holds the mapping: pickled for DCP's process
        # executor, the storage moves into shared memory and lets go of
        # it, which must not unmap pages still registered.
        weakref.finalize(buf, _unpin, buf.data_ptr(), mm)
    return buf


def _unpin(address: int, mapping: mmap.mmap) -> None:
    cuda.unpin(address)  # then the mapping goes, once nothing else holds it


def _standalone(t: torch.Tensor) -> torch.Tensor:
    """t, a copy the snapshot made, as a tensor DCP's process executor can
    pickle: torch's tensor pickling keeps no lazy conjugate or negative
    bit (they are resolved), torch (2.14) crashes pickling a DTensor whose
    local tensor starts past its storage's first byte (a piece of a
    buffer other views share: cloned, as a view of it would point at
    memory the pickling of another view frees when it moves the buffer
    into shared memory), and an empty piece the snapshot holds no buffer
    for is made on the CPU."""
    if t.numel() == 0:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return t.clone() if t.storage_offset() != 0 else t


def _key(st) -> tuple[int, int]:
    """A storage's address and size: two storages may start at one address
    (torch.from_numpy of an array and of a slice of it)."""
    return st.data_ptr(), st.nbytes()


def _local_tensors(v):
    if isinstance(v, DTensor):
        yield from _local_tensors(v._local_tensor)  # not to_local(): an autograd op per tensor
    elif hasattr(v, "local_shards"):  # a ShardedTensor's Shards; a LocalShardsWrapper's tensors
        for s in v.local_shards():
            yield getattr(s, "tensor", s)
    elif isinstance(v, torch.Tensor):
        yield v


def _copy(v):
    """A copy of a value DCP pickles (torch.save) as it writes: deepcopy's,
    else torch.save's and torch.load's (deepcopy refuses a tensor that is
    not a graph leaf, in an object or a tuple; torch.save does not)."""
    try:
        return copy.deepcopy(v)
    except Exception:
        buf = io.BytesIO()
        torch.save(v, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=False)


class Snapshot:
    """Copies of the storage spans a state dict's tensors view."""

    def __init__(self, state_dict):
        self.spans: dict[tuple[int, int], _Span] = {}
        self.live: list[str] = []  # the types of values staged as the live ones (Snapshot.staged)
        self._at: dict[int, tuple] = {}  # id of a walked tensor: its storage's key, byte offset, extent
        walked = self._walk(state_dict)
        gpus = set()
        with _idle_lock:
            for k, sp in self.spans.items():
                sp.buf = _idle.pop((*k, sp.hi - sp.lo, sp.storage.device.type), None)
        for sp in self.spans.values():
            dev = sp.storage.device
            if sp.buf is None:
                sp.buf = _host_buffer(sp.hi - sp.lo, pinned=dev.type == "cuda")
            src = torch.empty(0, dtype=torch.uint8, device=dev)
            src.set_(sp.storage, sp.lo, (sp.hi - sp.lo,))  # type: ignore[call-overload]
            sp.buf.copy_(src, non_blocking=dev.type == "cuda")
            if dev.type == "cuda":
                gpus.add(dev)
        for dev in gpus:  # the copies were queued after the work that made the tensors
            torch.cuda.current_stream(dev).synchronize()
        self.state_dict = self._copies(walked)
        self._at = {}  # ids of tensors that may go: staged() looks them up afresh

    def _copies(self, v):
        """The walked structure with each plain tensor and DTensor replaced
        by the same view of the copy (torch's own stagers build DTensors
        over CPU copies so too). Anything else with local shards stays
        live, listed in self.live."""
        if isinstance(v, dict):
            return {k: self._copies(x) for k, x in v.items()}
        if isinstance(v, list):
            return [self._copies(x) for x in v]
        if isinstance(v, DTensor):
            local = v._local_tensor
            if hasattr(local, "local_shards"):  # a LocalShardsWrapper in a DTensor: live, as below
                self.live.append(type(local).__name__)
                return v
            return DTensor(_standalone(self.staged(local)), v._spec, requires_grad=v.requires_grad)
        if hasattr(v, "local_shards"):
            self.live.append(type(v).__name__)
            return v
        if isinstance(v, torch.Tensor) and v.layout == torch.strided and not v.is_quantized:
            return self._copy_of(v)
        return v  # a value copied whole; or a tensor whose bytes are not its values, which the save refuses

    def _copy_of(self, t: torch.Tensor) -> torch.Tensor:
        s = self.staged(t)
        if s is t:  # not copied: a meta tensor
            s = t.detach()
        if t.numel() == 0 or t.is_conj() or t.is_neg():  # rare: what pickles as it reads (_standalone)
            s = _standalone(s)
        return s.requires_grad_(True) if t.requires_grad else s  # DCP records it in the tensor's properties

    def _walk(self, v):
        """The state dict's structure with its own containers (a loop that
        refills its dict changes nothing staged); tensors are the live ones,
        their bytes recorded to copy; other values deep-copied. A tuple is
        one of those: DCP pickles it whole as it writes, the tensors in it
        too, so the copy is its own (and of its type: a torch.Size stays
        one)."""
        if isinstance(v, dict):
            return {k: self._walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [self._walk(x) for x in v]
        if isinstance(v, torch.Tensor) or hasattr(v, "local_shards"):
            for t in _local_tensors(v):
                self._record(t)
            return v
        return _copy(v)

    def _record(self, t: torch.Tensor) -> None:
        n = _extent(t)
        if n == 0 or t.device.type == "meta":
            return
        st = _storage(t)
        key, at = _key(st), t.storage_offset() * t.element_size()
        self._at[id(t)] = (key, at, n)  # for _copies, while the walked tensors live
        lo, hi = at - at % _ALIGN, at + n
        sp = self.spans.get(key)
        if sp is None:
            self.spans[key] = _Span(st, lo, hi)
        else:
            sp.lo, sp.hi = min(sp.lo, lo), max(sp.hi, hi)

    def staged(self, t: torch.Tensor) -> torch.Tensor:
        """t, a view of a storage the snapshot copied, as the same view of
        the copy (on the CPU), with t's lazy conjugate and negative bits
        (the bytes are the storage's, the bits how t reads them). A tensor
        the snapshot does not hold (a copy it made, one a custom planner
        made while writing) is returned as it is."""
        where = self._at.get(id(t))
        if where is None:
            n = _extent(t)
            if n == 0 or t.device.type == "meta":
                return t
            where = (_key(_storage(t)), t.storage_offset() * t.element_size(), n)
        key, lo, n = where
        sp = self.spans.get(key)
        if sp is None or sp.buf is None or lo < sp.lo or lo + n > sp.hi:
            return t
        v = sp.buf[lo - sp.lo:lo - sp.lo + n].view(t.dtype).as_strided(t.shape, t.stride())
        if t.is_neg():
            v = torch._neg_view(v)
        return v.conj() if t.is_conj() else v

    def release(self) -> None:
        """The save is done with the copies: the next snapshot may reuse
        them."""
        with _idle_lock:
            _idle.clear()
            for k, sp in self.spans.items():
                if sp.buf is not None:
                    _idle[(*k, sp.hi - sp.lo, sp.storage.device.type)] = sp.buf
        self.spans = {}
