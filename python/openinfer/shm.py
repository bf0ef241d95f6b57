"""Shared memory for the client: POSIX shm regions this process creates, and the pool of them
that `openinfer.Client` stages tensors in when the server runs on the same host.

    region = openinfer.SharedMemoryRegion(1 << 20)     # made here, mapped here
    client.register(region)                            # the server maps it too
    x = region.array((256, 256), np.float32)           # fill x in place...
    out = client.infer("m", {"INPUT0": x})             # ...and it is read where it lies

A region is a POSIX shm object ("/oi_<pid>_<hex>") mapped into this process; its memory stays
mapped while any array viewing it lives, whatever happens to the region object, so closing a
region or a client never leaves an array dangling. The pool's regions are unlinked as soon as
the server has mapped them, so none of them outlives this process in /dev/shm even if it is
killed; explicit regions are unlinked by close() and at exit.
"""

from __future__ import annotations

import atexit
import ctypes
import math
import mmap
import os
import struct
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

try:
    import _posixshmem  # CPython's own shm_open/shm_unlink, what multiprocessing.shared_memory uses
except ImportError:  # pragma: no cover - Windows, or a Python without it
    _posixshmem = None

# Region sizes are multiples of this (and staged tensors start on ALIGN boundaries).
GRANULE = 1 << 20
ALIGN = 64


def available() -> bool:
    """Whether this Python can create POSIX shared memory."""
    return _posixshmem is not None


