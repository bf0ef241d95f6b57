"""``triton_python_backend_utils`` as a Triton Python-backend model.py imports it (``import
triton_python_backend_utils as pb_utils``): the public surface of Triton's python_backend, written
for openinfer. `model_file.import_model_file` puts this module in sys.modules under that name before
it runs a model.py, so no Triton install is needed. The adapter that calls a `TritonPythonModel`
with these objects is `triton_model`.

The objects are thin views: an input `Tensor` holds the read-only numpy array that views the
request's memory (the Python backend's own zero-copy rule); a response's tensors are handed to the
server as they are and converted to the declared datatypes there. Names, signatures and error texts
follow Triton's (python_backend src/pb_stub.cc, src/response_sender.cc and
src/resources/triton_python_backend_utils.py); the code is openinfer's own.

What differs: BF16 tensors reach ``as_numpy()`` as uint16 bit patterns, as in openinfer's own
Python models (Triton refuses ``as_numpy()`` on them), and a BF16 output may be given as such bits,
as an ``ml_dtypes.bfloat16`` array or through ``from_dlpack`` of a torch bfloat16 tensor.
``InferenceRequest(...).exec()`` (BLS) runs the request on the server that runs the model,
through the target's scheduler (`_core.Server.bls`), never a socket.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import queue
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from .. import _core
from ..model import datatype_of, numpy_dtype

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

_logger = logging.getLogger("openinfer")

# Triton's config datatype names and the numpy types pb_utils gives for them (TYPE_STRING: object
# arrays of bytes). Its TYPE_* enum numbers (model_config.proto) are the list index + 1.
_TRITON_TYPES = (
    ("TYPE_BOOL", np.bool_), ("TYPE_UINT8", np.uint8), ("TYPE_UINT16", np.uint16),
    ("TYPE_UINT32", np.uint32), ("TYPE_UINT64", np.uint64), ("TYPE_INT8", np.int8),
    ("TYPE_INT16", np.int16), ("TYPE_INT32", np.int32), ("TYPE_INT64", np.int64),
    ("TYPE_FP16", np.float16), ("TYPE_FP32", np.float32), ("TYPE_FP64", np.float64),
    ("TYPE_STRING", np.object_),
)  # fmt: skip
TRITON_STRING_TO_NUMPY: dict[str, Any] = {name: t for name, t in _TRITON_TYPES}
TRITON_STRING_TO_NUMPY["TYPE_BOOL"] = bool


class TritonModelException(Exception):
    """What Triton raises into a model for a misuse of pb_utils (a send after the final flag, ...)."""


class TritonError:
    """An error a model attaches to an `InferenceResponse` (or passes to the sender). `code`
    chooses the status the client gets, as Triton maps it (http_server.cc, grpc_utils.cc):
    INTERNAL 500 / INTERNAL, NOT_FOUND 404 / NOT_FOUND, INVALID_ARG 400 / INVALID_ARGUMENT,
    UNAVAILABLE 503 / UNAVAILABLE, UNSUPPORTED 501 / UNIMPLEMENTED, and UNKNOWN, ALREADY_EXISTS,
    CANCELLED 400 over HTTP and the gRPC code of the same name."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    # The core's status codes (csrc/core/status.h): an HTTP status, or one of Triton's codes
    # that HTTP answers 400 and gRPC by name.
    _STATUS = {NOT_FOUND: 404, INVALID_ARG: 400, UNAVAILABLE: 503, UNSUPPORTED: 501, UNKNOWN: 1400,
               ALREADY_EXISTS: 2400, CANCELLED: 3400}  # fmt: skip

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def status(self) -> int:
        """The core's status code for this error (see `_STATUS`)."""
        return self._STATUS.get(self._code, 500)

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """The elements of an object or bytes array, each as a 4-byte little-endian length and its
    bytes, in C order; () for an empty array, None for other dtypes (as Triton's)."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    parts = []
    for item in np.asarray(input_tensor).ravel(order="C"):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts += [struct.pack("<I", len(data)), data]
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The inverse of `serialize_byte_tensor`: a 1-D object array of bytes."""
    items, offset, view = [], 0, memoryview(encoded_tensor)
    while offset < len(view):
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        items.append(bytes(view[offset : offset + length]))
        offset += length
    return np.array(items, dtype=np.object_)


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    if data_type == 1:
        return np.bool_
    if 1 < data_type <= len(_TRITON_TYPES):
        return _TRITON_TYPES[data_type - 1][1]
    return None


