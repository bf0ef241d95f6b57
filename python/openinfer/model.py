"""Python models: tensor declarations, the V2 datatype <-> numpy mapping, and the handler that
the C core calls on an executor thread (with the GIL held) for every request or batch.

BF16: numpy has no bfloat16 type, so BF16 tensors reach a model as ``uint16`` arrays holding
the raw bfloat16 bit patterns (``x.view(ml_dtypes.bfloat16)`` gives the values when ml_dtypes
is installed). A BF16 output may be returned as such a ``uint16`` bit-pattern array, as an
``ml_dtypes.bfloat16`` array, or as any real-valued array, which is rounded to bfloat16
(round-to-nearest-even, NaN kept). Inputs are uint16 whether or not ml_dtypes is installed,
so a model behaves the same everywhere.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import operator
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, SupportsIndex

import numpy as np

from ._backends import processes
from ._config import sequence, triton_config
from .config import ConfigError, DynamicBatching
from ._config.sequence import SequenceBatching

try:
    from ml_dtypes import bfloat16 as _bfloat16  # type: ignore[import-not-found, unused-ignore]
except ImportError:
    _bfloat16 = None

# Request parameters that steer the protocol (binary tensor data extension, Triton's queue
# timeout, sequence batching), not the model.
logger = logging.getLogger("openinfer")

_PROTOCOL_PARAMETERS = ("binary_data_output", "timeout", "sequence_id", "sequence_start", "sequence_end")

DATATYPES: tuple[str, ...] = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BF16", "BYTES",
)  # fmt: skip

_NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(np.uint16),  # bit patterns; see the module docstring
    "BYTES": np.dtype(object),  # elements are bytes
}

# The inverse map, minus BF16: a plain uint16 array means UINT16, never BF16.
_DATATYPES_BY_DTYPE: dict[np.dtype[Any], str] = {
    dt: name for name, dt in _NUMPY_DTYPES.items() if name != "BF16"
}


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The numpy dtype in which a tensor of V2 `datatype` reaches a model (BF16: uint16)."""
    try:
        return _NUMPY_DTYPES[datatype]
    except KeyError:
        raise ValueError(_bad_datatype(datatype)) from None


def datatype_of(dtype: np.dtype[Any] | type) -> str:
    """The V2 datatype that carries arrays of numpy `dtype`: the inverse of `numpy_dtype`, plus
    ``ml_dtypes.bfloat16`` -> BF16 and bytes/str arrays -> BYTES."""
    dt = np.dtype(dtype)
    if _bfloat16 is not None and dt == np.dtype(_bfloat16):
        return "BF16"
    if dt.kind in "SUO":
        return "BYTES"
    try:
        return _DATATYPES_BY_DTYPE[dt.newbyteorder("=")]
    except KeyError:
        raise ValueError(f"numpy dtype {dt} has no V2 datatype") from None


def _bad_datatype(datatype: object) -> str:
    return f"datatype {datatype!r} is not a V2 datatype (expected one of {', '.join(DATATYPES)})"


