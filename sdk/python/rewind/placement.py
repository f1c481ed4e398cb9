"""Where restored tensors go: torch.load's map_location, for shards.

Every shard tensor has a saved location, as torch.save records one: the
device it was saved from ("cpu", "cuda:0"; the objects document's
"devices", "cpu" when absent). map_location is what torch.load accepts:

- a device or its name: every tensor goes there;
- None: every tensor goes back where it was saved;
- a dict from saved location to location ({"cuda:1": "cuda:0"}): a
  tensor whose saved location is a key goes to its value, others where
  they were saved;
- a callable(storage, location) -> storage, called once per stored
  storage with it on the CPU (an UntypedStorage) and its saved location,
  returning the storage to use (on any device), or None for the saved
  location.

A location that cannot hold the tensors (a CUDA device in a process
without one, a name that is no device, the meta device) is a RewindError
naming it, never torch's own TypeError, AssertionError or RuntimeError.
"""

from __future__ import annotations

from typing import Callable

import torch

from .errors import InvalidError, RewindError

_KINDS = "a device, its name, None, a dict from saved location to location, or a callable(storage, location)"


class Placement:
    """A parsed map_location; op names the restore in its errors."""

    def __init__(self, map_location, op: str):
        self.op = op
        self.fn: Callable | None = None
        self.fixed: torch.device | None = None
        self.mapping: dict[str, str] | None = None
        if map_location is None:
            return
        if isinstance(map_location, (str, torch.device)):
            self.fixed = self._device(map_location, "map_location is")
        elif isinstance(map_location, dict):
            self.mapping = {}
            for k, v in map_location.items():
                if not isinstance(k, (str, torch.device)) or not isinstance(v, (str, torch.device)):
                    raise InvalidError(op, f"map_location dict entry {k!r}: {v!r}: keys and values must be "
                                       "location names or devices")
                self.mapping[str(k)] = str(v)
        elif callable(map_location):
            self.fn = map_location
        else:
            raise InvalidError(op, f"map_location {map_location!r} ({type(map_location).__name__}) must be {_KINDS}")

    def device(self, name: str, saved: str) -> torch.device:
        """The device a shard tensor saved at saved is copied onto (the CPU
        when a callable decides afterwards, in relocate)."""
        if self.fixed is not None:
            return self.fixed
        if self.fn is not None:
            return torch.device("cpu")
        if self.mapping is not None and saved in self.mapping:
            return self._device(self.mapping[saved], f"tensor {name!r} was saved on {saved}, which map_location maps to")
        return self._device(saved, f"tensor {name!r} was saved on {saved}, where map_location leaves it")

    def relocate(self, name: str, t: torch.Tensor, saved: str) -> torch.Tensor:
        """The callable's choice for a tensor restored on the CPU."""
        assert self.fn is not None
        storage = untyped(t)
        try:
            got = self.fn(storage, saved)
        except Exception as e:
            raise RewindError(self.op, f"map_location({saved!r}) for tensor {name!r} raised "
                              f"{type(e).__name__}: {e}") from e
        if got is None:
            dev = self._device(saved, f"tensor {name!r} was saved on {saved}, where map_location returned None for")
            return t if dev.type == "cpu" else self._to(name, t, dev)
        if isinstance(got, torch.storage.TypedStorage):
            got = got.untyped()
        nbytes = getattr(got, "nbytes", None)
        if not callable(nbytes) or not hasattr(got, "device"):
            raise InvalidError(self.op, f"map_location returned {type(got).__name__} for tensor {name!r}, "
                               "not a storage (or None)")
        if nbytes() != storage.nbytes():
            raise InvalidError(self.op, f"map_location returned a storage of {nbytes()} bytes for tensor {name!r}, "
                               f"which has {storage.nbytes()}")
        try:
            return torch.empty(0, dtype=t.dtype, device=got.device).set_(got, 0, t.shape, t.stride())
        except (TypeError, RuntimeError) as e:
            raise InvalidError(self.op, f"map_location's storage for tensor {name!r}: {e}") from None

    def _device(self, spec, what: str) -> torch.device:
        try:
            dev = torch.device(spec)
        except (RuntimeError, TypeError, ValueError) as e:
            raise InvalidError(self.op, f"{what} {spec!r}, which is not a device: {e}") from None
        if dev.type == "meta":
            raise InvalidError(self.op, f"{what} meta, a device without data")
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise RewindError(self.op, f"{what} {dev}, and this process has no CUDA device "
                                  "(torch.cuda.is_available() is false); map_location can send tensors "
                                  "elsewhere (\"cpu\", or {\"cuda:0\": \"cpu\"})")
            if dev.index is not None and dev.index >= torch.cuda.device_count():
                raise RewindError(self.op, f"{what} {dev}, and this process has {torch.cuda.device_count()} CUDA devices")
        return dev

    def _to(self, name: str, t: torch.Tensor, dev: torch.device) -> torch.Tensor:
        try:
            return t.to(dev)
        except (RuntimeError, AssertionError, TypeError) as e:
            raise RewindError(self.op, f"moving tensor {name!r} to {dev}: {e}") from None


def untyped(t: torch.Tensor):
    untyped = getattr(t, "untyped_storage", None)  # torch 2; 1.x: the typed storage's
    return untyped() if untyped is not None else t.storage().untyped()