def numpy_to_triton_type(data_type: Any) -> int | None:
    if data_type == np.bytes_:
        return len(_TRITON_TYPES)
    for i, (_, t) in enumerate(_TRITON_TYPES):
        if data_type == t:
            return i + 1
    return None


# C (csrc/python/pb_objects.c): a Python frame per input of every request costs more than the lookup.
get_input_tensor_by_name = _core.get_input_tensor_by_name


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor._name == name:
            return tensor
    return None


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("input", []) if t["name"] == name), None)


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("output", []) if t["name"] == name), None)


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    policy = model_config.get("model_transaction_policy")
    return bool(policy.get("decoupled", False)) if isinstance(policy, Mapping) else False


class Tensor(_core.TensorBase):
    """A named tensor: an input of a request (a read-only view of its memory) or an output a
    model makes, ``Tensor(name, numpy_array)``. Its fields (`_name`, `_array`, `_datatype`),
    construction, ``name()`` and ``as_numpy()`` are C (`_core.TensorBase`, csrc/python/pb_objects.c):
    they run for every tensor of every request."""

    __slots__ = ()

    # numpy dtype -> V2 datatype, filled as tensors are made (datatype_of per tensor costs more);
    # TensorBase's construction reads it, and calls `_datatype_of` for a dtype not in it.
    _DATATYPES: dict[Any, str] = {}

    @classmethod
    def _datatype_of(cls, name: str, dtype: np.dtype) -> str:
        try:
            datatype = cls._DATATYPES[dtype] = datatype_of(dtype)
        except ValueError:
            raise TypeError(f"Tensor '{name}': numpy dtype {dtype} has no Triton datatype") from None
        return datatype

    @classmethod
    def _view(cls, name: str, array: np.ndarray, datatype: str) -> Tensor:
        """An input of a request: the server's read-only array, its datatype known."""
        tensor = _new_tensor(cls)
        tensor._name, tensor._array, tensor._datatype = name, array, datatype
        return tensor

    def __reduce__(self) -> tuple[Any, ...]:
        """copy and pickle, as of the Python class (a C base's fields are not its slots)."""
        return type(self)._view, (self._name, self._array, self._datatype)

    def triton_dtype(self) -> int:
        if self._datatype == "BF16":
            return 14
        return numpy_to_triton_type(numpy_dtype(self._datatype).type) or 0

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule viewing the tensor (BF16 as uint16 bits; BYTES has none, as in Triton).
        An input views the request's memory, which is read-only and which a classic capsule
        cannot mark so: it exports a copy, as Triton's stub exports its own copy of the input."""
        return self.__dlpack__()

    def __dlpack__(self, stream: Any = None, **versioned: Any) -> Any:
        if self._datatype == "BYTES":
            raise TritonModelException(f"Tensor '{self._name}': a BYTES tensor cannot be exported to DLPack")
        try:  # a consumer that asks for a versioned capsule gets the read-only view itself
            return self._array.__dlpack__(**versioned)
        except BufferError:
            if self._array.flags.writeable:
                raise
            return self._array.copy().__dlpack__(**versioned)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor from a DLPack capsule or an object with ``__dlpack__`` (a torch tensor, say);
        a torch bfloat16 tensor becomes a BF16 tensor of its bits."""
        if str(getattr(capsule, "dtype", "")) == "torch.bfloat16":
            import torch  # noqa: PLC0415 - only for the one dtype numpy cannot hold

            return Tensor(name, capsule.detach().cpu().view(torch.int16).numpy().view(np.uint16), _datatype="BF16")
        if not (hasattr(capsule, "__dlpack__") or type(capsule).__name__ == "PyCapsule"):
            raise TritonModelException(
                "Provided tensor is not supported. Tensor must be a DLPack capsule "
                "or have `__dlpack__` and `__dlpack_device__` attributes"
            )
        try:
            array = np.from_dlpack(capsule) if hasattr(capsule, "__dlpack__") else np.from_dlpack(_Capsule(capsule))
        except (BufferError, TypeError, RuntimeError) as e:
            raise TritonModelException(f"Tensor '{name}': {e}") from None
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"pb_utils.Tensor({self._name!r}, {self._datatype}, shape={list(self._array.shape)})"


_new_tensor = Tensor.__new__  # a Tensor with no fields yet, set by the caller (no __init__ checks)


_new_request = _core.RequestBase.__new__  # a request with no fields yet (no __init__ checks)
_REQUEST_FIELDS = ("_model_name", "_inputs", "_requested", "_request_id", "_correlation_id", "_flags", "_timeout",
                   "_model_version", "_parameters", "_cancelled", "_sender", "_decoupled", "_release_flags")  # fmt: skip


def _restored_request(cls: type[InferenceRequest], fields: tuple[Any, ...]) -> InferenceRequest:
    request = _new_request(cls)
    for name, value in zip(_REQUEST_FIELDS, fields):
        setattr(request, name, value)
    return request


class _Capsule:
    """A bare DLPack capsule dressed as the object numpy's from_dlpack takes."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class InferenceResponse(_core.ResponseBase):
    """One response: its output tensors, or an error. Its fields (`_outputs`, `_error`,
    `_parameters`), construction, ``output_tensors()``, ``has_error()`` and ``error()`` are C
    (`_core.ResponseBase`, csrc/python/pb_objects.c); an error or parameters given are checked
    by `_checked`."""

    __slots__ = ()

    @staticmethod
    def _checked(error: TritonError | None, parameters: Mapping[str, Any] | str | None) -> tuple[Any, str | None]:
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"InferenceResponse error must be a pb_utils.TritonError, got {type(error).__name__}")
        return error, None if parameters is None else _parameters_json(parameters)

    def parameters(self) -> str:
        return "{}" if self._parameters is None else self._parameters

    def __reduce__(self) -> tuple[Any, ...]:
        """copy and pickle, as of the Python class (a C base's fields are not its slots)."""
        return type(self), (self._outputs, self._error, self._parameters)


