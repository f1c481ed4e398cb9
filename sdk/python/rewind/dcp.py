"""rewind.dcp: PyTorch Distributed Checkpoint (DCP) storage in rewind.

    import torch.distributed.checkpoint as dcp, rewind.dcp
    dcp.save(state_dict, storage_writer=rewind.dcp.Writer(step=step))
    dcp.load(state_dict, storage_reader=rewind.dcp.Reader())

Writer and Reader implement torch 2.x's StorageWriter and StorageReader.
Each rank's write items (after DCP's planner has given every replicated
item to one rank) go straight into that rank's shared-memory shard of the
step through rewind.Client: a tensor piece is one shard tensor with its
chunk record (global shape and offsets, rewind.chunks), a non-tensor item
(DCP's own bytes) a U8 tensor. Nothing is pickled by rewind. The shard's
rewind.objects document says which DCP item each tensor is:

    {"format": "rewind.dcp/1",
     "items": {NAME: {"fqn": FQN, "kind": "tensor" | "bytes", "requires_grad": BOOL, "dtype": DTYPE?}},
     "planner_data": {FQN: [PATH...]} | null,
     "save": SAVE_ID}

A tensor piece of a dtype the shard format has no name for (complex128,
complex32, float8_e4m3fnuz, ...) is stored as its bytes: a U8 tensor with
a trailing dimension of its element size (in its chunk record too), and
DTYPE, torch's name of the dtype, in its item.

SAVE_ID is one dcp.save's, made by DCP's coordinator rank when it plans
the save and the same in every rank's shard: a load refuses a step whose
shards come from two saves of it (the step saved again, and that save
failed on some ranks after others committed). Processes saving without
torch.distributed (each its own coordinator) share no id: their shards
carry null, as shards written before save ids do.

DCP's global Metadata is not stored: Reader.read_metadata rebuilds it from
the headers of every rank's shard of the step (each chunk record is a
ChunkStorageMetadata), so every rank at any world size can plan its reads
with DCP's own load planner and read the pieces it needs from any saved
rank's shard (Client.open_shard: the agent fetches shards its node lacks
from peers or tiers when it has a coordinator). Each piece read is checked
against its checksum first.

A checkpoint_id of the form rewind://JOB, rewind://JOB/step-N or
rewind://JOB/N names the job (and the step); validate_checkpoint_id accepts
exactly those. Without a step it means the step the Writer or Reader was
made with (a Reader's None: the latest), whatever ids it was given before.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import json
import os
import pickle
import re
import threading
import uuid

import numpy as np
import torch

from . import format as fmt
from . import identity
from .client import DEFAULT_SOCKET, Client, OpenShard
from .dtypes import of_tensor
from .errors import BusyError, CorruptError, InvalidError, NotFoundError, RewindError
from .reshard import box_bytes, latest_whole

try:
    from torch.distributed.checkpoint.metadata import (
        Metadata,
        MetadataIndex,
        StorageMeta,
    )
    from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
    from torch.distributed.checkpoint.staging import AsyncStager
    from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
except ImportError as e:  # torch 1.x: a DCP without the 2.x interface (StorageMeta, reset)
    raise ImportError(f"rewind.dcp needs torch 2.x's torch.distributed.checkpoint (this torch is {torch.__version__}): "
                      f"{e}") from None
from torch.futures import Future

from .dcp_index import DOC_FORMAT, Stored, check_covered, check_one_save, index_shard  # noqa: E402 (after the torch 2.x check)
from .dcp_stage import Snapshot  # noqa: E402

SCHEME = "rewind://"
_STEP_RE = re.compile(r"(?:.*?[-_])?([0-9]+)")
_NOT_TENSOR_NAMES = ("", "__metadata__")  # what a safetensors header cannot name a tensor

__all__ = ["Writer", "Reader", "Stored", "parse_checkpoint_id", "SCHEME"]


def parse_checkpoint_id(checkpoint_id) -> tuple[str, int | None]:
    """(job, step or None) of rewind://JOB[/step-N]; InvalidError otherwise."""
    s = os.fspath(checkpoint_id) if isinstance(checkpoint_id, (str, os.PathLike)) else None
    if not isinstance(s, str) or not s.startswith(SCHEME):
        raise InvalidError("dcp", f"checkpoint id {checkpoint_id!r} is not {SCHEME}JOB[/step-N]")
    parts = s[len(SCHEME):].strip("/").split("/")
    if len(parts) > 2:
        raise InvalidError("dcp", f"checkpoint id {s!r}: {SCHEME}JOB or {SCHEME}JOB/step-N, not more path")
    fmt.validate_job(parts[0])
    step = None
    if len(parts) == 2:
        m = _STEP_RE.fullmatch(parts[1])
        if m is None:
            raise InvalidError("dcp", f"checkpoint id {s!r}: {parts[1]!r} does not end in a step number")
        step = int(m.group(1))
    return parts[0], step