@dataclass(frozen=True, init=False)
class Tensor:
    """The declaration of one model input or output.

    `shape` is the full shape; -1 marks a variable dimension (for a batching model, the first
    one). Any iterable of ints is accepted and stored as a tuple. ``shape=None`` accepts any
    shape, any rank included, which a Triton config cannot express; model metadata shows it
    as ``[-1]``, the nearest V2 equivalent. An input declared ``optional=True`` (Triton's
    ``optional: true``) may be left out of a request: the model then sees only the inputs sent.
    """

    name: str
    datatype: str
    shape: tuple[int, ...] | None
    optional: bool

    def __init__(
        self, name: str, datatype: str, shape: Iterable[SupportsIndex] | None, *, optional: bool = False
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor name must be a non-empty string, got {name!r}")
        if datatype not in _NUMPY_DTYPES:
            raise ValueError(f"tensor {name!r}: {_bad_datatype(datatype)}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "datatype", datatype)
        object.__setattr__(self, "optional", bool(optional))
        if shape is None:
            object.__setattr__(self, "shape", None)
            return
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable):
            raise ValueError(
                f"tensor {name!r}: shape must be a sequence of ints or None, got {shape!r}"
            )
        given = tuple(shape)
        object.__setattr__(self, "shape", tuple(_dimension(name, given, d) for d in given))


def _sequence(
    name: str, given: Mapping[str, Any] | None, max_batch_size: int, inputs: tuple[Tensor, ...]
) -> tuple[SequenceBatching | None, dict[str, Any] | None]:
    """A Python model's `sequence_batching`: a dict in the shape of Triton's JSON config
    (``{"oldest": {...}, "control_input": [...], "state": [...]}``), checked by the same code as a
    config.pbtxt's, so a mistake names the field the same way. Initial state comes from
    ``zero_data`` only: a Python model has no directory to hold ``data_file``s."""
    if given is None:
        return None, None
    if not isinstance(given, Mapping):
        raise TypeError(
            f"model {name!r}: sequence_batching must be a dict (Triton's JSON config shape) or None, "
            f"got {given!r}"
        )
    source = f"model {name!r}"
    normalized = triton_config.normalize(
        {"max_batch_size": max_batch_size, "sequence_batching": dict(given)}, source
    )
    refused, warnings = triton_config.unsupported(normalized, source)
    for warning in warnings:
        logger.warning("%s", warning)
    if refused:
        raise ConfigError("; ".join(refused))
    parsed = sequence.parse(normalized, source, None, tuple(t.name for t in inputs))
    return parsed, normalized["sequence_batching"]


def _dimension(tensor: str, shape: tuple[SupportsIndex, ...], dim: SupportsIndex) -> int:
    """One dimension: an int or numpy integer >= -1. Bools and floats are mistakes."""
    try:
        value = None if isinstance(dim, bool) else operator.index(dim)
    except TypeError:
        value = None
    if value is None or value < -1:
        raise ValueError(
            f"tensor {tensor!r}: shape {list(shape)} must hold ints >= -1 "
            f"(-1 for a variable dimension), got {dim!r}"
        )
    return value


class Request:
    """What a running model can ask about the request it is serving: given to a model function
    that has a parameter named ``request`` (``fn(inputs, request=...)``).

    A client that closes its HTTP connection, resets its gRPC stream or whose gRPC deadline
    passes cancels its request. A queued request is then dropped before it reaches the model;
    one already running goes on, and a long model can poll `is_cancelled` between steps and
    stop early: what it returns or raises after that is discarded. With dynamic batching, the
    model serves a batch, which counts as cancelled once every request in it is.
    """

    __slots__ = ("_flag",)

    def __init__(self, flag: Callable[[], bool]) -> None:
        self._flag = flag

    def is_cancelled(self) -> bool:
        """True once every client waiting for this request (or batch) has gone. Cheap: one
        atomic load, no lock and no I/O. Meaningful only while the model function runs."""
        return self._flag()

    def __repr__(self) -> str:
        return f"<openinfer.Request cancelled={self._flag()}>"


TensorLike = Tensor | tuple[str, str, Iterable[SupportsIndex] | None]
ModelFn = Callable[..., Mapping[str, Any]]


@dataclass(frozen=True, eq=False, init=False)
class Model:
    """A Python callable served as a V2 model.

    ``fn(inputs)`` receives a dict of input name -> read-only numpy array (BYTES: object array
    of bytes) and returns a dict of output name -> array-like, converted by the server to the
    declared datatype. If `fn` has a parameter named ``parameters`` it is called as
    ``fn(inputs, parameters=...)`` with the request's parameters as a dict ({} when none), so
    models that ignore parameters pay no JSON decoding. If it has one named ``request`` it gets
    a `Request`, whose ``is_cancelled()`` tells a long-running model that its client has gone.

    Shapes are full shapes. With ``max_batch_size > 0`` the first dimension is the batch,
    which must therefore be declared -1; with `dynamic_batching` as well, the server gathers
    concurrent requests into one call of up to max_batch_size rows (``True`` for no delay, or
    a `config.DynamicBatching` with preferred sizes and a queue delay) and splits the outputs
    back. `inputs` and `outputs` take `Tensor`s or ``(name, datatype, shape)`` tuples.

    A `decoupled` model (Triton's ``model_transaction_policy { decoupled: true }``) answers a
    request with 0..N responses: `fn` is a generator (or async generator) that yields one dict
    of outputs per response, each sent as soon as it is yielded (gRPC ``ModelStreamInfer``,
    HTTP ``generate_stream``). A generator `fn` makes the model decoupled unless
    ``decoupled=False`` says otherwise, which is an error. When the client goes away, the
    generator is closed (``GeneratorExit`` at its next ``yield``; an async generator's pending
    ``await`` is cancelled at once, so long waits belong in ``await`` or should poll
    ``request.is_cancelled()``); a generator that produces faster than its client reads is held
    at its ``yield`` until the client catches up.

    With ``instances > 1`` each instance is a worker process of its own when a worker can import
    `fn` (a top-level function of a module), so a CPU-bound model uses that many cores:
    ``processes=None`` decides so, ``True`` insists, ``False`` keeps the instances as threads of
    the server process (as for functions defined in a notebook, and for sequence models). In a
    worker, input arrays are valid only during the call. See `openinfer._backends.processes`.

    With ``response_cache=True`` (Triton's ``response_cache { enable: true }``) and a server
    started with a cache (``serve(cache_config=["local,size=BYTES"])``), a request identical to
    an earlier one (inputs, requested outputs, parameters) is answered from the cache without
    calling `fn`: only for models whose answers depend on nothing else.
    """

    name: str
    fn: ModelFn
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    max_batch_size: int
    version: int
    instances: int
    platform: str
    dynamic_batching: DynamicBatching | None
    decoupled: bool
    sequence_batching: SequenceBatching | None
    response_cache: bool
    processes: bool
    _source: Any = field(repr=False)  # what a worker process imports fn by (_backends/processes.py)
    _sequence_config: dict[str, Any] | None = field(repr=False)  # as the model's config reports it
    _wants_parameters: bool = field(repr=False)
    _wants_request: bool = field(repr=False)
    _bf16_outputs: frozenset[str] = field(repr=False)

    def __init__(
        self,
        name: str,
        fn: ModelFn,
        *,
        inputs: Iterable[TensorLike],
        outputs: Iterable[TensorLike],
        max_batch_size: int = 0,
        version: int = 1,
        instances: int = 1,
        platform: str = "python",
        dynamic_batching: DynamicBatching | bool | None = None,
        decoupled: bool | None = None,
        sequence_batching: Mapping[str, Any] | None = None,
        response_cache: bool = False,
        processes: bool | None = None,
    ) -> None:
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"model name must be a non-empty string without '/', got {name!r}")
        if not callable(fn):
            raise TypeError(f"model {name!r}: fn must be callable, got {fn!r}")
        _require_int(name, "max_batch_size", max_batch_size, 0)
        _require_int(name, "version", version, 0)
        _require_int(name, "instances", instances, 1)
        if not isinstance(platform, str):
            raise TypeError(f"model {name!r}: platform must be a string, got {platform!r}")
        generator = inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)
        if decoupled is None:
            decoupled = generator
        elif not isinstance(decoupled, bool):
            raise TypeError(f"model {name!r}: decoupled must be a bool or None, got {decoupled!r}")
        elif generator and not decoupled:
            raise ValueError(
                f"model {name!r}: fn is a generator, which yields many responses per request: "
                "serve it with decoupled=True (model_transaction_policy { decoupled: true })"
            )
        if decoupled and dynamic_batching:
            raise ValueError(f"model {name!r}: a decoupled model cannot use dynamic batching")
        declared_outputs = _tensors(name, "output", outputs, max_batch_size)
        if not declared_outputs:
            raise ValueError(f"model {name!r}: declare at least one output")
        declared_inputs = _tensors(name, "input", inputs, max_batch_size)
        if decoupled and sequence_batching is not None:
            raise ValueError(f"model {name!r}: a decoupled model cannot use sequence_batching")
        if isinstance(dynamic_batching, DynamicBatching):
            dynamic_batching.check(f"model {name!r}: dynamic_batching")
        if dynamic_batching and sequence_batching is not None:
            raise ValueError(
                f"model {name!r}: dynamic_batching and sequence_batching cannot both be given "
                "(a sequence model batches its sequences as sequence_batching's strategy says)"
            )
        if not isinstance(response_cache, bool):
            raise TypeError(f"model {name!r}: response_cache must be a bool, got {response_cache!r}")
        if response_cache and (decoupled or sequence_batching is not None):
            kind = "with 'decoupled' transaction policy" if decoupled else "with sequence batching scheduler"
            raise ValueError(f"Response Cache does not currently support model {name} {kind}. "
                             "Please disable the response cache.")
        sequence, sequence_config = _sequence(name, sequence_batching, max_batch_size, declared_inputs)
        processes = _in_processes(name, fn, instances, processes, sequence)
        fields = {
            "name": name,
            "fn": fn,
            "inputs": declared_inputs,
            "outputs": declared_outputs,
            "max_batch_size": max_batch_size,
            "version": version,
            "instances": instances,
            "platform": platform,
            "dynamic_batching": DynamicBatching() if dynamic_batching is True else dynamic_batching or None,
            "decoupled": decoupled,
            "sequence_batching": sequence,
            "response_cache": response_cache,
            "processes": processes,
            "_source": fn,
            "_sequence_config": sequence_config,
            "_wants_parameters": _accepts_keyword(fn, "parameters"),
            "_wants_request": _accepts_keyword(fn, "request"),
            "_bf16_outputs": frozenset(t.name for t in declared_outputs if t.datatype == "BF16"),
        }
        for key, value in fields.items():
            object.__setattr__(self, key, value)

    def handler(
        self,
        inputs: dict[str, np.ndarray],
        parameters: bytes | None,
        outputs: tuple[str, ...],
        cancelled: Callable[[], bool] = lambda: False,
    ) -> dict[str, object] | Iterator[dict[str, object]]:
        """The `_core.Handler` for this model: runs `fn` and returns the requested outputs, in
        the requested order (a decoupled model: an iterator of them, one per response).
        `cancelled` tells whether the request's clients have gone. Raised errors name the
        model, since the server sends them to the client as the 500 message."""
        result = self._call(inputs, parameters, cancelled)
        if self.decoupled:
            return self._responses(result, outputs, cancelled)
        return self._select(result, outputs)

    @property
    def direct(self) -> tuple[Callable[..., Any], Callable[..., dict[str, object]]] | None:
        """(fn, select) when `fn` takes the inputs alone, the model is not decoupled and has
        no BF16 output: the core then calls `fn` itself, without `handler` (see
        _core.Server.add_model). None otherwise."""
        if self.decoupled or self._wants_parameters or self._wants_request or self._bf16_outputs:
            return None
        return self.fn, self._select

    def _call(self, inputs: dict[str, np.ndarray], parameters: bytes | None, cancelled: Callable[[], bool]) -> Any:
        if not (self._wants_parameters or self._wants_request):
            result = self.fn(inputs)
        else:
            kwargs: dict[str, Any] = {}
            if self._wants_parameters:
                params = json.loads(parameters) if parameters else {}
                for key in _PROTOCOL_PARAMETERS:  # the transport's business, not the model's
                    params.pop(key, None)
                kwargs["parameters"] = params
            if self._wants_request:
                kwargs["request"] = Request(cancelled)
            result = self.fn(inputs, **kwargs)
        return result

    def _responses(
        self, result: Any, outputs: tuple[str, ...], cancelled: Callable[[], bool]
    ) -> Iterator[dict[str, object]]:
        """A decoupled model's responses: what `fn` yields (a dict it returns is one response),
        each narrowed to the requested outputs. Closing this closes `fn`'s generator."""
        if isinstance(result, Mapping):
            yield self._select(result, outputs)
            return
        if isinstance(result, AsyncIterator):
            result = _drive(result, cancelled)
        elif isinstance(result, Iterable) and not isinstance(result, (str, bytes)):
            result = iter(result)  # a list of responses, say
        else:
            raise TypeError(
                f"model {self.name!r} is decoupled and returned {type(result).__name__}; "
                "expected a generator of dicts of output name -> array"
            )
        try:
            for item in result:
                yield self._select(item, outputs)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()

    def _select(self, result: Any, outputs: tuple[str, ...]) -> dict[str, object]:
        if not isinstance(result, Mapping):
            raise TypeError(
                f"model {self.name!r} returned {type(result).__name__}; "
                "expected a dict of output name -> array"
            )
        produced: dict[str, object] = {}
        for name in outputs:
            try:
                value = result[name]
            except KeyError:
                returned = ", ".join(map(repr, result)) or "nothing"
                raise ValueError(
                    f"model {self.name!r} did not return output {name!r} (returned {returned})"
                ) from None
            produced[name] = (
                _bf16_bits(self.name, name, value) if name in self._bf16_outputs else value
            )
        return produced