def _parameters_json(parameters: Mapping[str, Any] | str) -> str:
    """Request or response parameters as JSON text, checked as python_backend's
    PyParametersToJSON checks them (JSON text is taken as it is)."""
    if isinstance(parameters, str):
        return parameters
    for key, value in dict(parameters).items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(f"Expect parameters values to have type bool/int/str, found type {type(value)}")
        if type(value) is int and not -(2**63) <= value < 2**63:  # Triton keeps an int as int64_t
            raise TritonModelException(f"Expect parameters int values to fit int64, found {value} for key '{key}'")
    return json.dumps(dict(parameters))


class ResponseError(Exception):
    """A response's error as the client gets it: `status` (an HTTP code) and `message`; the
    server's Python backend sends `message` as it is (see python_backend.c)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class InferenceResponseSender:
    """A request's response sender: the responses it is given go to the client in order, through
    the stream the adapter drains (`triton_model`), from execute or from any thread after it."""

    def __init__(self, decoupled: bool, cancelled: Callable[[], bool]) -> None:
        self._decoupled = decoupled
        self._cancelled = cancelled
        self._queue: queue.SimpleQueue[tuple[InferenceResponse | None, int]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._sent = 0
        self._closed = False
        self._final = False  # the final flag was sent
        self._dropping = False  # the client went: sends are dropped, not refused

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError(f"send() takes a pb_utils.InferenceResponse, got {type(response).__name__}")
        with self._lock:
            if self._dropping and not self._final:
                # As Triton's frontend drops a cancelled request's responses: the model learns of
                # the cancellation from is_cancelled(), not from a failing send.
                self._final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
                return
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if not self._decoupled:
                if self._sent and response is not None:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than one response."
                    )
                if flags and response is None and not self._sent:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete final before "
                        "sending a response."
                    )
            self._sent += response is not None
            self._closed = self._final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
            self._queue.put((response, flags))

    def is_cancelled(self) -> bool:
        return self._cancelled()

    def _close(self) -> None:
        """The request has ended (its client went, or the model failed): later sends are refused."""
        with self._lock:
            self._closed = True

    def _drop(self) -> None:
        """The request's client went: later sends, up to the final flag, are dropped."""
        with self._lock:
            self._dropping = self._closed = True

    def _fail(self, error: ResponseError) -> None:
        """The model failed before the final flag: `error` ends the responses (see triton_model)."""
        with self._lock:
            self._closed = True
            if not self._final:
                self._final = True
                self._queue.put((error, TRITONSERVER_RESPONSE_COMPLETE_FINAL))  # type: ignore[arg-type]


