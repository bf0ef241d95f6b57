"""BLS from a worker process: pb_utils' requests cross the process wire to the server (never a
socket of the network). The request goes as OI_PW_BLS with a memfd holding its description and
input bytes (csrc/backends/process_bls.h gives the layout); the executor that waits for the
worker's job runs it on the target's scheduler and answers with BLS_PART messages (a memfd of
outputs each, viewed here without a copy) and BLS_END. One call at a time per worker: the
executor serves them in turn, so several ``async_exec`` calls of a worker run one after another.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import threading
from typing import Any, NamedTuple

import numpy as np

from ..model import numpy_dtype
from . import triton_utils as pb

_SOCKET_FD = 3  # OI_PW_FD_SOCKET
_BLS, _BLS_PART, _BLS_END = 22, 4, 5  # OI_PW_BLS, OI_PW_BLS_PART, OI_PW_BLS_END (process_wire.h)
_SEQ_START, _SEQ_END, _DECOUPLED = 1, 2, 4  # OI_PW_BLS_*
_REPLY = struct.Struct("<IIIIQ")  # oi_pw_reply_t
_ALIGN = 64


def _string(value: str) -> bytes:
    data = value.encode()
    return struct.pack("<I", len(data)) + data


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


class _Call:
    """A call that has ended: its responses and its end, as `_core.BlsCall` gives them."""

    decoupled = False

    def __init__(self, items: list[Any]) -> None:
        self._items = items
        self.parameters: str | None = None  # of the response next() gave last
        self.final = False  # that response came with the target's final flag

    def next(self, timeout: float = -1) -> Any:
        item = self._items.pop(0) if self._items else None
        if isinstance(item, _Part):
            self.parameters, self.final = item.parameters, item.final
            return item.outputs
        return item

    def cancel(self) -> None:
        pass

    def fileno(self) -> int:
        return -1  # never awaited: every answer is here already


class WireHost:
    """The host pb_utils reaches in a worker process (`pb._default_host`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    def bls(self, model: str, version: str, inputs: list[tuple[str, str, np.ndarray]], outputs: list[str],
            *, request_id: str | None = None, parameters: str | None = None, timeout_us: int = 0,
            sequence_id: int = 0, sequence_id_str: str | None = None, sequence_start: bool = False,
            sequence_end: bool = False, decoupled: bool = False, caller: str | None = None,
            chain: str | None = None) -> _Call:  # fmt: skip
        del caller, chain  # the server knows them: the request this worker runs (oi__pw_serve_bls)
        flags = (_SEQ_START if sequence_start else 0) | (_SEQ_END if sequence_end else 0)
        flags |= _DECOUPLED if decoupled else 0
        datas = []
        for name, datatype, array in inputs:
            if datatype == "BYTES":
                encoded = pb.serialize_byte_tensor(array)
                datas.append(bytes(encoded) if encoded else b"")
            else:
                datas.append(memoryview(np.ascontiguousarray(array)).cast("B"))
        head = [struct.pack("<IIIIQQ", len(inputs), len(outputs), flags, 0, timeout_us, sequence_id)]
        head += [_string(s) for s in (model, version, request_id or "", parameters or "", sequence_id_str or "")]
        described = sum(4 + len(n.encode()) + 4 + len(d) + 4 + 8 * a.ndim + 16 for n, d, a in inputs)
        offset = _aligned(sum(map(len, head)) + described + sum(4 + len(o.encode()) for o in outputs))
        places = []
        for (name, datatype, array), data in zip(inputs, datas):
            head += [_string(name), _string(datatype), struct.pack("<I", array.ndim),
                     struct.pack(f"<{array.ndim}q", *array.shape), struct.pack("<QQ", offset, data.nbytes
                                                                               if isinstance(data, memoryview)
                                                                               else len(data))]  # fmt: skip
            places.append(offset)
            offset = _aligned(offset + (data.nbytes if isinstance(data, memoryview) else len(data)))
        head += [_string(o) for o in outputs]
        fd = os.memfd_create("openinfer-bls", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, max(offset, 64))
            with mmap.mmap(fd, max(offset, 64)) as area:
                header = b"".join(head)
                area[: len(header)] = header
                for at, data in zip(places, datas):
                    size = data.nbytes if isinstance(data, memoryview) else len(data)
                    area[at : at + size] = data
            with self._lock:
                return _Call(self._exchange(fd))
        finally:
            os.close(fd)

    def _exchange(self, fd: int) -> list[Any]:
        if self._sock is None:
            self._sock = socket.socket(fileno=os.dup(_SOCKET_FD))
        socket.send_fds(self._sock, [_REPLY.pack(_BLS, 0, 0, 0, 0)], [fd])
        items: list[Any] = []
        while True:
            message, fds, _, _ = socket.recv_fds(self._sock, 8192, 1)
            if not message:
                raise pb.TritonModelException("the server closed the worker's connection during a BLS request")
            kind, _, code, _, _ = _REPLY.unpack_from(message)
            if kind == _BLS_PART:
                items.append(_outputs(fds[0]))
                continue
            for extra in fds:
                os.close(extra)
            if kind != _BLS_END:
                raise pb.TritonModelException(f"unexpected message {kind} on the worker's wire during a BLS request")
            items.append((code, message[_REPLY.size :].decode(errors="replace")) if code else None)
            return items

    def load_model(self, *_: Any) -> None:
        raise pb.TritonModelException(_NO_CONTROL)

    def unload_model(self, *_: Any) -> None:
        raise pb.TritonModelException(_NO_CONTROL)

    def is_model_ready(self, *_: Any) -> bool:
        raise pb.TritonModelException(_NO_CONTROL)


_NO_CONTROL = ("model control (load_model, unload_model, is_model_ready) is not available in a worker process: give "
               "the model's instance_group kind KIND_MODEL to keep its instances in the server")


class _Part(NamedTuple):
    """One response of a BLS call: {name: (datatype, array)}, its parameters (JSON text) and
    whether the target's final flag came with it."""

    outputs: dict[str, tuple[str, np.ndarray]]
    parameters: str | None
    final: bool


def _outputs(fd: int) -> _Part:
    """A BLS_PART's memfd: its outputs, arrays viewing the mapping, and its parameters."""
    try:
        size = os.fstat(fd).st_size
        area = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    at = 0

    def take(fmt: str) -> tuple[Any, ...]:
        nonlocal at
        values = struct.unpack_from(fmt, area, at)
        at += struct.calcsize(fmt)
        return values

    def text() -> str:
        nonlocal at
        (n,) = take("<I")
        value = bytes(area[at : at + n]).decode()
        at += n
        return value

    (count, final, params_len, _) = take("<IIII")
    out: dict[str, tuple[str, np.ndarray]] = {}
    for _ in range(count):
        name, datatype = text(), text()
        (ndim,) = take("<I")
        shape = take(f"<{ndim}q")
        offset, nbytes = take("<QQ")
        if datatype == "BYTES":
            array = pb.deserialize_bytes_tensor(bytes(area[offset : offset + nbytes])).reshape(shape)
        else:
            dtype = numpy_dtype(datatype)
            array = np.frombuffer(area, dtype, nbytes // dtype.itemsize, offset).reshape(shape)
        out[name] = (datatype, array)
    return _Part(out, bytes(area[at : at + params_len]).decode() if params_len else None, bool(final))