def model(
    *,
    name: str | None = None,
    inputs: Iterable[TensorLike],
    outputs: Iterable[TensorLike],
    max_batch_size: int = 0,
    version: int = 1,
    instances: int = 1,
    platform: str = "python",
    dynamic_batching: DynamicBatching | bool | None = None,
    decoupled: bool | None = None,
    processes: bool | None = None,
) -> Callable[[ModelFn], Model]:
    """Decorator form of `Model`: ``@openinfer.model(inputs=[...], outputs=[...])`` turns a
    function into a Model named `name`, or after the function when no name is given."""

    def wrap(fn: ModelFn) -> Model:
        return Model(
            name if name is not None else fn.__name__,
            fn,
            inputs=inputs,
            outputs=outputs,
            max_batch_size=max_batch_size,
            version=version,
            instances=instances,
            platform=platform,
            dynamic_batching=dynamic_batching,
            decoupled=decoupled,
            processes=processes,
        )

    return wrap


# How often an async generator's pending step checks whether its client has gone.
_CANCEL_POLL_S = 0.02


def _drive(agen: AsyncIterator[Any], cancelled: Callable[[], bool]) -> Iterator[Any]:
    """Runs an async generator on an event loop of its own, one item per step, so that the
    executor can iterate it like a generator; closing this closes it (``aclose``). While a step
    awaits, the client's departure cancels it (``CancelledError`` at the generator's ``await``)
    within `_CANCEL_POLL_S`, rather than at its next ``yield``."""
    loop = asyncio.new_event_loop()
    try:
        while True:
            step = asyncio.ensure_future(agen.__anext__(), loop=loop)
            while not step.done():
                loop.run_until_complete(asyncio.wait([step], timeout=_CANCEL_POLL_S))
                if not step.done() and cancelled():
                    step.cancel()
                    try:
                        loop.run_until_complete(step)
                    except (asyncio.CancelledError, StopAsyncIteration):
                        pass
                    return
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        try:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None:
                loop.run_until_complete(aclose())
        finally:
            loop.close()