class InferenceRequest(_core.RequestBase):
    """A request as `TritonPythonModel.execute` sees it. Built by the server for each request it
    hands to a model (no copy, its parameters decoded and its sender made only when asked for:
    `_served`, and for a lone request the core itself, csrc/python/triton_execute.c), or by a
    model for another model of the server (BLS: `exec`, `async_exec`). Its fields and plain
    reads (``inputs()``, ``request_id()``, ...) are C (`_core.RequestBase`)."""

    __slots__ = ()

    def __init__(
        self,
        model_name: str = "",
        inputs: Iterable[Tensor] = (),
        requested_output_names: Iterable[str] = (),
        request_id: str = "",
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        model_version: int = -1,
        parameters: Mapping[str, Any] | str | None = None,
        **_: Any,
    ) -> None:
        self._model_name = model_name
        self._inputs = list(inputs)
        self._requested = list(requested_output_names)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._model_version = model_version
        self._parameters = _parameters_json(parameters or {})
        self._cancelled: Callable[[], bool] = _never
        self._sender: InferenceResponseSender | None = None
        self._decoupled: bool | None = None  # None: a request made by a model, which has no sender
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _served(
        cls,
        model_name: str,
        inputs: Mapping[str, np.ndarray],
        datatypes: Mapping[str, str],
        requested: tuple[str, ...],
        parameters: bytes | None,
        cancelled: Callable[[], bool],
        decoupled: bool,
    ) -> InferenceRequest:
        """The request the server hands to execute: `inputs` as Tensors viewing its memory,
        `parameters` the request's JSON (None: none)."""
        request = _new_request(cls)
        tensors = request._inputs = []
        for name, array in inputs.items():  # Tensor._view's work, without a call per input
            tensor = _new_tensor(Tensor)
            # A sequence batcher's control inputs are not declared: their arrays' datatypes.
            datatype = datatypes[name] if name in datatypes else Tensor._datatype_of(name, array.dtype)
            tensor._name, tensor._array, tensor._datatype = name, array, datatype
            tensors.append(tensor)
        request._model_name = model_name
        request._requested = list(requested)
        request._request_id = ""
        request._correlation_id = 0
        request._flags = 0
        request._timeout = 0
        request._model_version = -1
        request._parameters = "{}"
        request._cancelled = cancelled
        request._sender = None
        request._decoupled = decoupled
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        if parameters:
            request._take_parameters(json.loads(parameters))
        return request

    def _take_parameters(self, params: dict[str, Any]) -> None:
        """Sequence and timeout parameters become the request's fields, as Triton's frontend
        takes them; the rest is parameters(). The transport's own (binary data) are dropped."""
        params.pop("binary_data_output", None)
        self._correlation_id = params.pop("sequence_id", 0)
        start, end = params.pop("sequence_start", False), params.pop("sequence_end", False)
        self._flags = (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if start else 0) | (
            TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if end else 0
        )
        timeout = params.pop("timeout", 0)
        self._timeout = timeout if isinstance(timeout, int) else 0
        self._parameters = json.dumps(params)

    def __reduce__(self) -> tuple[Any, ...]:
        """copy and pickle, as of the Python class (a C base's fields are not its slots)."""
        return _restored_request, (type(self), tuple(getattr(self, f) for f in _REQUEST_FIELDS))

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            if self._decoupled is None:
                raise TritonModelException("a request made by a model has no response sender")
            self._sender = InferenceResponseSender(self._decoupled, self._cancelled)
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(f"Unsupported release flags {flags}.")
        self._release_flags = flags

    def exec(self, decoupled: bool = False, trace: Any = None) -> Any:
        """BLS: runs this request on the model it names, on this server (no socket), and returns
        its response; with ``decoupled=True`` an iterator of the responses, ending with the one
        the target's final flag came with (an empty one when it came alone). A failure is the
        response's error, as in Triton."""
        call = self._start(decoupled)
        if not isinstance(call, InferenceResponse) and decoupled:
            return _Responses(call)
        return call if isinstance(call, InferenceResponse) else _wait_one(call)

    async def async_exec(self, decoupled: bool = False, trace: Any = None) -> Any:
        """`exec` as a coroutine: the calling model's event loop runs on while the request is
        served (several may be in flight). With ``decoupled=True``: an async iterator."""
        call = self._start(decoupled)
        if isinstance(call, InferenceResponse):
            return iter([call]) if decoupled else call
        parts = _AsyncResponses(call)
        first = await parts.__anext__()
        if decoupled:  # as Triton's: an iterator once the first response is there
            return _Responses(call, first, parts._done)
        await parts.drain()
        return first

    def _start(self, decoupled: bool) -> Any:
        """Queues the request on the server that runs the calling model: a `_core.BlsCall`, or
        the error response that refused it at once."""
        host = _host()
        if host is None:
            where = (
                "from a model whose instances are worker processes (instance_group count > 1): give its "
                "instance_group kind KIND_MODEL to keep them in the server"
                if _in_worker else "outside a model that the server runs"
            )
            return _error_response(f"BLS is not available {where}", TritonError.UNSUPPORTED)
        name = self._model_name.decode() if isinstance(self._model_name, bytes) else str(self._model_name)
        inputs = []
        for tensor in self._inputs:
            if not isinstance(tensor, Tensor):
                raise TypeError(f"InferenceRequest inputs must hold pb_utils.Tensor, got {type(tensor).__name__}")
            inputs.append((tensor._name, tensor._datatype, tensor._array))
        params = json.loads(self._parameters) if self._parameters and self._parameters != "{}" else {}
        corr = self._correlation_id
        corr_id, corr_str = (0, corr) if isinstance(corr, str) else (int(corr or 0), None)
        if corr_id or corr_str:
            params["sequence_id"] = corr_str if corr_str else corr_id
            params["sequence_start"] = bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
            params["sequence_end"] = bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
        timeout_us = int(self._timeout or 0)
        if timeout_us:
            params["timeout"] = timeout_us
        version = "" if self._model_version is None or int(self._model_version) < 0 else str(self._model_version)
        caller, chain = _caller()
        try:
            call = host.bls(
                name, version, inputs, [str(n) for n in self._requested],
                request_id=self._request_id or None, parameters=json.dumps(params) if params else None,
                timeout_us=timeout_us, sequence_id=corr_id, sequence_id_str=corr_str,
                sequence_start=bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START),
                sequence_end=bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END), decoupled=decoupled,
                caller=caller, chain=chain,
            )  # fmt: skip
        except RuntimeError as e:  # the server stopped
            return _error_response(str(e), TritonError.UNAVAILABLE)
        if call.decoupled and not decoupled:
            call.cancel()
            return _error_response(
                f"Model {name} is using the decoupled. The current BLS request call doesn't support models using "
                "the decoupled transaction policy. Please use 'decoupled=True' argument to the 'exec' or "
                "'async_exec' calls for decoupled models.'"
            )
        return call