def _valid_id(checkpoint_id) -> bool:
    try:
        parse_checkpoint_id(checkpoint_id)
        return True
    except InvalidError:
        return False


_clients: dict[tuple, Client] = {}
_clients_lock = threading.Lock()

# (save id, rank) of each shard this process wrote, the newest last: a plan
# carrying one again is an earlier save's plan (see Writer.write_data).
_written: collections.deque = collections.deque(maxlen=4096)
_written_lock = threading.Lock()


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _client(socket: str | None, job: str | None, timeout: float, rank: int | None = None,
            world: int | None = None) -> Client:
    """One client per agent socket, job and rank, kept across checkpoints so
    that each save reuses its mapped segments. Rank and world size: those
    given, else torch.distributed's when it is initialized: DCP plans by
    them."""
    import torch.distributed as dist

    if rank is None or world is None:
        rank, world = (dist.get_rank(), dist.get_world_size()) if _distributed() else (None, None)
    job_, rank, world = identity.resolve(job, rank, world)
    key = (os.path.abspath(socket or os.environ.get("REWIND_SOCKET") or DEFAULT_SOCKET), job_, rank, world)
    with _clients_lock:
        c = _clients.get(key)
        if c is None:
            c = Client(socket=socket, job=job_, rank=rank, world_size=world, timeout=timeout)
            _clients[key] = c
        return c


def item_name(index: MetadataIndex) -> str:
    """The shard tensor name of a DCP item: its FQN, with the piece's
    offsets when it does not start at the origin (Writer adds #N to a
    name another item of the shard has; the objects document, not the
    name, says which item a tensor is)."""
    if index.offset is None or not any(index.offset):
        return index.fqn
    return f"{index.fqn}@{','.join(str(int(o)) for o in index.offset)}"


def _planner_data_json(pd):
    """DefaultSavePlanner's planner_data ({fqn: (key, ...)}) as JSON, or
    None for anything else (a custom planner's data is not kept)."""
    if not isinstance(pd, dict):
        return None
    out = {}
    for k, v in pd.items():
        if not isinstance(k, str) or not isinstance(v, (tuple, list)) or \
                not all(isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool)) for x in v):
            return None
        out[k] = list(v)
    return out


_failures_picklable = False


def _make_failures_picklable() -> None:
    """DCP sends a rank's failure to the other ranks pickled, as the
    exception and traceback.extract_tb of it (torch's _wrap_exception). On
    Python 3.13 each frame of that summary holds its code object, which does
    not pickle (pytorch#174669): the failing rank raised "cannot pickle code
    objects" instead of its own error, and the other ranks waited for it in
    a collective until their timeout. Where this torch's wrapper fails so,
    it is wrapped once to drop the frames' code objects, as later torch
    does: what a frame prints (file, line, function, source) stays."""
    global _failures_picklable
    if _failures_picklable:
        return
    _failures_picklable = True
    try:
        from torch.distributed.checkpoint import api, utils
        wrap = utils._wrap_exception
    except (ImportError, AttributeError):
        return  # a torch whose DCP does not wrap failures so
    try:
        raise RuntimeError("probe")
    except RuntimeError as e:
        probe = e
    try:
        pickle.dumps(wrap(probe))
        return  # they pickle: nothing to mend
    except Exception:  # TypeError: cannot pickle code objects
        pass

    def wrap_picklable(exc):
        wrapped = wrap(exc)
        if isinstance(wrapped, tuple) and len(wrapped) == 2 and isinstance(wrapped[1], list):
            for frame in wrapped[1]:
                if getattr(frame, "_code", None) is not None:
                    object.__setattr__(frame, "_code", None)
        return wrapped

    for mod in (utils, api):
        if getattr(mod, "_wrap_exception", None) is wrap:
            mod._wrap_exception = wrap_picklable