def _tensors(
    model_name: str, kind: str, declared: Iterable[TensorLike], max_batch_size: int
) -> tuple[Tensor, ...]:
    if isinstance(declared, (str, bytes, Tensor)) or not isinstance(declared, Iterable):
        raise TypeError(f"model {model_name!r}: {kind}s must be a list of openinfer.Tensor")
    tensors = tuple(t if isinstance(t, Tensor) else Tensor(*t) for t in declared)
    seen: set[str] = set()
    for tensor in tensors:
        if tensor.name in seen:
            raise ValueError(f"model {model_name!r}: {kind} {tensor.name!r} is declared twice")
        seen.add(tensor.name)
        if max_batch_size > 0 and (not tensor.shape or tensor.shape[0] != -1):
            shape = "any shape" if tensor.shape is None else f"shape {list(tensor.shape)}"
            example = [-1, *(tensor.shape or [])]
            raise ValueError(
                f"model {model_name!r}: {kind} {tensor.name!r} has {shape}, "
                f"but with max_batch_size={max_batch_size} the first dimension is the "
                f"batch and must be -1, e.g. {example}"
            )
    return tensors


def _in_processes(
    name: str, fn: ModelFn, instances: int, asked: bool | None, sequence: SequenceBatching | None
) -> bool:
    """Whether the model's instances are worker processes; see _backends/processes.py for the rule."""
    if asked is not None and not isinstance(asked, bool):
        raise TypeError(f"model {name!r}: processes must be a bool or None, got {asked!r}")
    if asked is False:
        return False
    why = processes.why_not_importable(fn)
    if asked is None:
        return instances > 1 and sequence is None and why is None
    if sequence is not None:
        raise ValueError(f"model {name!r}: a sequence model's instances run in the server process "
                         "(processes=True cannot be combined with sequence_batching)")
    if why is not None:
        raise ValueError(f"model {name!r}: processes=True needs a function that a worker process can import, "
                         f"but {why}: define it at the top level of a module, or use processes=False")
    return True