# What the model whose execute runs here is serving, set by the adapter around execute (one
# context variable: one set and one reset per call), per thread and per task of an ``async def
# execute``: the server its BLS requests go to (a thread the model started itself uses the last
# server a model was bound to), the calling model's name, and its request's cancel flag, which
# tells whether the clients have gone (that cancels its BLS calls) and, as the core's CancelFlag,
# the BLS call chain the request came down: the server refuses a call that would wait on a
# model waiting up that chain; and the model's version folder (get_model_dir).
_serving_var: contextvars.ContextVar[tuple[Any, str, Callable[[], bool], str | None] | None] = contextvars.ContextVar(
    "pb_utils_serving", default=None)
# The version folder of the model being loaded or finalized here (get_model_dir outside execute):
# set by the adapter around auto_complete_config, initialize and finalize (tasks and coroutines
# those start inherit it); a worker process, which serves one model, sets the default.
_model_dir_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("pb_utils_model_dir", default=None)
_default_model_dir: list[str] = []
_default_host: list[Any] = []
_in_worker = False  # set in a model's worker process (TritonFile.load)
# How often a waiting BLS call looks whether the calling model's client has gone.
_BLS_POLL_S = 0.05
# Triton's error codes for the statuses a BLS call can end with.
_CODES = {**{status: code for code, status in TritonError._STATUS.items()}, 499: TritonError.CANCELLED,
          409: TritonError.ALREADY_EXISTS}  # fmt: skip


def _host() -> Any:
    serving = _serving_var.get()
    host = serving[0] if serving is not None else None
    if host is None and _default_host:
        host = _default_host[-1]
    return host


def _caller() -> tuple[str | None, str | None]:
    """The calling model's name and the BLS call chain of the request it serves (None: a client's)."""
    serving = _serving_var.get()
    if serving is None:
        return None, None
    chain = getattr(serving[2], "bls_chain", None)  # the core's CancelFlag
    return serving[1], chain() if chain is not None else None