class SharedMemoryRegion:
    """`byte_size` bytes of POSIX shared memory created by this process. `name` is the name the
    server knows it by once registered (a unique one by default); `key` the shm object's name.
    Use as a context manager, or close() it."""

    def __init__(self, byte_size: int, *, name: str | None = None) -> None:
        if _posixshmem is None:
            raise OSError("POSIX shared memory is not available in this Python")
        if byte_size < 1:
            raise ValueError(f"byte_size must be at least 1, got {byte_size}")
        uid = uuid.uuid4().hex[:16]
        self.key = f"/oi_{os.getpid()}_{uid}"
        self.name = name or self.key[1:]
        self.byte_size = int(byte_size)
        fd = _posixshmem.shm_open(self.key, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            os.ftruncate(fd, self.byte_size)
            self._map = mmap.mmap(fd, self.byte_size)
        except BaseException:
            _posixshmem.shm_unlink(self.key)
            raise
        finally:
            os.close(fd)
        # Every view derives from this one array; the mapping goes with the last of them.
        self._bytes: np.ndarray | None = np.frombuffer(self._map, dtype=np.uint8)
        self.address = self._bytes.ctypes.data
        self._linked = True
        _linked.add(self)

    def array(self, shape: int | tuple[int, ...], dtype: Any, offset: int = 0) -> np.ndarray:
        """A C-contiguous numpy view of the region: `shape` elements of `dtype` from `offset`."""
        if self._bytes is None:
            raise ValueError("the region is closed")
        dt = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        n = math.prod(shape) * dt.itemsize
        if offset < 0 or offset + n > self.byte_size:
            raise ValueError(f"{n} bytes at offset {offset} do not fit the region's {self.byte_size} bytes")
        if offset % dt.alignment:
            raise ValueError(f"offset {offset} is not aligned for {dt}")
        return self._bytes[offset : offset + n].view(dt).reshape(shape)

    def offset_of(self, arr: np.ndarray) -> int | None:
        """Where `arr`'s bytes start in this region, if it is a C-contiguous array inside it."""
        if self._bytes is None or not arr.flags.c_contiguous:
            return None
        start = arr.__array_interface__["data"][0] - self.address
        return start if 0 <= start and start + arr.nbytes <= self.byte_size else None

    def unlink(self) -> None:
        """Removes the shm object's name; the memory lives on while mapped (here or by a server)."""
        if self._linked:
            self._linked = False
            _linked.discard(self)
            try:
                _posixshmem.shm_unlink(self.key)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Unlinks the region and drops this object's view of it; arrays still viewing it keep
        the memory until they go."""
        self.unlink()
        self._bytes = None
        self._map = None

    @property
    def closed(self) -> bool:
        return self._bytes is None

    def __enter__(self) -> SharedMemoryRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<openinfer.SharedMemoryRegion {self.name!r} key={self.key!r} {self.byte_size} bytes>"


# Regions whose names still exist: unlinked at exit so that /dev/shm is left clean.
_linked: weakref.WeakSet[SharedMemoryRegion] = weakref.WeakSet()


@atexit.register
def _unlink_all() -> None:
    for region in list(_linked):
        region.unlink()


def serialize_bytes(arr: np.ndarray) -> bytes:
    """BYTES elements as the protocol lays them out: a 4-byte little-endian length, then the
    bytes, per element in C order."""
    parts = []
    for x in arr.reshape(-1):
        b = x.encode() if isinstance(x, str) else bytes(x)
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def deserialize_bytes(buf: Any, count: int) -> np.ndarray:
    """`count` BYTES elements from `buf` as an object array of bytes (a copy)."""
    mv = memoryview(buf)
    out = np.empty(count, dtype=object)
    off = 0
    for i in range(count):
        (n,) = struct.unpack_from("<I", mv, off)
        out[i] = bytes(mv[off + 4 : off + 4 + n])
        off += 4 + n
    return out


class Slot:
    """One pooled region: a call stages its inputs and receives its outputs in it. It is busy
    from the call until the last output array viewing it is gone."""

    def __init__(self, region: SharedMemoryRegion) -> None:
        self.region = region
        self.leases = 0


class Pool:
    """The regions a client stages tensors in, registered with its server once each.
    `register(name, key, byte_size)` and `unregister(name)` talk to the server (raising
    InferenceServerError when it refuses); at most `max_slots` regions exist at a time."""

    def __init__(self, register: Callable[[str, str, int], None], unregister: Callable[[str], None],
                 max_slots: int) -> None:
        self._register = register
        self._unregister = unregister
        self._max = max_slots
        self._lock = threading.Lock()
        self._free: list[Slot] = []
        self._busy: weakref.WeakSet[Slot] = weakref.WeakSet()
        self._count = 0
        self._closed = False

    def acquire(self, need: int) -> Slot | None:
        """A free slot of at least `need` bytes (made or grown as needed), or None when every
        slot is busy and no more may be made. Raises when the server refuses a registration."""
        stale = None
        with self._lock:
            if self._closed:
                return None
            fits = [s for s in self._free if s.region.byte_size >= need]
            if fits:
                slot = min(fits, key=lambda s: s.region.byte_size)
                self._free.remove(slot)
                self._busy.add(slot)
                return slot
            if self._free:  # grow one: drop the largest free slot, make a bigger one
                stale = max(self._free, key=lambda s: s.region.byte_size)
                self._free.remove(stale)
                need = max(need, stale.region.byte_size * 3 // 2)
            elif self._count >= self._max:
                return None
            else:
                self._count += 1
        if stale is not None:
            self._drop(stale)
        try:
            slot = Slot(self._new_region(need))
            with self._lock:
                self._busy.add(slot)
            return slot
        except BaseException:
            with self._lock:
                self._count -= 1
            raise

    def _new_region(self, need: int) -> SharedMemoryRegion:
        size = -(-need // GRANULE) * GRANULE
        region = SharedMemoryRegion(size)
        try:
            self._register(region.name, region.key, size)
        except BaseException:
            region.close()
            raise
        region.unlink()  # the server has it mapped: the name is no longer needed
        return region

    def _drop(self, slot: Slot) -> None:
        try:
            self._unregister(slot.region.name)
        except Exception:  # noqa: BLE001 - the server may be gone; the memory goes with us anyway
            pass
        slot.region.close()

    def view(self, slot: Slot, offset: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
        """An array of `shape` and `dtype` viewing the slot's region at `offset`, that keeps the
        slot busy while it or any array derived from it lives. (numpy collapses a view's base
        to the first object that is not an array, so the lease is that object: a ctypes array
        over the mapping, which takes a weak reference where a memoryview cannot.)"""
        n = math.prod(shape) * dtype.itemsize
        if n == 0:
            return np.empty(shape, dtype=dtype)
        holder = (ctypes.c_char * n).from_buffer(slot.region._map, offset)
        with self._lock:
            slot.leases += 1
        weakref.finalize(holder, self._unlease, slot)
        return np.frombuffer(holder, dtype=dtype).reshape(shape)

    def _unlease(self, slot: Slot) -> None:
        with self._lock:
            slot.leases -= 1
            if slot.leases > 0:
                return
        self.release(slot)

    def release(self, slot: Slot) -> None:
        """Returns a slot after its call, unless output arrays still view it."""
        with self._lock:
            if slot.leases > 0 or slot not in self._busy:
                return
            self._busy.discard(slot)
            if not self._closed:
                self._free.append(slot)
                return
            self._count -= 1
        self._drop(slot)

    def discard(self, slot: Slot) -> None:
        """Drops a busy slot for good (its call got no answer; the server may still write it)."""
        with self._lock:
            if slot not in self._busy:
                return
            self._busy.discard(slot)
            self._count -= 1
        self._drop(slot)

    def close(self, busy_too: bool = False) -> None:
        """Unregisters every free slot now and each busy one when it is released; with
        `busy_too` (at exit, when the arrays go with the process) the busy ones now too."""
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
            self._count -= len(free)
            busy = list(self._busy) if busy_too else []
            for slot in busy:
                self._busy.discard(slot)
        for slot in free + busy:
            self._drop(slot)


# ---- the gRPC messages of shared-memory calls ---------------------------------------------------
#
# Over gRPC the pool registers regions and sends inference requests whose tensors carry no bytes,
# so these few small messages are written and read here on the protobuf wire (field numbers as
# in proto/grpc_service.proto, which are Triton's).

GRPC_SERVICE = "/inference.GRPCInferenceService/"


def _varint(v: int) -> bytes:
    out = bytearray()
    v &= (1 << 64) - 1  # negative int64 values go as ten-byte two's complement, as protobuf has it
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _field_bytes(num: int, data: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def _field_varint(num: int, v: int) -> bytes:
    return _varint(num << 3) + _varint(v)


def _param(value: Any) -> bytes:
    """An InferParameter: bool 1, int64 2, string 3, double 4."""
    if isinstance(value, bool):
        return _field_varint(1, int(value))
    if isinstance(value, int):
        return _field_varint(2, value)
    if isinstance(value, float):
        return _varint(4 << 3 | 1) + struct.pack("<d", value)
    return _field_bytes(3, str(value).encode())


def _params(num: int, params: dict[str, Any]) -> bytes:
    return b"".join(_field_bytes(num, _field_bytes(1, k.encode()) + _field_bytes(2, _param(v)))
                    for k, v in params.items())


def encode_register(name: str, key: str, offset: int, byte_size: int) -> bytes:
    """SystemSharedMemoryRegisterRequest."""
    return (_field_bytes(1, name.encode()) + _field_bytes(2, key.encode()) + _field_varint(3, offset)
            + _field_varint(4, byte_size))


def encode_cuda_register(name: str, handle: bytes, device_id: int, byte_size: int) -> bytes:
    """CudaSharedMemoryRegisterRequest."""
    return (_field_bytes(1, name.encode()) + _field_bytes(2, handle) + _field_varint(3, device_id)
            + _field_varint(4, byte_size))


def decode_status(data: bytes) -> list[dict[str, Any]]:
    """SystemSharedMemoryStatusResponse as the HTTP status body: name, key, offset, byte_size."""
    out = []
    for num, _, entry in _fields(data):
        if num != 1:
            continue
        for f, _, value in _fields(entry):
            if f == 2:
                r: dict[str, Any] = {"name": "", "key": "", "offset": 0, "byte_size": 0}
                for k, _, v in _fields(value):
                    if k in (1, 2):
                        r["name" if k == 1 else "key"] = v.decode()
                    elif k in (3, 4):
                        r["offset" if k == 3 else "byte_size"] = v
                out.append(r)
    return out


def encode_name(name: str) -> bytes:
    """SystemSharedMemoryUnregisterRequest (and the status requests): name = 1."""
    return _field_bytes(1, name.encode()) if name else b""


def encode_infer_request(body: dict[str, Any], model: str, version: str) -> bytes:
    """ModelInferRequest from the JSON-shaped request the HTTP path sends (tensors carry their
    data in shared memory only)."""
    out = [_field_bytes(1, model.encode())]
    if version:
        out.append(_field_bytes(2, version.encode()))
    if body.get("id") is not None:
        out.append(_field_bytes(3, str(body["id"]).encode()))
    if body.get("parameters"):
        out.append(_params(4, body["parameters"]))
    for t in body.get("inputs", []):
        shape = b"".join(_varint(d) for d in t["shape"])
        msg = (_field_bytes(1, t["name"].encode()) + _field_bytes(2, t["datatype"].encode())
               + _field_bytes(3, shape) + _params(4, t.get("parameters") or {}))
        out.append(_field_bytes(5, msg))
    for o in body.get("outputs", []):
        out.append(_field_bytes(6, _field_bytes(1, o["name"].encode()) + _params(2, o.get("parameters") or {})))
    return b"".join(out)


def _fields(data: bytes) -> Any:
    """(number, wire type, value) of each field: ints for varints and fixed64, bytes else."""
    i, n = 0, len(data)

    def varint() -> int:
        nonlocal i
        v = shift = 0
        while True:
            if i >= n:
                raise ValueError("truncated varint")
            b = data[i]
            i += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v

    while i < n:
        key = varint()
        num, wt = key >> 3, key & 7
        if wt == 0:
            yield num, wt, varint()
        elif wt == 1:
            yield num, wt, struct.unpack_from("<q", data, i)[0]
            i += 8
        elif wt == 2:
            ln = varint()
            yield num, wt, data[i : i + ln]
            i += ln
        elif wt == 5:
            i += 4
        else:
            raise ValueError(f"unsupported wire type {wt}")


def _decode_param(data: bytes) -> Any:
    value: Any = None
    for num, wt, v in _fields(data):
        if num == 1:
            value = bool(v)
        elif num == 2:
            value = v - (1 << 64) if v >= 1 << 63 else v
        elif num == 3:
            value = v.decode()
        elif num == 4:
            value = struct.unpack("<d", struct.pack("<q", v))[0]
        elif num == 5:
            value = v
    return value


def decode_infer_response(data: bytes) -> dict[str, Any]:
    """A ModelInferResponse as the JSON-shaped reply of the HTTP path; an output that came in
    raw_output_contents carries its bytes under "raw"."""
    outputs: list[dict[str, Any]] = []
    raw: list[bytes] = []
    for num, _, v in _fields(data):
        if num == 5:
            o: dict[str, Any] = {"name": "", "datatype": "", "shape": [], "parameters": {}}
            for f, wt, x in _fields(v):
                if f == 1:
                    o["name"] = x.decode()
                elif f == 2:
                    o["datatype"] = x.decode()
                elif f == 3:
                    o["shape"] += _packed_varints(x) if wt == 2 else [x]
                elif f == 4:
                    entry = {k: val for k, _, val in _fields(x)}
                    o["parameters"][entry.get(1, b"").decode()] = _decode_param(entry.get(2, b""))
            outputs.append(o)
        elif num == 6:
            raw.append(v)
    for o, r in zip(outputs, raw):
        if r:  # an output written into shared memory has an empty entry
            o["raw"] = r
    return {"outputs": outputs}


def _packed_varints(packed: bytes) -> list[int]:
    out, v, shift = [], 0, 0
    for b in packed:
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            out.append(v)
            v, shift = 0, 0
    return out