class _Base:
    def __init__(self, step: int | None, job: str | None, socket: str | None, timeout: float):
        _make_failures_picklable()
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise InvalidError("dcp", f"step must be a non-negative integer, is {step!r}")
        self.step, self.job, self.socket, self.timeout = step, job, socket, timeout
        self._given_step = step  # what a checkpoint_id without a step leaves: not an earlier id's step
        self.checkpoint_id: str | None = None

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id is not None:
            self.job, step = parse_checkpoint_id(checkpoint_id)
            self.step = self._given_step if step is None else step
            self.checkpoint_id = os.fspath(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return _valid_id(checkpoint_id)

    def _connect(self) -> Client:
        return _client(self.socket, self.job, self.timeout)

    def _id(self, job: str, step) -> str:
        return self.checkpoint_id or f"{SCHEME}{job}/step-{step}"


class Writer(_Base, StorageWriter, AsyncStager):
    """A DCP StorageWriter into rewind: dcp.save(..., storage_writer=Writer(step=N)).

    step: the training step (or from checkpoint_id rewind://JOB/step-N);
    job, socket: as rewind.Client (else $REWIND_JOB, $REWIND_SOCKET, or the
    checkpoint_id's JOB); rank and world size are those of the process
    group DCP saves with (dcp.save's process_group, else every rank). Every
    rank's shard is committed when write_data returns: the step is
    restorable once every rank has written, with or without finish.

    As dcp.async_save's stager, stage copies the state's tensors before
    async_save returns (rewind.dcp_stage): the save writes the values of
    the step it was called at while the loop changes them."""

    _synchronize_after_execute = False  # stage's copies are done when it returns

    def __init__(self, step: int | None = None, *, job: str | None = None, socket: str | None = None,
                 timeout: float = 60.0):
        _Base.__init__(self, step, job, socket, timeout)
        StorageWriter.__init__(self)
        self.save_id: str | None = None  # the last save's (None: none yet, or saved without torch.distributed)
        self.client: Client | None = None
        self._staged: Snapshot | None = None  # stage's, for the save it stages
        self._snapshot: Snapshot | None = None  # the one the save under way writes from
        self._alone: int | None = None  # the rank a save with use_collectives=False names

    def stage(self, state_dict):
        self._staged = Snapshot(state_dict)
        return self._staged.state_dict

    def synchronize_staging(self) -> None:
        pass

    def __getstate__(self):
        """The writer as dcp.async_save's process executor sends it to DCP's
        checkpoint process (torch 2.7 and later), beside the state dict
        its stage returned: its settings, not this process's connection
        or snapshot. A snapshot holding live tensors (a ShardedTensor's
        shards), which only this process can read through their copies,
        fails the save here, naming them, rather than write live values."""
        staged, self._staged = self._staged, None  # it goes with the state dict: no later save here writes it
        if staged is not None and staged.live:
            raise InvalidError("dcp async_save", "the state holds " + ", ".join(sorted(set(staged.live))) +
                               ", which rewind.dcp.Writer stages for a save in this process only: with "
                               "async_checkpointer_type=PROCESS pass async_stager=DefaultStager(...) "
                               "(torch.distributed.checkpoint.staging), or use the thread executor")
        state = self.__dict__.copy()
        state.update(client=None, _snapshot=None)
        return state

    def __setstate__(self, state) -> None:
        _make_failures_picklable()  # in DCP's checkpoint process too
        self.__dict__.update(state)

    def storage_meta(self) -> StorageMeta | None:
        job = self.client.job if self.client is not None else self.job or ""
        return StorageMeta(checkpoint_id=self._id(job, self.step), save_id=self.save_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        # torch 2.14 also passes the rank and use_collectives: a save with
        # use_collectives=False plans each rank alone (prepare_global_plan
        # sees its plan only), and names the rank here.
        self._alone = None if kwargs.get("use_collectives", True) else kwargs.get("rank")
        # A save begins (DCP calls this once a save, before planning; it
        # may call storage_meta more than once, before and after the
        # write): it writes from what stage staged for it, or from the
        # live tensors. A snapshot that an async save staged and never
        # wrote (it failed first) is dropped, not written by the next save
        # through this writer (a retry with dcp.save).
        self._snapshot, self._staged = self._staged, None
        if self.step is None:
            raise InvalidError("dcp save", "no step: pass Writer(step=N) or checkpoint_id rewind://JOB/step-N")
        self.client = self._connect()

    def prepare_local_plan(self, plan):
        assert self.client is not None
        return dataclasses.replace(plan, storage_data=(self.client.job, self.step))

    def prepare_global_plan(self, plans):
        seen = {p.storage_data for p in plans}
        if len(seen) != 1:
            raise InvalidError("dcp save", f"ranks disagree on the job and step to save: {sorted(seen, key=str)}")
        # Each shard's rank and world size are the plan's in DCP's process
        # group (dcp.save's process_group, else every rank): a subgroup's
        # checkpoint is whole at the subgroup's size. One save id per
        # dcp.save (this runs once a save, on DCP's coordinator rank; not
        # per Writer: a retry loop reuses one with no reset between saves)
        # goes into every shard: a load can tell the shards of this save
        # from those of another save of the same step. Without
        # torch.distributed each process plans a save of its own, and an
        # id of its own would set its shard apart from the other ranks'
        # of the same save: none is stored.
        if self._alone is not None and _distributed():  # use_collectives=False: this rank of every rank
            import torch.distributed as dist

            rank, world = dist.get_rank(), dist.get_world_size()
            if self._alone != rank:  # no_dist (rank 0 everywhere), or a process group's rank
                raise InvalidError("dcp save", f"use_collectives=False names rank {self._alone}, this process is rank "
                                   f"{rank} of {world}: saves without collectives are of the default group's ranks "
                                   "(no process_group, no no_dist)")
            self.save_id = None  # no plan crosses the ranks: no id they share
            return [dataclasses.replace(plans[0], storage_data=(*plans[0].storage_data, rank, world, None))]
        save = self.save_id = uuid.uuid4().hex if _distributed() else None
        return [dataclasses.replace(p, storage_data=(*p.storage_data, r, len(plans), save))
                for r, p in enumerate(plans)]

    def write_data(self, plan, planner) -> Future:
        assert self.client is not None and self.step is not None
        try:
            self._check_fresh(plan)
            return self._write(plan, planner)
        finally:
            _drop_cached_plans(planner)
            if self._snapshot is not None:  # staged for this save, written or not
                self._snapshot.release()
                self._snapshot = None

    def _check_fresh(self, plan) -> None:
        """Refuses a plan that is not this save's: DCP's plan caching
        (DefaultSavePlanner(enable_plan_caching=True)) gives a rank whose
        local plan did not change its final plan of an earlier save, and
        with it that save's id (or another storage's data). Written, the
        shard would pass for the earlier save's."""
        sd = plan.storage_data
        if not (isinstance(sd, tuple) and len(sd) == 5):
            raise InvalidError("dcp save", f"the plan's storage data {sd!r} is not this Writer's: a plan DCP cached "
                                           "(enable_plan_caching) from a save through another storage")
        key = (sd[4], sd[2])
        with _written_lock:
            if sd[4] is not None and key in _written:
                raise InvalidError("dcp save", f"rank {sd[2]} was given the plan of an earlier save (save {sd[4]}), "
                                               "as DCP's plan caching (enable_plan_caching) does: the save is "
                                               "refused, and the cached plans dropped for the next")
            _written.append(key)

    def _write(self, plan, planner) -> Future:
        assert self.client is not None and self.step is not None
        _, _, rank, world, save = plan.storage_data
        self.save_id = save
        # Without torch.distributed DCP plans each process alone: its rank
        # is the one identity resolves (REWIND_RANK, RANK).
        c = self.client = _client(self.socket, self.client.job, self.timeout,
                                  *((rank, world) if _distributed() else (None, None)))
        tensors: dict = {}
        chunks: dict = {}
        items: dict = {}
        results = []
        for item in plan.items:
            # A name unique in the shard: an FQN may read like another
            # item's piece name (a key "w@2" beside w's piece at 2), or
            # be a name safetensors does not allow (the key "", or
            # "__metadata__"): the objects document names the item.
            name = base = item_name(item.index)
            n = 0
            while name in tensors or name in _NOT_TENSOR_NAMES:
                n += 1
                name = f"{base}#{n}"
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                arr = np.frombuffer(data.getvalue(), dtype=np.uint8)
                tensors[name], items[name] = arr, {"fqn": item.index.fqn, "kind": "bytes"}
                nbytes = arr.nbytes
            else:
                td = item.tensor_data
                if data.is_quantized:  # its bytes are integers read through a scale: not a dtype's values
                    raise InvalidError("dcp save", f"tensor {item.index.fqn!r} has dtype {data.dtype}, which a "
                                       "shard cannot hold (a quantized tensor: dequantize it before the save)")
                t = data.detach() if self._snapshot is None else self._snapshot.staged(data.detach())
                if tuple(t.shape) != tuple(td.chunk.sizes):
                    raise InvalidError("dcp save", f"{name}: planner gave a {tuple(t.shape)} tensor for a "
                                       f"{tuple(td.chunk.sizes)} chunk")
                items[name] = {"fqn": item.index.fqn, "kind": "tensor",
                               "requires_grad": bool(td.properties.requires_grad)}
                shape, offsets = list(td.size), list(td.chunk.offsets)
                if of_tensor(t) is None:  # a dtype the shard format has no name for: its bytes, as U8
                    items[name]["dtype"] = str(t.dtype).removeprefix("torch.")
                    shape, offsets = shape + [t.element_size()], offsets + [0]
                    t = t.resolve_conj().resolve_neg().unsqueeze(-1).view(torch.uint8)
                tensors[name] = t
                chunks[name] = {"global_shape": shape, "offsets": offsets}
                nbytes = t.numel() * t.element_size()
            results.append(WriteResult(index=item.index, size_in_bytes=nbytes, storage_data=Stored(c.rank, name)))
        doc = {"format": DOC_FORMAT, "items": items, "planner_data": _planner_data_json(plan.planner_data), "save": save}
        c.save_tensors(self.step, tensors, objects=json.dumps(doc, separators=(",", ":")).encode(), chunks=chunks)
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata, results) -> None:
        """Every rank's shard is committed, and the global metadata is
        rebuilt from them at load: what is left is to name the checkpoint
        in the Metadata dcp.save returns, as FileSystemWriter does."""
        if hasattr(metadata, "storage_meta"):
            metadata.storage_meta = self.storage_meta()


def _drop_cached_plans(planner) -> None:
    """Drops what DCP's plan caching (DefaultSavePlanner(enable_plan_caching=True),
    torch 2.8 and later: class-wide dicts of SavePlanner keyed by the
    planner's _cached_plans_key) holds for planner, so that the next save
    through Writer plans afresh and each rank's plan carries that save's
    id."""
    key = getattr(planner, "_cached_plans_key", None)
    if key is None:
        return
    for cls in type(planner).__mro__:
        for name, cache in list(vars(cls).items()):
            if name.startswith("_cached_") and isinstance(cache, dict):
                cache.pop(key, None)


class Reader(_Base, StorageReader):
    """A DCP StorageReader from rewind: dcp.load(state_dict, storage_reader=Reader()).

    step: the step to load; None: the job's latest consistent step (from the
    coordinator through the agent; an agent without a coordinator: the
    newest step of which it holds every rank's shard). The load may run at
    any world size: DCP's planner asks for the pieces each rank needs, and
    they are read from whichever saved rank's shard holds them."""

    def __init__(self, step: int | None = None, *, job: str | None = None, socket: str | None = None,
                 timeout: float = 60.0):
        _Base.__init__(self, step, job, socket, timeout)
        StorageReader.__init__(self)
        self.load_id = uuid.uuid4().hex
        self.client: Client | None = None
        self.loaded_step: int | None = None
        self.saved_world_size = 0
        self._sums: dict[int, str] = {}  # saved rank -> header checksum seen by read_metadata
        self._chunk_sizes: dict[Stored, tuple] = {}
        self._dtypes: dict[Stored, torch.dtype] = {}  # pieces stored as bytes (no name in the format): their dtype
        self._read: tuple = (None, "")  # the save id of the shards read_metadata read, and a digest of their headers
        self.storage_data: dict = {}

    def reset(self, checkpoint_id=None) -> None:
        _Base.reset(self, checkpoint_id)
        self.load_id = uuid.uuid4().hex

    def read_metadata(self) -> Metadata:
        c = self.client = self._connect()
        step = self.loaded_step = self.step if self.step is not None else self._pick_step(c)
        sdm: dict = {}
        stored: dict = {}
        planner_data: dict | None = {}
        self._sums.clear()
        self._chunk_sizes.clear()
        self._dtypes.clear()
        world = 1
        saves: list = []  # each shard's save id
        r = 0
        while r < world:
            with c.open_shard(r, step, ranged=True) as sh:  # the header only: no bytes of a shard the node lacks move
                if r == 0:
                    world = sh.header.meta.world_size
                elif sh.header.meta.world_size != world:
                    raise CorruptError(f"dcp load step {step} of job {c.job}",
                                       f"rank {r}'s shard says world size {sh.header.meta.world_size}, rank 0's {world}")
                self._sums[r] = sh.shard.header_checksum
                pd, save = index_shard(sh, r, sdm, stored, self._chunk_sizes, self._dtypes)
                saves.append(save)
                if planner_data is not None:
                    planner_data = None if pd is None else {**planner_data, **pd}
            r += 1
        check_one_save(c, step, saves)
        check_covered(c, step, sdm)
        heads = "".join(f"{r}:{s}\n" for r, s in sorted(self._sums.items()))
        self._read = (saves[0] if saves else None, hashlib.sha256(heads.encode()).hexdigest()[:16])
        self.saved_world_size = world
        meta = Metadata(state_dict_metadata=sdm, planner_data=planner_data, storage_data=stored)
        if "storage_meta" in {f.name for f in dataclasses.fields(Metadata)}:
            meta.storage_meta = StorageMeta(checkpoint_id=self._id(c.job, step), load_id=self.load_id)
        return meta

    def _pick_step(self, c: Client) -> int:
        try:
            step = c.latest_consistent()
        except BusyError:  # an agent without a coordinator: what it holds
            step = latest_whole(c)
        if step is None:
            raise NotFoundError(f"dcp load job {c.job}", "the job has no step that every rank committed")
        return step

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan):
        # Each rank chose its step, and read the headers of its shards, in
        # its own read_metadata: the step, the save id and a digest of
        # the headers go with its plan, for the coordinator to check that
        # every rank read the same shards.
        assert self.client is not None
        return dataclasses.replace(plan, storage_data=(self.client.job, self.loaded_step, *self._read))

    def prepare_global_plan(self, plans):
        """Refuses a load whose ranks chose different steps (Reader(step=)
        given apart, or a lone agent's newest whole step changed between
        them), or read different shards of the step (a save of it
        committed between their read_metadata, each rank's copies whole
        but of two saves): a restore never mixes steps or saves across
        ranks."""
        chosen = [p.storage_data for p in plans]
        steps = [c[:2] if c else None for c in chosen]
        if len(set(steps)) > 1:
            ranks = ", ".join(f"rank {r}: job {c[0]} step {c[1]}" if c else f"rank {r}: none" for r, c in enumerate(steps))
            raise InvalidError("dcp load", f"the ranks chose different steps ({ranks}); a load never mixes steps: "
                                           "name one with Reader(step=N) or checkpoint_id on every rank")
        if len(set(chosen)) > 1:
            groups: dict = {}
            for r, c in enumerate(chosen):
                groups.setdefault(c[2:], []).append(r)
            ranks = "; ".join(f"ranks {', '.join(map(str, rs))}: save {s or '(none)'}, headers {d}"
                              for (s, d), rs in groups.items())
            raise NotFoundError(f"dcp load step {steps[0][1]} of job {steps[0][0]}",
                                f"the ranks read {len(groups)} different sets of its shards ({ranks}): a save of "
                                "the step committed while the load read it; load again")
        return plans

    def read_data(self, plan, planner) -> Future:
        c = self.client
        assert c is not None and self.loaded_step is not None
        per_rank: dict[int, list] = {}
        for req in plan.items:
            per_rank.setdefault(self.storage_data[req.storage_index].rank, []).append(req)
        for rank, reqs in sorted(per_rank.items()):
            self._read_rank(c, rank, reqs, planner)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _read_rank(self, c: Client, rank: int, reqs: list, planner) -> None:
        step = self.loaded_step
        assert step is not None
        op = f"dcp load step {step} of job {c.job} rank {rank}"
        for attempt in range(2):  # a corrupt copy is reported; the agent serves another or none
            with c.open_shard(rank, step, ranged=True) as sh:
                if sh.shard.header_checksum != self._sums[rank]:
                    raise RewindError(op, "the shard changed between reading the metadata and the data "
                                      f"(header {sh.shard.header_checksum}, was {self._sums[rank]})")
                try:
                    sh.fill([self._item_range(sh, req) for req in reqs])  # another node's shard: what is read moves
                    for req in reqs:
                        self._check_item(sh, req)
                except CorruptError:
                    if attempt:
                        raise
                    continue
                for req in reqs:
                    self._read_item(sh, req, planner)
                return

    def _item_range(self, sh: OpenShard, req) -> tuple[int, int]:
        """The bytes of the shard req reads, as _check_item checks them."""
        st = self.storage_data[req.storage_index]
        t = sh.header.tensor(st.name)
        if t is None:
            return 0, 0  # _check_item says so
        if req.type == LoadItemType.BYTE_IO or t.nbytes == 0:
            return sh.tensor_range(st.name)
        es = self._element_size(t, st)
        return sh.tensor_range(st.name, *box_bytes(self._chunk_sizes[st], req.storage_offsets, req.lengths, es))

    def _check_item(self, sh: OpenShard, req) -> None:
        """Verifies what req reads of its stored piece: the leaves it
        touches when the agent gave the piece's leaf hashes, else the
        whole piece (once)."""
        st = self.storage_data[req.storage_index]
        t = sh.header.tensor(st.name)
        if t is None or req.type == LoadItemType.BYTE_IO or t.nbytes == 0:
            sh.verify([st.name])
            return
        es = self._element_size(t, st)
        sh.verify_range(st.name, *box_bytes(self._chunk_sizes[st], req.storage_offsets, req.lengths, es))

    def _element_size(self, t, st: Stored) -> int:
        """Bytes of one element of the stored piece, in its DCP dtype."""
        return t.nbytes // max(1, int(np.prod(self._chunk_sizes[st], dtype=np.int64)))

    def _read_item(self, sh: OpenShard, req, planner) -> None:
        st = self.storage_data[req.storage_index]
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(bytes(sh.raw(st.name))))
            return
        dtype = self._dtypes.get(st)
        src = sh.view(st.name)
        # A piece stored as bytes is copied as bytes: in the shard its
        # elements need not lie on their alignment.
        if dtype is None:
            src = src.view(self._chunk_sizes[st])
        else:
            src = src.view(*self._chunk_sizes[st], torch.empty(0, dtype=dtype).element_size())
        for d, (o, n) in enumerate(zip(req.storage_offsets, req.lengths)):
            if o or n != src.size(d):
                src = src.narrow(d, o, n)
        target = planner.resolve_tensor(req).detach()
        size = src.size() if dtype is None else src.size()[:-1]
        if target.size() != size:
            raise RewindError(f"dcp load {req.storage_index.fqn}",
                              f"piece {tuple(size)} read for a {tuple(target.size())} target")
        if dtype is None:
            target.copy_(src)
        elif target.dtype == dtype and not target.is_conj() and not target.is_neg():
            target.unsqueeze(-1).view(torch.uint8).copy_(src)
        else:  # into a target of another dtype: converted, as torch's copy does
            typed = torch.empty(size, dtype=dtype)
            typed.unsqueeze(-1).view(torch.uint8).copy_(src)
            target.copy_(typed)
        planner.commit_tensor(req, target)