def _caller_cancelled() -> bool:
    serving = _serving_var.get()
    return bool(serving is not None and serving[2]())


def _error_response(message: str, code: int = TritonError.INTERNAL) -> InferenceResponse:
    return InferenceResponse(error=TritonError(message, code))


def _response(part: Any, call: Any) -> InferenceResponse | None:
    """What `_core.BlsCall.next` gave as a response (its parameters on the call); None at the end."""
    if part is None:
        return None
    if isinstance(part, tuple):
        status, message = part
        return _error_response(message, _CODES.get(status, TritonError.INTERNAL))
    outputs = [Tensor._view(name, array, datatype) for name, (datatype, array) in part.items()]
    return InferenceResponse(outputs, parameters=call.parameters)


def _next(call: Any) -> Any:
    """The call's next part, waiting; cancels it when the calling model's client goes."""
    while True:
        part = call.next(_BLS_POLL_S)
        if part is not False:
            return part
        if _caller_cancelled():
            call.cancel()


def _wait_one(call: Any) -> InferenceResponse:
    response = _response(_next(call), call)
    if response is None:
        return _error_response("the model sent no response")
    if not response.has_error():
        end = _next(call)  # the end (an error here still fails the call)
        if isinstance(end, tuple):
            return _response(end, call)  # type: ignore[return-value]
    return response


class _Responses:
    """The responses of ``exec(decoupled=True)``, in order, as Triton's iterator gives them: the
    last one is the response that came with the target's final flag, or an empty one when the
    flag came alone, or the error the call ended with."""

    def __init__(self, call: Any, first: InferenceResponse | None = None, done: bool = False) -> None:
        self._call, self._first, self._done = call, first, done

    def __iter__(self) -> _Responses:
        return self

    def __next__(self) -> InferenceResponse:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        if self._done:
            raise StopIteration
        response = _response(_next(self._call), self._call)
        self._done = response is None or response.has_error() or self._call.final
        return response if response is not None else InferenceResponse()

    def cancel(self) -> None:
        self._call.cancel()


class _AsyncResponses:
    """A call's responses awaited on the calling model's event loop (woken by the call's
    eventfd): what `async_exec` waits with."""

    def __init__(self, call: Any) -> None:
        self._call, self._done = call, False
        self._fd = call.fileno()

    def __aiter__(self) -> _AsyncResponses:
        return self

    async def _part(self) -> Any:
        import asyncio  # noqa: PLC0415 - only a coroutine execute needs it

        loop = asyncio.get_running_loop()
        while True:
            part = self._call.next(0)
            if part is not False:
                return part
            ready = loop.create_future()
            loop.add_reader(self._fd, lambda: ready.done() or ready.set_result(None))
            try:
                await asyncio.wait_for(asyncio.shield(ready), _BLS_POLL_S)
            except asyncio.TimeoutError:
                if _caller_cancelled():
                    self._call.cancel()
            finally:
                loop.remove_reader(self._fd)
            try:
                os.read(self._fd, 8)
            except BlockingIOError:
                pass

    async def __anext__(self) -> InferenceResponse:
        if self._done:
            raise StopAsyncIteration
        response = _response(await self._part(), self._call)
        self._done = response is None or response.has_error() or self._call.final
        return response if response is not None else InferenceResponse()

    async def drain(self) -> None:
        while not self._done:
            await self.__anext__()


def load_model(model_name: str, config: str = "", files: Mapping[str, bytes] | None = None) -> None:
    """Loads (or reloads) a model of the server's repository, as the repository API does; the
    server must run with explicit model control, as Triton requires."""
    host = _host()
    if host is None:
        raise TritonModelException("load_model is only available from a model that the server runs")
    try:
        host.load_model(model_name, config, dict(files or {}))
    except Exception as e:  # noqa: BLE001 - Triton raises its own exception type
        raise TritonModelException(str(getattr(e, "message", e))) from None


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    host = _host()
    if host is None:
        raise TritonModelException("unload_model is only available from a model that the server runs")
    try:
        host.unload_model(model_name, unload_dependents)
    except Exception as e:  # noqa: BLE001
        raise TritonModelException(str(getattr(e, "message", e))) from None


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    host = _host()
    if host is None:
        raise TritonModelException("is_model_ready is only available from a model that the server runs")
    return bool(host.is_model_ready(model_name, str(model_version or "")))


