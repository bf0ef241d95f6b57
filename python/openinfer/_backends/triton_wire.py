"""BLS from a worker process: pb_utils' requests cross the process wire to the server (never a
socket of the network). The request goes as OI_PW_BLS with a memfd holding its description and
the input bytes that are not already the server's (csrc/backends/process_bls.h gives the layout):
an array that views one of the worker's own request inputs is named, not copied. The server
queues it on the target's scheduler and answers with BLS_PART messages (a memfd of outputs each,
viewed here without a copy) and BLS_END, tagged with the call's id, so a worker's calls from
several threads, or several ``async_exec`` on its event loop, are in flight at once; the worker's
reader thread (csrc/python/worker_mux.c) hands each answer to its call.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any, NamedTuple

import numpy as np

from .. import _core
from ..model import numpy_dtype
from . import triton_utils as pb

_SEQ_START, _SEQ_END, _DECOUPLED = 1, 2, 4  # OI_PW_BLS_*
_ALIGN = 64


def _string(value: str) -> bytes:
    data = value.encode()
    return struct.pack("<I", len(data)) + data


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


class _Call:
    """A call in flight, as `_core.BlsCall` is in the server process: next(timeout), fileno(),
    cancel(), and the parameters and final flag of the response next() gave last."""

    decoupled = False  # the server refuses a decoupled target without exec(decoupled=True)

    def __init__(self, call: Any) -> None:
        self._call = call
        self.parameters: str | None = None
        self.final = False

    def next(self, timeout: float = -1) -> Any:
        item = self._call.next(timeout)
        if isinstance(item, int) and not isinstance(item, bool):  # a response's memfd
            part = _outputs(item)
            self.parameters, self.final = part.parameters, part.final
            return part.outputs
        return item

    def cancel(self) -> None:
        self._call.cancel()

    def fileno(self) -> int:
        return int(self._call.fileno())


def _source(array: np.ndarray, job_inputs: tuple[tuple[int, int], ...]) -> tuple[int, int] | None:
    """(k, offset) when `array`'s bytes lie in input k-1 of the job the worker runs (the server
    has them: read-only views of the request, so what the server holds is what the model sees),
    else None."""
    if not array.flags.c_contiguous or array.flags.writeable or array.nbytes == 0:
        return None
    address = array.__array_interface__["data"][0]
    for k, (base, size) in enumerate(job_inputs, 1):
        if base <= address and address + array.nbytes <= base + size:
            return k, address - base
    return None


class WireHost:
    """The host pb_utils reaches in a worker process (`pb._default_host`)."""

    def bls(self, model: str, version: str, inputs: list[tuple[str, str, np.ndarray]], outputs: list[str],
            *, request_id: str | None = None, parameters: str | None = None, timeout_us: int = 0,
            sequence_id: int = 0, sequence_id_str: str | None = None, sequence_start: bool = False,
            sequence_end: bool = False, decoupled: bool = False, caller: str | None = None,
            chain: str | None = None) -> _Call:  # fmt: skip
        del caller, chain  # the server knows them: the request this worker runs (oi__pw_bls_start)
        flags = (_SEQ_START if sequence_start else 0) | (_SEQ_END if sequence_end else 0)
        flags |= _DECOUPLED if decoupled else 0
        head = [struct.pack("<IIIIQQ", len(inputs), len(outputs), flags, 0, timeout_us, sequence_id)]
        head += [_string(s) for s in (model, version, request_id or "", parameters or "", sequence_id_str or "")]
        job = _core.worker_job_inputs()
        while True:
            fd = _request(head, inputs, outputs, job[1] if job is not None else ())
            try:
                call = _core.worker_bls(fd, job[0] if job is not None else None)
            finally:
                os.close(fd)
            if call is not None:
                return _Call(call)
            job = None  # the job whose inputs it named has ended: its bytes go in the memfd

    def load_model(self, *_: Any) -> None:
        raise pb.TritonModelException(_NO_CONTROL)

    def unload_model(self, *_: Any) -> None:
        raise pb.TritonModelException(_NO_CONTROL)

    def is_model_ready(self, *_: Any) -> bool:
        raise pb.TritonModelException(_NO_CONTROL)


def _request(head: list[bytes], inputs: list[tuple[str, str, np.ndarray]], outputs: list[str],
             job_inputs: tuple[tuple[int, int], ...]) -> int:
    """A memfd holding the request (process_bls.h): each input's bytes, unless the job's."""
    datas: list[Any] = []
    sources: list[tuple[int, int] | None] = []
    for _, datatype, array in inputs:
        if datatype == "BYTES":
            encoded = pb.serialize_byte_tensor(array)
            datas.append(bytes(encoded) if encoded else b"")
            sources.append(None)
        else:
            contiguous = np.ascontiguousarray(array)
            datas.append(memoryview(contiguous).cast("B"))
            sources.append(_source(contiguous, job_inputs) if job_inputs else None)
    described = sum(4 + len(n.encode()) + 4 + len(d) + 8 + 8 * a.ndim + 16 for n, d, a in inputs)
    offset = _aligned(sum(map(len, head)) + described + sum(4 + len(o.encode()) for o in outputs))
    places = []
    record = list(head)
    for (name, datatype, array), data, source in zip(inputs, datas, sources):
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        where, at = source if source is not None else (0, offset)
        record += [_string(name), _string(datatype), struct.pack("<II", array.ndim, where),
                   struct.pack(f"<{array.ndim}q", *array.shape), struct.pack("<QQ", at, size)]  # fmt: skip
        if source is None:
            places.append((offset, data, size))
            offset = _aligned(offset + size)
    record += [_string(o) for o in outputs]
    fd = os.memfd_create("openinfer-bls", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(offset, 64))
        with mmap.mmap(fd, max(offset, 64)) as area:
            header = b"".join(record)
            area[: len(header)] = header
            for at, data, size in places:
                area[at : at + size] = data
    except BaseException:
        os.close(fd)
        raise
    return fd

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
