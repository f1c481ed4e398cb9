from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
FETCH_FAILURE_CORRUPT: FetchFailure
FETCH_FAILURE_NO_ROOM: FetchFailure
FETCH_FAILURE_UNAVAILABLE: FetchFailure
FETCH_FAILURE_UNREACHABLE: FetchFailure
FETCH_FAILURE_UNSPECIFIED: FetchFailure
SHARD_STATE_COMMITTED: ShardState
SHARD_STATE_CORRUPT: ShardState
SHARD_STATE_FREE: ShardState
SHARD_STATE_STAGED: ShardState
SHARD_STATE_UNSPECIFIED: ShardState
SHARD_STATE_WRITING: ShardState

class ByteRange(_message.Message):
    __slots__ = ["length", "offset"]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    length: int
    offset: int
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ["header_checksum", "job", "rank", "slot", "step", "token"]
    HEADER_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    header_checksum: str
    job: str
    rank: int
    slot: int
    step: int
    token: int
    def __init__(self, job: _Optional[str] = ..., rank: _Optional[int] = ..., slot: _Optional[int] = ..., token: _Optional[int] = ..., step: _Optional[int] = ..., header_checksum: _Optional[str] = ...) -> None: ...

class CommitResponse(_message.Message):
    __slots__ = ["seq", "step"]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    seq: int
    step: int
    def __init__(self, step: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class ConsistentRequest(_message.Message):
    __slots__ = ["job"]
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class ConsistentResponse(_message.Message):
    __slots__ = ["step", "world_size"]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    step: int
    world_size: int
    def __init__(self, step: _Optional[int] = ..., world_size: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ["all_ranks", "job", "rank", "step"]
    ALL_RANKS_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    all_ranks: bool
    job: str
    rank: int
    step: int
    def __init__(self, job: _Optional[str] = ..., rank: _Optional[int] = ..., all_ranks: bool = ..., step: _Optional[int] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ["bytes_freed", "deleted"]
    BYTES_FREED_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    bytes_freed: int
    deleted: int
    def __init__(self, deleted: _Optional[int] = ..., bytes_freed: _Optional[int] = ...) -> None: ...

class FetchAttempt(_message.Message):
    __slots__ = ["error", "failure", "tier"]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    error: str
    failure: FetchFailure
    tier: str
    def __init__(self, tier: _Optional[str] = ..., error: _Optional[str] = ..., failure: _Optional[_Union[FetchFailure, str]] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ["header_checksum", "job", "rank", "size_bytes", "sources", "stage", "step", "tiers", "world_size"]
    HEADER_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    header_checksum: str
    job: str
    rank: int
    size_bytes: int
    sources: _containers.RepeatedCompositeFieldContainer[FetchSource]
    stage: str
    step: int
    tiers: _containers.RepeatedScalarFieldContainer[str]
    world_size: int
    def __init__(self, job: _Optional[str] = ..., rank: _Optional[int] = ..., step: _Optional[int] = ..., tiers: _Optional[_Iterable[str]] = ..., sources: _Optional[_Iterable[_Union[FetchSource, _Mapping]]] = ..., world_size: _Optional[int] = ..., size_bytes: _Optional[int] = ..., header_checksum: _Optional[str] = ..., stage: _Optional[str] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ["failed", "size_bytes", "staged", "step", "tier"]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    failed: _containers.RepeatedCompositeFieldContainer[FetchAttempt]
    size_bytes: int
    staged: bool
    step: int
    tier: str
    def __init__(self, step: _Optional[int] = ..., tier: _Optional[str] = ..., size_bytes: _Optional[int] = ..., failed: _Optional[_Iterable[_Union[FetchAttempt, _Mapping]]] = ..., staged: bool = ...) -> None: ...

class FetchSource(_message.Message):
    __slots__ = ["addr", "node", "tier"]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    addr: str
    node: str
    tier: str
    def __init__(self, tier: _Optional[str] = ..., node: _Optional[str] = ..., addr: _Optional[str] = ...) -> None: ...

class FillRequest(_message.Message):
    __slots__ = ["lease", "ranges"]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    lease: int
    ranges: _containers.RepeatedCompositeFieldContainer[ByteRange]
    def __init__(self, lease: _Optional[int] = ..., ranges: _Optional[_Iterable[_Union[ByteRange, _Mapping]]] = ...) -> None: ...

class FillResponse(_message.Message):
    __slots__ = ["fetched_bytes", "node"]
    FETCHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    fetched_bytes: int
    node: str
    def __init__(self, fetched_bytes: _Optional[int] = ..., node: _Optional[str] = ...) -> None: ...

class FinishRestoreRequest(_message.Message):
    __slots__ = ["commit", "job", "stage"]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    commit: bool
    job: str
    stage: str
    def __init__(self, job: _Optional[str] = ..., stage: _Optional[str] = ..., commit: bool = ...) -> None: ...

class FinishRestoreResponse(_message.Message):
    __slots__ = ["shards"]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: int
    def __init__(self, shards: _Optional[int] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ["job"]
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ["shards"]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[Shard]
    def __init__(self, shards: _Optional[_Iterable[_Union[Shard, _Mapping]]] = ...) -> None: ...

class OpenRequest(_message.Message):
    __slots__ = ["job", "latest", "peer", "ranged", "rank", "reader_rank", "step"]
    JOB_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    RANGED_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    READER_RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    job: str
    latest: bool
    peer: bool
    ranged: bool
    rank: int
    reader_rank: int
    step: int
    def __init__(self, job: _Optional[str] = ..., rank: _Optional[int] = ..., step: _Optional[int] = ..., latest: bool = ..., peer: bool = ..., reader_rank: _Optional[int] = ..., ranged: bool = ...) -> None: ...

class OpenResponse(_message.Message):
    __slots__ = ["lease", "leaves", "partial", "shard"]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    LEAVES_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    lease: int
    leaves: _containers.RepeatedCompositeFieldContainer[TensorLeaves]
    partial: bool
    shard: Shard
    def __init__(self, shard: _Optional[_Union[Shard, _Mapping]] = ..., lease: _Optional[int] = ..., leaves: _Optional[_Iterable[_Union[TensorLeaves, _Mapping]]] = ..., partial: bool = ...) -> None: ...

class PrepareRequest(_message.Message):
    __slots__ = ["epoch", "job", "rank", "size_bytes", "step", "world_size"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    job: str
    rank: int
    size_bytes: int
    step: int
    world_size: int
    def __init__(self, job: _Optional[str] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., step: _Optional[int] = ..., size_bytes: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class PrepareResponse(_message.Message):
    __slots__ = ["epoch", "path", "resized", "segment_id", "size_bytes", "slot", "token"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RESIZED_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    path: str
    resized: bool
    segment_id: int
    size_bytes: int
    slot: int
    token: int
    def __init__(self, slot: _Optional[int] = ..., path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., token: _Optional[int] = ..., resized: bool = ..., epoch: _Optional[int] = ..., segment_id: _Optional[int] = ...) -> None: ...

class ReadChunk(_message.Message):
    __slots__ = ["data", "offset", "shard"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    shard: Shard
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., shard: _Optional[_Union[Shard, _Mapping]] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ["job", "rank", "step"]
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    job: str
    rank: int
    step: int
    def __init__(self, job: _Optional[str] = ..., rank: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ["lease"]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: int
    def __init__(self, lease: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class SegmentRequest(_message.Message):
    __slots__ = ["job", "job_token", "lease", "rank", "save_token", "slot"]
    JOB_FIELD_NUMBER: _ClassVar[int]
    JOB_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SAVE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    job: str
    job_token: str
    lease: int
    rank: int
    save_token: int
    slot: int
    def __init__(self, job: _Optional[str] = ..., rank: _Optional[int] = ..., slot: _Optional[int] = ..., job_token: _Optional[str] = ..., save_token: _Optional[int] = ..., lease: _Optional[int] = ...) -> None: ...

class SegmentResponse(_message.Message):
    __slots__ = ["code", "error", "segment_id", "size_bytes"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    code: int
    error: str
    segment_id: int
    size_bytes: int
    def __init__(self, code: _Optional[int] = ..., error: _Optional[str] = ..., size_bytes: _Optional[int] = ..., segment_id: _Optional[int] = ...) -> None: ...

class Shard(_message.Message):
    __slots__ = ["committed_unix_nano", "header_checksum", "job", "path", "problem", "rank", "seq", "size_bytes", "slot", "state", "step", "tensors", "verified", "world_size"]
    COMMITTED_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    HEADER_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    committed_unix_nano: int
    header_checksum: str
    job: str
    path: str
    problem: str
    rank: int
    seq: int
    size_bytes: int
    slot: int
    state: ShardState
    step: int
    tensors: int
    verified: bool
    world_size: int
    def __init__(self, job: _Optional[str] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., step: _Optional[int] = ..., slot: _Optional[int] = ..., path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., state: _Optional[_Union[ShardState, str]] = ..., seq: _Optional[int] = ..., header_checksum: _Optional[str] = ..., committed_unix_nano: _Optional[int] = ..., verified: bool = ..., tensors: _Optional[int] = ..., problem: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ["budget_bytes", "filesystem", "fs_free_bytes", "fs_size_bytes", "node", "shm_root", "slots_per_rank", "tiers", "used_bytes", "version"]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    FILESYSTEM_FIELD_NUMBER: _ClassVar[int]
    FS_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FS_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    SHM_ROOT_FIELD_NUMBER: _ClassVar[int]
    SLOTS_PER_RANK_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    budget_bytes: int
    filesystem: str
    fs_free_bytes: int
    fs_size_bytes: int
    node: str
    shm_root: str
    slots_per_rank: int
    tiers: _containers.RepeatedScalarFieldContainer[str]
    used_bytes: int
    version: str
    def __init__(self, node: _Optional[str] = ..., shm_root: _Optional[str] = ..., filesystem: _Optional[str] = ..., fs_size_bytes: _Optional[int] = ..., fs_free_bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., slots_per_rank: _Optional[int] = ..., version: _Optional[str] = ..., tiers: _Optional[_Iterable[str]] = ...) -> None: ...

class TensorLeaves(_message.Message):
    __slots__ = ["hashes", "tensor"]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    hashes: _containers.RepeatedScalarFieldContainer[int]
    tensor: str
    def __init__(self, tensor: _Optional[str] = ..., hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class TierCopiesPage(_message.Message):
    __slots__ = ["listings", "manifests"]
    LISTINGS_FIELD_NUMBER: _ClassVar[int]
    MANIFESTS_FIELD_NUMBER: _ClassVar[int]
    listings: _containers.RepeatedCompositeFieldContainer[TierListing]
    manifests: _containers.RepeatedCompositeFieldContainer[TierManifest]
    def __init__(self, manifests: _Optional[_Iterable[_Union[TierManifest, _Mapping]]] = ..., listings: _Optional[_Iterable[_Union[TierListing, _Mapping]]] = ...) -> None: ...

class TierCopiesRequest(_message.Message):
    __slots__ = ["max_manifests", "max_steps_per_job", "tiers"]
    MAX_MANIFESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_PER_JOB_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    max_manifests: int
    max_steps_per_job: int
    tiers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tiers: _Optional[_Iterable[str]] = ..., max_manifests: _Optional[int] = ..., max_steps_per_job: _Optional[int] = ...) -> None: ...

class TierListing(_message.Message):
    __slots__ = ["error", "jobs", "manifests", "skipped", "store", "tier", "truncated"]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    MANIFESTS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    error: str
    jobs: int
    manifests: int
    skipped: int
    store: str
    tier: str
    truncated: bool
    def __init__(self, tier: _Optional[str] = ..., store: _Optional[str] = ..., jobs: _Optional[int] = ..., manifests: _Optional[int] = ..., skipped: _Optional[int] = ..., truncated: bool = ..., error: _Optional[str] = ...) -> None: ...

class TierManifest(_message.Message):
    __slots__ = ["job", "ranks_here", "shards", "step", "tier", "world_size", "written_unix_nano"]
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANKS_HERE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    job: str
    ranks_here: _containers.RepeatedScalarFieldContainer[int]
    shards: _containers.RepeatedCompositeFieldContainer[TierShard]
    step: int
    tier: str
    world_size: int
    written_unix_nano: int
    def __init__(self, tier: _Optional[str] = ..., job: _Optional[str] = ..., step: _Optional[int] = ..., world_size: _Optional[int] = ..., shards: _Optional[_Iterable[_Union[TierShard, _Mapping]]] = ..., ranks_here: _Optional[_Iterable[int]] = ..., written_unix_nano: _Optional[int] = ...) -> None: ...

class TierShard(_message.Message):
    __slots__ = ["header_checksum", "rank", "size_bytes"]
    HEADER_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    header_checksum: str
    rank: int
    size_bytes: int
    def __init__(self, rank: _Optional[int] = ..., size_bytes: _Optional[int] = ..., header_checksum: _Optional[str] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ["detail", "job", "rank", "step", "tier"]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    detail: str
    job: str
    rank: int
    step: int
    tier: str
    def __init__(self, job: _Optional[str] = ..., rank: _Optional[int] = ..., step: _Optional[int] = ..., detail: _Optional[str] = ..., tier: _Optional[str] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ["bytes_checked", "ok", "problem"]
    BYTES_CHECKED_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    bytes_checked: int
    ok: bool
    problem: str
    def __init__(self, ok: bool = ..., problem: _Optional[str] = ..., bytes_checked: _Optional[int] = ...) -> None: ...

class FetchFailure(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ShardState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