def _require_int(model_name: str, what: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"model {model_name!r}: {what} must be an int >= {minimum}, got {value!r}")


def _accepts_keyword(fn: ModelFn, name: str) -> bool:
    """Whether `fn` can be called with keyword `name`; decided once, not per request."""
    try:
        parameter = inspect.signature(fn).parameters.get(name)
    except (TypeError, ValueError):  # builtins and C callables without a signature
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def _bf16_bits(model_name: str, output: str, value: object) -> np.ndarray:
    """Converts a BF16 output to the uint16 bit patterns the server sends: the server's own
    numpy conversion would turn 1.5 into the integer 1, not into bfloat16 bits."""
    array = np.asarray(value)
    if array.dtype == np.uint16:
        return array
    if _bfloat16 is not None and array.dtype == np.dtype(_bfloat16):
        return array.view(np.uint16)
    if array.dtype.kind not in "biuf":
        raise TypeError(
            f"model {model_name!r}: output {output!r} is BF16 "
            f"but the model returned {array.dtype} values"
        )
    # Finite values from here on round to infinity: refused, as the server refuses any value
    # that does not fit an output's declared type.
    too_big = np.isfinite(array) & (np.abs(array.astype(np.float64)) >= (2 - 2**-8) * 2.0**127)
    if too_big.any():
        index = int(np.flatnonzero(too_big)[0])
        raise ValueError(
            f"model {model_name!r}: output {output!r}: expected BF16, got {array.dtype} values "
            f"that do not fit: element {index} is {array.flat[index]!r}, beyond the largest BF16"
        )
    single = np.asarray(array, dtype=np.float32)
    bits = single.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    quiet_nan = (bits >> 16) | np.uint32(0x0040)
    return np.where(np.isnan(single), quiet_nan, rounded).astype(np.uint16)