def get_model_dir() -> str:
    """The model's version folder (``<repository>/<model>/<version>``), as python_backend's stub
    answers: for a Python-based backend too, whose model.py lies elsewhere."""
    serving = _serving_var.get()
    model_dir = (serving[3] if serving is not None else None) or _model_dir_var.get() or (
        _default_model_dir[-1] if _default_model_dir else None)
    if model_dir is None:
        raise TritonModelException(
            "get_model_dir() answers from a model's auto_complete_config, initialize, execute or finalize "
            "(and the tasks they start), not from a thread the model started"
        )
    return model_dir


def _never() -> bool:
    return False


class Logger:
    """Triton's model logger: lines go to the server's log ("openinfer" logger)."""

    class LogLevel:
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    # python_backend exports the levels on Logger too (pybind11's export_values).
    INFO, WARNING, ERROR, VERBOSE = LogLevel.INFO, LogLevel.WARNING, LogLevel.ERROR, LogLevel.VERBOSE

    _LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}

    @staticmethod
    def log(message: str, level: int = 0) -> None:
        _logger.log(Logger._LEVELS.get(int(level), logging.INFO), "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        _logger.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        _logger.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        _logger.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _logger.debug("%s", message)


class ModelConfig:
    """The configuration `auto_complete_config` may complete: max_batch_size, inputs, outputs,
    dynamic batching and the transaction policy, checked as Triton checks them."""

    def __init__(self, model_config: str | Mapping[str, Any]) -> None:
        self._model_config = json.loads(model_config) if isinstance(model_config, str) else dict(model_config)

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = self._model_config.get("max_batch_size", 0)
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config function "
                f"for model '{self._name()}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but auto-complete-config "
                    f"function for model '{self._name()}' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: Mapping[str, Any]) -> None:  # noqa: A002 - Triton's name
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: Mapping[str, Any]) -> None:
        self._add("output", output, ("name", "data_type", "dims"))

    def _add(self, kind: str, tensor: Mapping[str, Any], valid: tuple[str, ...]) -> None:
        name, model = tensor.get("name", ""), self._name()
        for key in tensor:
            if key not in valid:
                listed = ", ".join(f"'{v}'" for v in valid[:-1]) + f" and '{valid[-1]}'"
                raise ValueError(
                    f"{kind} '{name}' in auto-complete-config function for model '{model}' contains "
                    f"property other than {listed}."
                )
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                who = f"{kind} '{name}' in" if key != "name" else f"{kind} in"
                raise ValueError(f"{who} auto-complete-config function for model '{model}' is missing '{key}' property.")
        existing = self._model_config.setdefault(kind, [])
        for current in existing:
            if current["name"] != name:
                continue
            if current.get("data_type", "TYPE_INVALID") not in ("TYPE_INVALID", tensor["data_type"]):
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype {current['data_type']} "
                    f"for {kind} '{name}', model provides {tensor['data_type']}"
                )
            if current.get("dims") and list(current["dims"]) != list(tensor["dims"]):
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects dims {list(tensor['dims'])} but the "
                    f"model configuration specifies dims {list(current['dims'])}"
                )
            current.update(tensor)
            return
        existing.append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: Mapping[str, Any]) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model '{self._name()}' "
                    "contains property other than 'decoupled'"
                )
        current = self._model_config.get("model_transaction_policy", {})
        wanted = bool(transaction_policy_dict.get("decoupled", False))
        if "decoupled" in current and bool(current["decoupled"]) != wanted:
            raise ValueError(
                f"trying to change decoupled property in auto-complete-config for model '{self._name()}', "
                f"which is initially set to '{current['decoupled']}'."
            )
        self._model_config["model_transaction_policy"] = {"decoupled": wanted}


from .triton_metrics import Metric, MetricFamily  # noqa: E402 - the metrics' own module, re-exported

__all__ = [
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL", "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "TRITON_STRING_TO_NUMPY", "InferenceRequest",
    "InferenceResponse", "InferenceResponseSender", "Logger", "is_model_ready", "load_model", "unload_model", "Metric", "MetricFamily", "ModelConfig",
    "Tensor", "TritonError", "TritonModelException", "deserialize_bytes_tensor", "get_input_config_by_name",
    "get_input_tensor_by_name", "get_model_dir", "get_output_config_by_name", "get_output_tensor_by_name",
    "numpy_to_triton_type", "serialize_byte_tensor", "triton_string_to_numpy", "triton_to_numpy_type",
    "using_decoupled_model_transaction_policy",
]
