"""rewind.Client: saves and restores one rank's state through the node agent.

Save: Prepare (the agent picks and sizes a slot) -> map the slot's segment
(kept mapped across saves) -> copy every tensor into it, hashing each 1 MiB
leaf right after it is copied -> fill the checksums into the header ->
write the header at offset 0 -> Commit with the header's checksum. Restore:
Open (a lease on the latest committed shard) -> map it -> decode, copy out
and verify -> Release; a mismatch is reported to the agent (ReportCorrupt),
which never serves that shard again. It is the Go SDK's flow (sdk/session.go).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import List  # in the class, "list" is Client.list

import numpy as np

from . import checksum, copier, cuda, dtypes, identity, placement, shard, state
from . import format as fmt
from ._pb import agent_pb2 as pb
from .channel import AgentChannel
from .errors import BusyError, CorruptError, InvalidError, NoAgentError, NotFoundError, RewindError
from .mapping import Mapping, SegmentCache, numpy_view, torch_view
from .segments import SegmentSocket

DEFAULT_SOCKET = "/run/rewind/agent.sock"
DEFAULT_TIMEOUT = 30.0  # seconds; covers sizing a cold multi-GiB segment
RELEASE_TIMEOUT = 5.0
FILL_TIMEOUT = 600.0  # seconds; a fill moves bytes between nodes
MAX_FALLBACKS = 16  # corrupt shards skipped by restore(fallback=True)


@dataclass
class SaveStats:
    """Timings of a save, in seconds."""

    step: int
    bytes: int  # shard size
    cold: bool  # the segment was created, resized or newly mapped
    prepare: float
    map: float
    copy: float  # copying and checksumming, header included
    commit: float
    total: float


class Client:
    """A connection to the node's agent for one rank of one job.

    socket: the agent's Unix socket (else $REWIND_SOCKET, else
    /run/rewind/agent.sock). job, rank, world_size: see identity.resolve.
    timeout bounds every call to the agent, in seconds. workers: threads
    that copy and checksum (0: up to 4). token: the job's token, for an
    agent that isolates jobs (else $REWIND_JOB_TOKEN, else the contents of
    the file $REWIND_JOB_TOKEN_FILE names). Methods may be called from
    several threads; saves and restores of one client run one at a time.
    """

    def __init__(self, socket: str | None = None, job: str | None = None, rank: int | None = None,
                 world_size: int | None = None, *, timeout: float = DEFAULT_TIMEOUT, workers: int = 0,
                 token: str | None = None):
        self.socket = os.path.abspath(socket or os.environ.get("REWIND_SOCKET") or DEFAULT_SOCKET)
        self.job, self.rank, self.world_size = identity.resolve(job, rank, world_size)
        self.timeout, self.workers = timeout, workers
        self.last_save: SaveStats | None = None
        self._segments = SegmentCache()
        self._epoch = 0  # the job's epoch this rank belongs to (0: not told yet)
        self._streams: cuda.SideStreams | None = None
        self._lock = threading.Lock()
        token = identity.job_token(token)
        self._agent = AgentChannel(self.socket, token)
        self._segsock = SegmentSocket(self.socket, token)
        try:
            self.status()
        except RewindError as e:
            self._agent.close()
            hint = "" if os.path.exists(self.socket) else " (the socket does not exist)"
            raise NoAgentError("connect", f"no agent answers on {self.socket}{hint}; is `rewind agent` "
                               f"running? ({e.message})", e.code) from None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Unmaps the segments and closes the connection."""
        with self._lock:
            self._segments.close()
            self._segsock.close()
            self._agent.close()

    def _call(self, op: str, method: str, req, timeout: float | None = None):
        return self._agent.call(op, method, req, timeout or self.timeout)

    def status(self) -> pb.StatusResponse:
        """The agent's node, shared-memory root and budget."""
        return self._call("status", "Status", pb.StatusRequest())

    def list(self, job: str | None = None) -> List[pb.Shard]:
        """The shards the agent holds for job (this client's by default; ""
        for every job), as agent_pb2.Shard messages; a shard's state is a
        rewind.ShardState (rewind.ShardState.SHARD_STATE_COMMITTED, ...)."""
        job = self.job if job is None else job
        return list(self._call("list", "List", pb.ListRequest(job=job)).shards)

    def delete(self, step: int | None = None, all_ranks: bool = False) -> int:
        """Deletes this rank's checkpoint of step (every step when None; of
        every rank with all_ranks). Returns how many shards were deleted."""
        req = pb.DeleteRequest(job=self.job, rank=self.rank, all_ranks=all_ranks, step=-1 if step is None else step)
        return self._call("delete", "Delete", req).deleted

    # Saving.

    def save(self, step: int, state_: object) -> SaveStats:
        """Writes step's state (any nest of dicts, lists and tuples of
        tensors, numpy arrays and plain values) into shared memory and
        commits it. It returns once the agent has committed the shard: a
        crash after save returns cannot lose the step, and a crash before
        cannot damage the previous one. Tensors must not change while it
        runs (GPU tensors: the work queued on their current stream is
        waited for)."""
        with self._lock:
            return self._save(step, state_)

    def save_tensors(self, step: int, tensors: dict, *, objects: bytes | None = None,
                     chunks: dict | None = None) -> SaveStats:
        """Writes named tensors (torch tensors or numpy arrays) into this
        rank's shard of step as they are, with no nest to flatten: the
        storage under rewind.dcp. objects is the shard's rewind.objects
        document (UTF-8 JSON, or None); chunks maps a tensor's name to its
        chunk record ({"global_shape": [...], "offsets": [...]}: the piece
        of a larger, sharded tensor it is). Otherwise as save."""
        t0 = time.perf_counter()
        with self._lock:
            op = self._check_step(step)
            try:
                specs = [fmt.TensorInfo(name, self._dtype(op, name, v), tuple(v.shape),
                                        chunk=(chunks or {}).get(name)) for name, v in tensors.items()]
                layout = fmt.Layout(fmt.ShardMeta(self.job, self.rank, self.world_size, int(step)), specs, objects)
            except InvalidError as e:
                raise InvalidError(op, e.message) from None
            values = {name: v if isinstance(v, np.ndarray) else v.detach() for name, v in tensors.items()}
            return self._write(op, int(step), values, layout, t0)

    @staticmethod
    def _dtype(op: str, name: str, v) -> str:
        dt = dtypes.of_ndarray(v) if isinstance(v, np.ndarray) else dtypes.of_tensor(v)
        if dt is None:
            raise InvalidError(op, f"tensor {name!r} has dtype {v.dtype}, which a shard cannot hold")
        return dt

    def _check_step(self, step) -> str:
        op = f"save step {step} of job {self.job} rank {self.rank}"
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise InvalidError(op, f"step must be a non-negative integer, is {step!r}")
        return op

    def _save(self, step: int, state_: object) -> SaveStats:
        t0 = time.perf_counter()
        op = self._check_step(step)
        step = int(step)
        leaves, layout = self._plan(op, step, state_)
        return self._write(op, step, {lf.name: lf.value for lf in leaves}, layout, t0)

    def _write(self, op: str, step: int, values: dict, layout: fmt.Layout, t0: float) -> SaveStats:
        prep = self._call(op, "Prepare", pb.PrepareRequest(
            job=self.job, rank=self.rank, world_size=self.world_size, step=step, size_bytes=layout.size,
            epoch=self._epoch))
        if not self._epoch:
            # The job's epoch this rank belongs to: every later save names
            # it, and one after a re-gang replaced this rank's gang fails
            # with GangBrokenError (the agent fences it).
            self._epoch = prep.epoch
        t1 = time.perf_counter()
        if prep.size_bytes != layout.size:
            raise RewindError(op, f"agent sized the segment {prep.size_bytes} bytes, {layout.size} asked")
        grant = pb.SegmentRequest(job=self.job, rank=self.rank, slot=prep.slot, save_token=prep.token)
        try:
            m, cold = self._segments.get(prep.path, layout.size, prep.resized, prep.segment_id,
                                         lambda: self._segsock.open(op, grant, self.timeout)[0])
        except OSError as e:
            raise RewindError(op, f"mapping segment: {e}") from None
        t2 = time.perf_counter()
        self._copy_in(op, m, layout, values)
        m.mv[: layout.data_start] = layout.header
        t3 = time.perf_counter()
        self._call(op, "Commit", pb.CommitRequest(
            job=self.job, rank=self.rank, slot=prep.slot, token=prep.token, step=step,
            header_checksum=layout.header_sum()))
        t4 = time.perf_counter()
        self.last_save = SaveStats(step, layout.size, cold or prep.resized, t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)
        return self.last_save

    def _plan(self, op: str, step: int, state_: object) -> tuple[List[state.Leaf], fmt.Layout]:
        """The tensors of state_ and the shard layout that holds them."""
        try:
            leaves, objects = state.flatten(state_)
            specs = [fmt.TensorInfo(lf.name, lf.dtype, lf.shape) for lf in leaves]
            return leaves, fmt.Layout(fmt.ShardMeta(self.job, self.rank, self.world_size, step), specs, objects)
        except InvalidError as e:
            raise InvalidError(op, e.message) from None

    def _copy_in(self, op: str, m: Mapping, layout: fmt.Layout, values: dict) -> None:
        transfers = []
        try:
            for t in layout.tensors:
                tr = copier.Transfer(layout.data_start + t.begin, t.nbytes)
                if t.nbytes:
                    self._set_save_copy(tr, m, t, layout.data_start, values[t.name])
                transfers.append(tr)
            for i, s in enumerate(copier.copy_and_sum(m.mv, transfers, self.workers)):
                layout.set_sum(i, s)
        except (RuntimeError, ValueError, TypeError) as e:  # torch's and numpy's copy errors
            raise RewindError(op, f"copying tensors into {m.path}: {e}") from e
        finally:
            if self._streams is not None:
                self._streams.wait()  # no GPU copy may outlive the save

    def _set_save_copy(self, tr: copier.Transfer, m: Mapping, t: fmt.TensorInfo, start: int, src) -> None:
        if isinstance(src, np.ndarray):
            arr = numpy_view(m.mv, t, start).reshape(t.shape)
            tr.copy_all = lambda: np.copyto(arr, src)
            return
        dst = torch_view(m.mv, t, start)
        if src.device.type == "cuda":
            if self._streams is None:
                self._streams = cuda.SideStreams()
            cuda.register(m)
            self._streams.copy(dst.view(t.shape), src)
            tr.copy_all, tr.late = self._streams.wait, True
        elif src.device.type == "cpu" and src.is_contiguous():
            flat, es = src.reshape(-1), src.element_size()
            tr.copy_leaf = lambda a, b: dst[a // es : b // es].copy_(flat[a // es : b // es])
        else:  # strided, or another device: one whole copy_
            tr.copy_all = lambda: dst.view(t.shape).copy_(src)

    # Restoring.

    def latest(self) -> int | None:
        """The rank's latest committed step, or None when it has none."""
        op = f"latest of job {self.job} rank {self.rank}"
        try:
            resp = self._call(op, "Open", pb.OpenRequest(job=self.job, rank=self.rank, latest=True))
        except NotFoundError:
            return None
        self._release(resp.lease)
        return resp.shard.step

    def latest_consistent(self) -> int | None:
        """The job's latest consistent step (the newest step every rank has
        committed), as the coordinator knows it through the agent, or None
        when there is none yet. BusyError when the agent runs without a
        coordinator. Restore that step on every rank (restore(step=...)) so
        that no restore mixes steps across ranks."""
        op = f"latest consistent step of job {self.job}"
        try:
            resp = self._call(op, "Consistent", pb.ConsistentRequest(job=self.job))
        except NotFoundError:
            return None
        return resp.step if resp.step >= 0 else None

    def restore(self, step: int | None = None, map_location="cpu", fallback: bool = False, *, layout=None):
        """Returns (step, state): the checkpoint to resume from — the job's
        latest consistent step when the agent has a coordinator, else the
        rank's latest committed step — or the given step, bit-identical to
        what save was given, every checksum verified as it is copied out.
        map_location places the tensors as torch.load's does (a device or
        its name, None for where they were saved, a dict from saved
        location to location, or a callable(storage, location); see
        rewind/placement.py); numpy arrays stay numpy. NotFoundError: the
        rank has none. CorruptError: the bytes did not match; the agent is
        told and never serves that shard again, so the next restore gets an
        older step. With fallback (latest only), restore goes on to older
        steps itself until one verifies.

        With layout (a rewind.reshard.Layout), the checkpoint may have been
        saved at another world size: its tensors' pieces that overlap each
        slice of the layout are copied into the slice's out, and restore
        returns a rewind.reshard.Resharded (the step, the saved world size,
        the objects document of layout.objects_rank) instead; see
        rewind/reshard.py."""
        if layout is not None:
            from . import reshard

            with self._lock:
                return reshard.restore_into(self, layout, step)
        placement.Placement(map_location, f"restore job {self.job} rank {self.rank}")  # a bad one fails here
        if step is None:
            # With a coordinator, every rank resumes from the job's latest
            # consistent step, so no restore mixes steps across ranks; an
            # agent running alone leaves the choice to this rank.
            try:
                step = self.latest_consistent()
            except BusyError:
                pass
            else:
                if step is None:
                    raise NotFoundError(f"restore job {self.job} rank {self.rank}",
                                        "the job has no consistent step yet (no step every rank committed)")
        for _ in range(MAX_FALLBACKS if fallback and step is None else 1):
            try:
                with self._lock:
                    return self._restore(step, map_location)
            except CorruptError:
                if not (fallback and step is None):
                    raise
        raise CorruptError(f"restore job {self.job} rank {self.rank}", f"{MAX_FALLBACKS} corrupt shards in a row")

    def _restore(self, step: int | None, map_location):
        op = f"restore job {self.job} rank {self.rank}" if step is None else \
            f"restore step {step} of job {self.job} rank {self.rank}"
        req = pb.OpenRequest(job=self.job, rank=self.rank, step=step or 0, latest=step is None)
        for attempt in range(2):
            resp = self._call(op, "Open", req)
            sh = resp.shard
            try:
                h, tensors = self._read(op, sh, resp.lease, map_location)
                break
            except BusyError:
                # The agent restarted between the Open and the request for
                # the shard's descriptor: it does not know the lease it
                # gave. The shard is opened again, once.
                if attempt:
                    raise
            except CorruptError as e:
                self._report(sh, e)
                raise CorruptError(op, e.message) from None
            finally:
                self._release(resp.lease)
        return h.meta.step, state.unflatten(h.objects, tensors, op)

    def _read(self, op: str, sh, lease: int, map_location):
        m, h = self._map(op, sh, lease)
        try:
            names = state.numpy_names(h.objects)
            return h, shard.copy_out(m, h, map_location, self.workers, names, op=op, locations=state.devices(h.objects))
        finally:
            m.close()

    def _map(self, op: str, sh, lease: int) -> tuple[Mapping, fmt.Header]:
        """Maps a leased shard read-only, its descriptor from the agent's
        segment socket, and checks its header against what the agent said
        (CorruptError)."""
        grant = pb.SegmentRequest(job=sh.job, rank=sh.rank, slot=sh.slot, lease=lease)
        fd, _ = self._segsock.open(op, grant, self.timeout)
        try:
            m = Mapping(sh.path, sh.size_bytes, write=False, fd=fd)
        except OSError as e:
            raise RewindError(op, f"opening shard: {e}") from None
        try:
            h = shard.decode_header(m.mv)
            if h.meta is None or (h.meta.job, h.meta.rank, h.meta.step) != (sh.job, sh.rank, sh.step):
                raise CorruptError(op, f"segment holds {h.meta}, agent said job {sh.job!r} rank {sh.rank} step {sh.step}")
            if sh.header_checksum and checksum.format_sum(checksum.tree_sum(m.mv[: h.data_start])) != sh.header_checksum:
                raise CorruptError(op, f"header of step {sh.step} changed since it was committed")
        except BaseException:
            m.close()
            raise
        return m, h

    def open_shard(self, rank: int, step: int, *, ranged: bool = False) -> OpenShard:
        """Leases rank's shard of step (any rank of this client's job: an
        agent with a coordinator fetches it from a peer or a tier when its
        node lacks it) and maps it read-only, its header checked. Close
        the OpenShard (a context manager) to unmap it and end the lease.
        Its tensors' checksums are not checked here: see OpenShard.verify.
        ranged: the caller reads parts of the shard only; where the node
        lacks it and a peer holds it in memory, it is opened partially
        (OpenShard.partial): the header is here, a range of the tensors'
        bytes only once OpenShard.fill fetched it."""
        op = f"open step {step} of job {self.job} rank {rank}"
        # Another rank's shard is read as a peer: during a recovery that
        # does not count as that rank's restore (but as this rank's when
        # the step has no shard of this rank's number: a grown gang).
        req = pb.OpenRequest(job=self.job, rank=rank, step=step, peer=rank != self.rank, ranged=ranged)
        if req.peer:
            req.reader_rank = self.rank
        for attempt in range(2):
            resp = self._call(op, "Open", req)
            try:
                m, h = self._map(op, resp.shard, resp.lease)
                break
            except BusyError:
                self._release(resp.lease)
                if attempt:  # else the agent restarted since the Open: once more
                    raise
            except CorruptError as e:
                if not resp.partial:
                    self._report(resp.shard, e)
                self._release(resp.lease)
                raise
            except BaseException:
                self._release(resp.lease)
                raise
        return OpenShard(self, resp.shard, resp.lease, m, h, {lv.tensor: list(lv.hashes) for lv in resp.leaves},
                         partial=resp.partial)

    def _report(self, sh, err: RewindError) -> None:
        req = pb.VerifyRequest(job=sh.job, rank=sh.rank, step=sh.step, detail=err.message)
        # Failing is fine: the agent re-verifies every shard it serves after a restart.
        self._agent.call_quietly("ReportCorrupt", req, self.timeout)

    def _release(self, lease: int) -> None:
        self._agent.call_quietly("Release", pb.ReleaseRequest(lease=lease), RELEASE_TIMEOUT)  # else it expires


class OpenShard:
    """A leased, mapped shard (Client.open_shard). shard: the agent's
    agent_pb2.Shard; header: its decoded header; mapping: the read-only
    mapping; leaves: each tensor's 1 MiB leaf hashes when the agent has
    verified the shard (empty otherwise), for verify_range; partial: the
    shard is another node's, its bytes readable once fill fetched them;
    fetched: the bytes fill fetched. Views of the mapping must be gone
    before close."""

    def __init__(self, client: Client, sh, lease: int, m: Mapping, h: fmt.Header, leaves: dict | None = None,
                 partial: bool = False):
        self.client, self.shard, self.lease, self.mapping, self.header = client, sh, lease, m, h
        self.partial, self.fetched = partial, 0
        self.leaves: dict[str, list[int]] = leaves or {}
        self._verified: set[str] = set()
        self._leaves_ok: dict[str, set[int]] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def view(self, name: str):
        """A flat torch tensor over tensor name's bytes (read-only memory:
        copy from it, never write to it)."""
        return torch_view(self.mapping.mv, self._tensor(name), self.header.data_start)

    def array(self, name: str) -> np.ndarray:
        """view as a flat numpy array: for the types torch lacks (unsigned
        of 2 to 8 bytes)."""
        return numpy_view(self.mapping.mv, self._tensor(name), self.header.data_start)

    def raw(self, name: str) -> memoryview:
        t = self._tensor(name)
        return self.mapping.mv[self.header.data_start + t.begin : self.header.data_start + t.end]

    def _tensor(self, name: str) -> fmt.TensorInfo:
        t = self.header.tensor(name)
        if t is None:
            raise RewindError(f"read job {self.shard.job} rank {self.shard.rank} step {self.shard.step}",
                              f"the shard has no tensor {name!r}")
        return t

    def fill(self, ranges) -> int:
        """Makes byte ranges ((offset within the shard, length) pairs) of a
        partially open shard readable: the agent fetches the 1 MiB leaves
        they touch from a peer's memory, each checked against its hash
        (CorruptError when no peer has a good one). Nothing to do on a
        shard opened whole. Returns the bytes fetched."""
        ranges = [(int(o), int(n)) for o, n in ranges if n > 0]
        if not self.partial or not ranges:
            return 0
        op = f"fetch {len(ranges)} ranges of job {self.shard.job} rank {self.shard.rank} step {self.shard.step}"
        req = pb.FillRequest(lease=self.lease, ranges=[pb.ByteRange(offset=o, length=n) for o, n in ranges])
        resp = self.client._call(op, "Fill", req, FILL_TIMEOUT)
        self.fetched += resp.fetched_bytes
        return resp.fetched_bytes

    def tensor_range(self, name: str, lo: int = 0, hi: int | None = None) -> tuple[int, int]:
        """Bytes [lo, hi) of tensor name (all of it by default) as an
        (offset within the shard, length) pair, for fill."""
        t = self._tensor(name)
        hi = t.nbytes if hi is None else hi
        return self.header.data_start + t.begin + lo, hi - lo

    def verify(self, names) -> None:
        """Checks the checksums of the named tensors (each once per open);
        a mismatch is reported to the agent, which never serves the shard
        again, and raised as CorruptError."""
        todo = [self._tensor(n) for n in dict.fromkeys(names) if n not in self._verified]
        if not todo:
            return
        op = f"read job {self.shard.job} rank {self.shard.rank} step {self.shard.step}"
        ts = [copier.Transfer(self.header.data_start + t.begin, t.nbytes) for t in todo]
        sums = copier.copy_and_sum(self.mapping.mv, ts, self.client.workers)
        sub = fmt.Header(self.header.meta, todo)
        try:
            shard.check_sums(sub, sums, op)
        except CorruptError as e:
            if not self.partial:  # the agent checked what it fetched: this node holds no copy to mark
                self.client._report(self.shard, e)
            raise
        self._verified.update(t.name for t in todo)

    def verify_range(self, name: str, lo: int, hi: int) -> int:
        """Checks bytes [lo, hi) of tensor name by the leaves they touch,
        against the agent's leaf hashes (each leaf once per open), or the
        whole tensor (verify) when the agent gave none; returns the bytes
        hashed. A mismatch is reported and raised as CorruptError."""
        t, leaves = self._tensor(name), self.leaves.get(name)
        if leaves is None or t.sum is None or name in self._verified:
            if name in self._verified:
                return 0
            self.verify([name])
            return t.nbytes
        done = self._leaves_ok.setdefault(name, set())
        hashed, problem = checksum.verify_range(self.raw(name), lo, hi, leaves, t.sum, done)
        if problem is not None:
            e = CorruptError(f"read job {self.shard.job} rank {self.shard.rank} step {self.shard.step}",
                             f"tensor {name!r}: {problem}")
            if not self.partial:
                self.client._report(self.shard, e)
            raise e
        return hashed

    def close(self) -> None:
        if self.mapping is not None:
            self.mapping.close()
            self.mapping = None  # type: ignore[assignment]
            self.client._release(self.lease)
