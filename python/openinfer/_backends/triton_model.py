"""Triton Python-backend models (a model.py that defines ``class TritonPythonModel``), served by
openinfer's own Python backend: an adapter, not a backend of its own.

`TritonModel` is an `openinfer.Model` whose handler calls ``TritonPythonModel.execute(requests)``
where an ``infer(inputs)`` model's function is called, with `triton_utils` objects viewing the
request (inputs stay zero-copy and read-only); mostly the core calls execute itself
(`TritonModel.direct`, csrc/python/triton_execute.c), handing what it does not take as it is to
`TritonModel._conclude`. So the scheduler, batcher, cancellation flag,
decoupled streaming and worker processes are the ones every Python model has:

- one ``TritonPythonModel`` object per instance: in the server process (a pool the executor
  threads take one from for each call) or, with more than one instance, one in each worker
  process (`TritonFile`, which a worker loads as it loads an ``infer`` model's function);
- ``initialize(args)`` at load, with Triton's args; its exception fails the version with the
  exception's text; ``finalize()`` at unload and stop (`TritonModel.close`, and a worker's end);
- a decoupled model's responses, sent with its request's response sender from execute or from
  any thread afterwards, are drained by the executor until the final flag, as a generator
  ``infer`` model's would be. The executor serving such a request stays with it until then.

A dynamic batch, which openinfer's batcher concatenates, reaches execute as Triton's list of
requests: the core says where each request's rows start and what its id is (the handler's
cancel flag's batch(), also across the process wire), and the adapter slices views of them
and joins the responses by rows again. See docs/triton_python.md for what differs.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import queue
import threading
import traceback
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import _core
from .._config import triton_config
from ..config import ConfigError, ModelConfig
from ..model import Model, Tensor, numpy_dtype
from . import triton_metrics, triton_ready, triton_wire
from . import triton_utils as pb
from .model_file import _LoadError, import_model_file
from .processes import ModelFile, bind_file
from .reused_threads import ReusedThreads

CLASS = "TritonPythonModel"
# What a Triton model.py imports by name; import_model_file provides it.
PROVIDED = {"triton_python_backend_utils": pb}
# python_backend's stub launcher refuses a stub named (after the model or its instance) with
# any of these (pb_utils.h INVALID_CHARS); a Triton Python model so named fails to load.
_STUB_NAME_REFUSES = frozenset(";|&$`<>()[]{}\\\"'*?~#!")
# How often a decoupled request's drain checks whether its client has gone.
_POLL_S = 0.05


# Batches one instance of an ``async def execute`` model runs at once (Triton's async execute:
# the instance takes the next batch while earlier ones await); its executor threads are this
# many per instance, all running their coroutines on the instance's one event loop.
ASYNC_IN_FLIGHT = 8
# Streams one instance of a decoupled Python-based backend (an engine such as vLLM's, whose
# execute hands each request over and returns) keeps open at once: as in Triton, the instance
# takes its next request once execute returned, while earlier requests still stream. Each open
# stream holds one executor thread, so the scheduler gives such an instance this many; execute
# itself still runs one call at a time on each instance.
BACKEND_STREAMS = 64
# The threads decoupled requests' executes run on, shared by every model.
_DECOUPLED_THREADS = ReusedThreads("openinfer-decoupled-execute")


async def _in_context(coroutine: Any, serving: Any) -> Any:
    """Runs an execute coroutine with pb_utils' context (its task has a context of its own)."""
    pb._serving_var.set(serving)
    return await coroutine


def defines_triton_model(module: Any) -> bool:
    """Whether a model.py is a Triton Python-backend model: it defines TritonPythonModel and no
    ``infer`` function (which would make it an openinfer model)."""
    return isinstance(getattr(module, CLASS, None), type) and not callable(getattr(module, "infer", None))


def describe(e: BaseException) -> str:
    """An exception as Triton's stub words one from Python: type, message and where."""
    frames = traceback.extract_tb(e.__traceback__)
    where = "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    text = f"{type(e).__name__}: {e}"
    return f"{text}\n\nAt:\n{where}" if where else text


@contextmanager
def _model_dir(version_dir: str) -> Iterator[None]:
    """pb_utils.get_model_dir() answers `version_dir` meanwhile (in this thread or task)."""
    token = pb._model_dir_var.set(version_dir)
    try:
        yield
    finally:
        pb._model_dir_var.reset(token)


def _listed(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A parsed config.pbtxt with its tensors and instance groups as lists (and each tensor's
    dims), as Triton's JSON has them, auto_complete_config's and pb_utils.ModelConfig's: text
    format writes a repeated field's single item without brackets too (`input { ... }`, `dims: 4`)."""

    def as_list(value: Any) -> list[Any]:
        return list(value) if isinstance(value, list) else [value]

    config = dict(raw)
    for key in ("input", "output", "instance_group"):
        if key in config:
            config[key] = [dict(item) if isinstance(item, Mapping) else item for item in as_list(config[key])]
    for key in ("input", "output"):
        for tensor in config.get(key, []):
            if isinstance(tensor, dict) and "dims" in tensor:
                tensor["dims"] = as_list(tensor["dims"])
    return config


def auto_complete(cls: type, config: dict[str, Any], version_dir: str = "") -> dict[str, Any]:
    """Runs ``TritonPythonModel.auto_complete_config`` over `config` (Triton's JSON shape), as Triton
    does before it loads a model: returns the completed config."""
    complete = getattr(cls, "auto_complete_config", None)
    if complete is None:
        return config
    name = config.get("name", "")
    try:
        with _model_dir(version_dir):
            result = complete(pb.ModelConfig(json.dumps(config)))
    except Exception as e:  # noqa: BLE001 - any error the model raises fails its load
        raise _LoadError(describe(e).rstrip()) from None
    if not isinstance(result, pb.ModelConfig):
        raise _LoadError(f"auto_complete_config function in model '{name}' must return a valid pb.ModelConfig object.")
    return result.as_dict()


@dataclass(frozen=True)
class TritonFile(ModelFile):
    """How to make and initialize one instance's object: by model.py's path, with the
    `initialize` args. Pickled into a worker process, whose `load` makes its one instance."""

    args: tuple[tuple[str, str], ...] = ()
    metrics: str = ""  # where the worker's pb_utils metrics go (triton_metrics.listen)
    names: tuple[str, ...] = ()  # each worker's model_instance_name, by worker number
    ready: str = ""  # where the server asks is_ready() (triton_ready.WorkerReadiness), if it does
    model_dir: str = ""  # the model's version folder (get_model_dir)
    backend: bool = False  # model.py is a Python-based backend's (python_based)

    def load(self, worker: int = 0) -> Instances:
        pb._in_worker = True
        pb._default_host[:] = [triton_wire.WireHost()]  # BLS over the process wire
        pb._default_model_dir[:] = [self.model_dir]  # a worker serves this one model
        if self.metrics:
            triton_metrics.send_to(self.metrics)
        module = import_model_file(self.model_name, self.version, Path(self.path), self.source, PROVIDED, self.backend)
        args = dict(self.args)
        if self.names:
            args["model_instance_name"] = self.names[worker % len(self.names)]
        instance = make_instance(module, args, self.model_dir)
        if self.ready:
            triton_ready.answer_in_worker(self.ready, worker, instance, args["model_instance_name"])
        return Instances([instance])


def make_instance(module: Any, args: dict[str, str], version_dir: str) -> Any:
    """A TritonPythonModel object, initialized; raises _LoadError with the text Triton reports
    for an initialize that fails."""
    try:
        instance = getattr(module, CLASS)()
        initialize = getattr(instance, "initialize", None)
        if initialize is not None:
            with _model_dir(version_dir):
                initialize(args)
    except Exception as e:  # noqa: BLE001 - the model's own error, reported as Triton reports it
        raise _LoadError(describe(e).rstrip()) from None
    return instance


class Instances:
    """A model's TritonPythonModel objects in this process, each used by one executor at a time.
    Not called directly: `TritonModel.handler` takes one per call."""

    def __init__(self, objects: list[Any], in_flight: int = 1, version_dir: str = "") -> None:
        self._objects = objects
        self._version_dir = version_dir
        self._free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._loops: dict[int, asyncio.AbstractEventLoop] = {}
        self._lock = threading.Lock()
        for o in objects:
            for _ in range(in_flight):  # an async execute's object serves that many executors
                self._free.put(o)

    def run(self, instance: Any, coroutine: Any) -> Any:
        """Runs an ``async def execute`` coroutine on the instance's event loop (a thread of its
        own, started at the first), waiting for its result: the instance's other executors
        run theirs on the same loop meanwhile."""
        with self._lock:
            loop = self._loops.get(id(instance))
            if loop is None:
                loop = self._loops[id(instance)] = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="openinfer-async-execute", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> None:
        raise TypeError("a TritonPythonModel is called through TritonModel.handler")

    def acquire(self) -> Any:
        return self._free.get()

    def release(self, instance: Any) -> None:
        self._free.put(instance)

    def finalize(self) -> None:
        """Calls each object's finalize once; an error in one is logged and the others go on."""
        objects, self._objects = self._objects, []
        with self._lock:
            loops, self._loops = list(self._loops.values()), {}
        for loop in loops:
            loop.call_soon_threadsafe(loop.stop)
        for o in objects:
            finalize = getattr(o, "finalize", None)
            if finalize is None:
                continue
            try:
                with _model_dir(self._version_dir):
                    finalize()
            except Exception as e:  # noqa: BLE001 - unload goes on whatever finalize does
                pb.Logger.log_error(f"finalize of a TritonPythonModel failed: {describe(e)}")


class TritonModel(Model):
    """An `openinfer.Model` whose function is a set of TritonPythonModel objects (`Instances`)."""

    # Set by `bind` (the dataclass fields of Model are frozen; these are the adapter's own).
    _instance_name: str
    _input_types: dict[str, str]
    _version_dir: str
    _host: Any = None
    # Executor threads per instance: ASYNC_IN_FLIGHT for an async execute in the server process
    # (the model's config, statistics and metrics still count its instances).
    in_flight: int = 1
    # Outputs are answered in the shape execute produced: Triton's core checks them by name only.
    outputs_as_produced = True
    # The config's `reshape`s, by tensor name: (dims, reshape.shape), past the batch dimension.
    # execute sees an input in its reshape and produces an output in it (Triton's core reshapes
    # both, as it does for every backend); the client sends and gets them in their dims.
    _input_reshapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    _output_reshapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def attach(self, host: Any) -> None:
        """The server's model control, which pb_utils' BLS and model control calls reach
        (`ModelControl.bls`, `load_model`, ...); set as the version is registered."""
        object.__setattr__(self, "_host", host)
        pb._default_host[:] = [host]

    @property
    def each_parameters(self) -> bool:
        """execute sees each request of a batch with its own parameters (see `_batch`)."""
        return True

    def bind(self, instance_name: str, version_dir: str) -> None:
        object.__setattr__(self, "_instance_name", instance_name)
        object.__setattr__(self, "_version_dir", version_dir)
        object.__setattr__(self, "_input_types", {t.name: t.datatype for t in self.inputs})
        object.__setattr__(self, "_ready", None)

    @property
    def ready_probe(self) -> bool:
        """Whether a ready check asks the model (`ready`): its instances define is_ready()."""
        return self._ready is not None

    def ready(self) -> bool:
        """The instances' own readiness (is_ready()); called on a control thread of the core."""
        return self._ready() if self._ready is not None else True

    @property
    def direct(self) -> Any:
        """The core's own call of execute for a request or dynamic batch of a model that is not
        decoupled (`_core.TritonExecute`, csrc/python/triton_execute.c): `handler`'s work without its
        Python frames, where nothing of the model needs them (no reshape, BF16 output or
        coroutine execute, one executor per instance). None otherwise: `handler` serves all."""
        instances = self.fn
        if (self.decoupled or self.in_flight != 1 or self._input_reshapes or self._output_reshapes
                or self._bf16_outputs or not isinstance(instances, Instances)
                or any(inspect.iscoroutinefunction(getattr(o, "execute", None)) for o in instances._objects)):
            return None  # fmt: skip
        return _core.TritonExecute(
            instances._free, self._conclude, pb._serving_var, (self._host, self.name, self._version_dir),
            tuple((t.name, t.datatype) for t in self.inputs), tuple(t.name for t in self.outputs),
            (pb.InferenceRequest, pb.Tensor, pb.InferenceResponse),
        )

    def close(self) -> None:
        """finalize() of the objects in this process (a worker's run theirs as the worker ends)."""
        if isinstance(self.fn, Instances):
            self.fn.finalize()
        close = getattr(getattr(self, "_ready", None), "close", None)
        if close is not None:  # the workers' readiness socket
            close()

    def handler(
        self,
        inputs: dict[str, np.ndarray],
        parameters: bytes | None,
        outputs: tuple[str, ...],
        cancelled: Callable[[], bool] = lambda: False,
    ) -> dict[str, object] | Iterator[dict[str, object]]:
        if self._input_reshapes:
            for name, (dims, shape) in self._input_reshapes.items():
                if name in inputs:
                    inputs[name] = _reshaped(inputs[name], self.max_batch_size > 0, dims, shape)
        if self.max_batch_size > 0:  # only a batching model's call can be a dynamic batch
            batch = cancelled.batch() if hasattr(cancelled, "batch") else None
            if batch is not None:
                return self._batch(batch, inputs, parameters, outputs, cancelled)
        request = pb.InferenceRequest._served(
            self.name, inputs, self._input_types, outputs, parameters, cancelled, self.decoupled
        )
        request_id = getattr(cancelled, "request_id", None)
        if request_id is not None:
            request._request_id = request_id() or ""
        if self.decoupled:
            return self._decoupled(request, outputs, cancelled)
        result = self._execute([request], cancelled)
        if type(result) is list and len(result) == 1 and request._sender is None:
            response = result[0]  # the common answer: outputs alone, returned in the list
            if type(response) is pb.InferenceResponse and response._error is None and response._parameters is None:
                return self._present(self._outputs(response), outputs)
        return self._answer(self._returned(result, [request])[0], outputs)

    def _decoupled(
        self, request: pb.InferenceRequest, outputs: tuple[str, ...], cancelled: Callable[[], bool]
    ) -> Iterator[dict[str, object]]:
        """A decoupled request: execute runs on a thread of its own while this executor sends
        what it sends, as it sends it (as Triton's stub does), so a response sent before execute
        returns reaches its client (or BLS caller) at once, and a cancellation reaches execute."""
        sender = request.get_response_sender()

        def run() -> None:
            try:
                if self._execute([request], cancelled) is not None:
                    raise self._failure(
                        f"Python model '{self._instance_name}' is using the decoupled mode and the execute "
                        "function must return None."
                    )
            except BaseException as e:  # noqa: BLE001 - whatever ends execute ends the stream (SystemExit too)
                sender._fail(e if isinstance(e, pb.ResponseError) else self._failure(describe(e)))

        _DECOUPLED_THREADS.run(run)
        return self._stream(sender, outputs, cancelled)

    def _execute(self, requests: list[pb.InferenceRequest], cancelled: Callable[[], bool]) -> Any:
        instances: Instances = self.fn  # type: ignore[assignment]
        instance = instances.acquire()
        serving = pb._serving_var.set((self._host, self.name, cancelled, self._version_dir))
        try:
            try:
                return self._settled(instances, instance, requests, cancelled, instance.execute(requests))
            except Exception as e:  # noqa: BLE001 - the client gets it as Triton words it
                return self._failed(e, requests)
        finally:
            pb._serving_var.reset(serving)
            instances.release(instance)

    def _conclude(
        self, instance: Any, requests: list[pb.InferenceRequest], outputs: tuple[str, ...],
        cancelled: Callable[[], bool], result: Any, error: Exception | None,
    ) -> dict[str, object]:
        """The answer to `requests` (a lone request, or a dynamic batch's) once the core called
        execute itself (`direct`) and got `result`, or `error` raised, that is not the common
        answer: what `handler` answers for them. Called with `instance` still taken and
        pb_utils' context still set."""
        if error is None:
            try:
                result = self._settled(self.fn, instance, requests, cancelled, result)  # type: ignore[arg-type]
            except Exception as e:  # noqa: BLE001 - as _execute's
                error = e
        if error is not None:
            result = self._failed(error, requests)
        batch = cancelled.batch() if hasattr(cancelled, "batch") else None
        if batch is not None:
            return self._joined(batch, requests, result, outputs, cancelled)
        return self._answer(self._returned(result, requests)[0], outputs)

    def _settled(
        self, instances: Instances, instance: Any, requests: list[pb.InferenceRequest], cancelled: Callable[[], bool],
        result: Any,
    ) -> Any:
        """execute's `result` (each request's flags were RELEASE_ALL, as _served makes them),
        awaited if a coroutine, and executed again for the requests it rescheduled."""
        result = self._awaited(instances, instance, result)
        for request in requests:
            if request._release_flags == pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                return self._rescheduled(instances, instance, requests, cancelled, result)
        return result  # the common case: nothing rescheduled

    def _failed(self, e: Exception, requests: list[pb.InferenceRequest]) -> None:
        """What execute's exception `e` answers: nothing when every request already has its
        final flag (Triton logs the error), else the failure, raised, that the client gets."""
        if all(request._sender is not None and request._sender._final for request in requests):
            pb.Logger.log_error(f"Failed to process the request(s) for model '{self._instance_name}': {describe(e)}")
            return None
        for request in requests:
            if request._sender is not None:
                request._sender._close()
        raise self._failure(describe(e)) from None

    def _rescheduled(
        self, instances: Instances, instance: Any, requests: list[pb.InferenceRequest], cancelled: Callable[[], bool],
        result: Any,
    ) -> Any:
        """execute's `result` for `requests`, some of which it rescheduled (set_release_flags(
        RESCHEDULE)): execute again for those until none is, on this instance at once, the requests
        keeping their senders. A non-decoupled model returns None for each rescheduled request, as
        Triton requires."""
        rescheduled = pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
        pending, final = list(range(len(requests))), [None] * len(requests)
        while True:
            again = [i for i in pending if requests[i]._release_flags == rescheduled]
            if isinstance(result, list) and len(result) == len(pending):
                for i, item in zip(pending, result):
                    if i in again and item is not None:
                        raise self._failure(
                            "Expected a None object in the execute function return list for reschduled request, "
                            f"found type '{type(item)}'."
                        )
                    final[i] = item
            elif result is not None:
                return result  # checked (and refused) as any other return
            if not again:
                return None if all(item is None for item in final) else final
            if cancelled():
                raise pb.ResponseError(499, "the request was cancelled")
            pending = again
            batch = [requests[i] for i in pending]
            for request in batch:
                request._release_flags = pb.TRITONSERVER_REQUEST_RELEASE_ALL
            result = self._call(instances, instance, batch)

    def _call(self, instances: Instances, instance: Any, requests: list[pb.InferenceRequest]) -> Any:
        """One execute; a coroutine's (``async def execute``) runs on the instance's event loop."""
        return self._awaited(instances, instance, instance.execute(requests))

    @staticmethod
    def _awaited(instances: Instances, instance: Any, result: Any) -> Any:
        if type(result) is not list and inspect.iscoroutine(result):
            result = instances.run(instance, _in_context(result, pb._serving_var.get()))
        return result

    def _batch(
        self,
        batch: tuple[tuple[int, str | None], ...],
        inputs: dict[str, np.ndarray],
        parameters: bytes | None,
        outputs: tuple[str, ...],
        cancelled: Callable[[], bool],
    ) -> dict[str, object]:
        """A dynamic batch the scheduler concatenated, served as Triton serves one: execute gets
        each request apart (views of its rows, its own id and parameters), and their outputs are
        joined again by rows for the scheduler to split, each response's parameters going to its
        own request (`cancelled.respond_parameters`). An error response fails its own request
        alone (`cancelled.fail`), and an output a response left out is left out of its request's
        (`cancelled.leave_out`); their rows in the joined outputs are filler."""
        requests, start = [], 0
        for rows, request_id, own in batch:
            views = {name: array[start : start + rows] for name, array in inputs.items()}
            request = pb.InferenceRequest._served(self.name, views, self._input_types, outputs, own, cancelled, False)
            request._request_id = request_id or ""
            requests.append(request)
            start += rows
        return self._joined(batch, requests, self._execute(requests, cancelled), outputs, cancelled)

    def _joined(
        self,
        batch: tuple[tuple[int, str | None, bytes | None], ...],
        requests: list[pb.InferenceRequest],
        result: Any,
        outputs: tuple[str, ...],
        cancelled: Callable[[], bool],
    ) -> dict[str, object]:
        """A dynamic batch's answer: execute's `result` for its `requests`, joined by rows."""
        produced: list[dict[str, object] | None] = []
        for k, response in enumerate(self._returned(result, requests)):
            try:
                answer = self._outputs(response)
                if response._parameters is not None:
                    params = _checked_json(response._parameters, self._failure)
                    cancelled.respond_parameters(k, params)  # type: ignore[attr-defined]
                produced.append(answer)
            except pb.ResponseError as e:
                cancelled.fail(k, e.status, e.message)  # type: ignore[attr-defined]
                produced.append(None)
        if all(p is None for p in produced):
            return {}
        joined: dict[str, object] = {}
        for i, name in enumerate(outputs):
            given = [np.asarray(p[name]) if p is not None and p.get(name) is not None else None for p in produced]
            like = next((g for g in given if g is not None), None)
            if like is None:
                continue  # no response of the batch has it: left out of each
            for k, (g, p) in enumerate(zip(given, produced)):
                if g is None and p is not None:
                    cancelled.leave_out(k, i)  # type: ignore[attr-defined]
            parts = [g if g is not None else _filler(like, rows) for g, (rows, _, _) in zip(given, batch)]
            joined[name] = np.concatenate(parts)
        return self._present(joined, outputs)

    def _returned(self, result: Any, requests: list[pb.InferenceRequest]) -> list[pb.InferenceResponse]:
        """A non-decoupled execute's responses, one per request: returned in a list (an item, or
        the whole return, None when that request's response went through its sender), checked as
        Triton checks them."""
        if result is None:
            return [self._sent(request._sender) for request in requests]
        if not isinstance(result, list):
            raise self._failure(f"Expected a list in the execute return, found type '{type(result)}'.")
        if len(result) != len(requests):
            raise self._failure(
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(result)}\n"
            )
        responses = []
        for item, request in zip(result, requests):
            if item is None:
                responses.append(self._sent(request._sender))
                continue
            if type(item) is not pb.InferenceResponse and not isinstance(item, pb.InferenceResponse):
                raise self._failure(
                    "Expected an 'InferenceResponse' object in the execute function return list, found type "
                    f"'{type(item)}'."
                )
            if request._sender is not None:
                request._sender._close()
            responses.append(item)
        return responses

    def _sent(self, sender: pb.InferenceResponseSender | None) -> pb.InferenceResponse:
        """The response a non-decoupled model sent through its request's sender."""
        response = None
        if sender is not None:
            sender._close()
            try:
                response, _ = sender._queue.get_nowait()
            except queue.Empty:
                pass
        if response is None:
            raise self._failure("the execute function returned None and sent no response")
        return response

    def _stream(
        self, sender: pb.InferenceResponseSender, outputs: tuple[str, ...], cancelled: Callable[[], bool]
    ) -> Iterator[dict[str, object]]:
        """A decoupled request's responses, as its sender is given them, until the final flag or
        until its client goes (then later sends are refused: the sender is closed)."""
        try:
            while True:
                try:
                    response, flags = sender._queue.get(timeout=_POLL_S)
                except queue.Empty:
                    if cancelled():
                        return
                    continue
                if isinstance(response, pb.ResponseError):
                    raise response
                final = bool(flags & pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                if response is not None:
                    yield self._answer(response, outputs, final)
                if final:
                    return
        finally:
            if cancelled():  # the client went: the model hears it from is_cancelled()
                sender._drop()
            else:
                sender._close()

    def _answer(
        self, response: pb.InferenceResponse, outputs: tuple[str, ...], final: bool = False
    ) -> dict[str, object]:
        """The outputs asked for that the response has, with what the core sends beside them: the
        response's parameters and whether the final flag came with it (then no empty response
        follows)."""
        params = response._parameters
        checked = None if params is None else _checked_json(params, self._failure)
        return self._present(self._outputs(response), outputs, checked, final)

    def _present(
        self, produced: dict[str, object], outputs: tuple[str, ...], parameters: str | None = None,
        final: bool = False,
    ) -> dict[str, object]:
        """The asked `outputs` that `produced` holds: Triton's core sends a response with the
        outputs it has, so an _Answer (which the core reads as free to leave some out) when one
        is missing or more than the outputs travel. The common answer (every asked output,
        nothing beside) is `produced` itself: the core reads the asked outputs by name."""
        present = outputs
        for name in outputs:  # a loop, not a comprehension: nothing built when all are there
            if name not in produced:
                present = tuple(n for n in outputs if n in produced)
                break
        if parameters is None and not final and present is outputs:
            return self._select(produced, outputs) if self._bf16_outputs else produced
        answer = _Answer(self._select(produced, present))
        answer.response_parameters = parameters
        answer.response_final = final
        return answer

    def _outputs(self, response: pb.InferenceResponse) -> dict[str, object]:
        error = response._error
        if error is not None:
            raise pb.ResponseError(error.status(), error.message())
        produced: dict[str, object] = {}
        for t in response._outputs:
            produced[t._name] = _bytes_as_triton_sends(t._array) if t._datatype == "BYTES" else t._array
        if self._output_reshapes:
            for name, (dims, shape) in self._output_reshapes.items():
                if isinstance(produced.get(name), np.ndarray):
                    produced[name] = _reshaped(produced[name], self.max_batch_size > 0, shape, dims)  # type: ignore[arg-type]
        return produced

    def _failure(self, message: str) -> pb.ResponseError:
        return pb.ResponseError(
            500, f"Failed to process the request(s) for model '{self._instance_name}', message: {message}"
        )


class _Answer(dict):
    """A response's outputs, with its parameters as JSON text (`response_parameters`) and the
    final flag that came with it (`response_final`): oi_response_t's parameters and final."""

    __slots__ = ("response_parameters", "response_final")


def _checked_json(text: str, failure: Callable[[str], Exception]) -> str:
    """Response parameters given as JSON text, checked as a dict of them is (the encoders send
    the text as it is)."""
    try:
        params = json.loads(text)
    except ValueError:
        params = None
    if not isinstance(params, dict):
        raise failure(f"response parameters must be a JSON object, got {text[:100]!r}")
    try:
        return pb._parameters_json(params)
    except pb.TritonModelException as e:
        raise failure(str(e)) from None


def _bytes_as_triton_sends(array: np.ndarray) -> np.ndarray:
    """A BYTES output's items as Triton's serialize_byte_tensor writes them: bytes and str as
    they are, any other item (int, float, bool, ...) as str(item)."""
    if array.dtype != np.object_:
        return array
    for x in array.flat:  # a loop, not all() over a generator: this runs for each streamed token
        if type(x) is not bytes and type(x) is not str:
            break
    else:
        return array
    items = [x if isinstance(x, (bytes, str)) else str(x) for x in array.flat]
    return np.array(items, dtype=np.object_).reshape(array.shape)


def _reshaped(array: np.ndarray, batched: bool, dims: tuple[int, ...], to: tuple[int, ...]) -> np.ndarray:
    """`array` (its shape `dims` past the batch dimension when `batched`) in the shape `to`:
    Triton's reshape, the k-th -1 of `to` the size `array` has at the k-th -1 of `dims` (an
    array of another rank, or of another element count, is left as it is)."""
    lead = array.shape[:1] if batched and array.ndim > 0 else ()
    past = array.shape[len(lead):]
    if len(past) != len(dims):
        return array
    free = iter(size for d, size in zip(dims, past) if d == -1)
    shape = (*lead, *(next(free, -1) if d == -1 else d for d in to))
    try:
        return array.reshape(shape)
    except ValueError:
        return array


def _filler(like: np.ndarray, rows: int) -> np.ndarray:
    """The rows of a failed request of a batch, shaped as `like`'s (never sent)."""
    shape = (rows, *like.shape[1:])
    return np.full(shape, b"", dtype=object) if like.dtype == object else np.zeros(shape, like.dtype)


def load(
    name: str, version: int, path: Path, source: bytes, module: Any, config: ModelConfig | None,
    in_processes: bool, version_dir: Path | None = None,
) -> TritonModel:
    """A TritonPythonModel model.py as a served version: auto-completes its config, then makes
    and initializes its instances here, or describes them to worker processes (`in_processes`).
    `version_dir` is the model's version folder where model.py lies elsewhere (a Python-based
    backend's, python_based): get_model_dir() and initialize's args name the model's folders."""
    backend = version_dir is not None
    folder = str(version_dir if version_dir is not None else path.parent)
    raw = _listed(config.raw) if config is not None else {}
    raw.setdefault("name", name)
    raw.setdefault("max_batch_size", 0)
    raw.setdefault("input", [])
    raw.setdefault("output", [])
    completed = auto_complete(getattr(module, CLASS), raw, folder)
    try:
        final = ModelConfig.from_dict(completed, f"{path} (auto_complete_config)")
    except ConfigError as e:
        raise _LoadError(str(e)) from None
    if not final.inputs and not final.outputs:
        raise _LoadError(
            f"{name}: no inputs or outputs declared: add input/output to config.pbtxt or "
            f"add them in {CLASS}.auto_complete_config"
        )
    batch = [-1] if final.max_batch_size > 0 else []
    policy = completed.get("model_transaction_policy")
    decoupled = bool(policy.get("decoupled")) if isinstance(policy, dict) else False
    # An async execute in the server process gets ASYNC_IN_FLIGHT executors per instance (in_flight).
    in_flight = ASYNC_IN_FLIGHT if inspect.iscoroutinefunction(getattr(getattr(module, CLASS), "execute", None)) else 1
    in_flight = 1 if in_processes else in_flight
    try:
        model = TritonModel(
            name,
            Instances([]),
            inputs=[Tensor(t.name, t.datatype, [*batch, *t.dims], optional=t.optional) for t in final.inputs],
            outputs=[Tensor(t.name, t.datatype, [*batch, *t.dims]) for t in final.outputs],
            max_batch_size=final.max_batch_size,
            version=version,
            instances=final.instances,
            platform=final.platform or final.backend or "python",
            # A decoupled model's requests run one at a time: its config keeps dynamic_batching.
            dynamic_batching=final.dynamic_batching if "dynamic_batching" in completed and not decoupled else None,
            decoupled=decoupled,
            processes=False,
        )
    except (TypeError, ValueError) as e:
        raise _LoadError(f"{path}: {e}") from None
    full = triton_config.complete(name, triton_config.normalize(completed, str(path)), model, backend="python")
    config_json = json.dumps(triton_config.to_json(full), separators=(",", ":"))
    names = [(f"{g['name']}_{k}", g["kind"].removeprefix("KIND_")) for g in full["instance_group"] for k in range(g["count"])]
    if any(_STUB_NAME_REFUSES.intersection(n) for n in [name, *(n for n, _ in names)]):
        raise _LoadError("Invalid stub name: contains invalid characters")
    streams = BACKEND_STREAMS if backend and decoupled and not in_processes else 1
    object.__setattr__(model, "in_flight", max(in_flight, streams))
    for attr, declared, kind in (("_input_reshapes", final.inputs, "input"), ("_output_reshapes", final.outputs, "output")):
        reshapes = {t["name"]: t["reshape"] for t in full.get(kind, []) if isinstance(t.get("reshape"), dict)}
        object.__setattr__(model, attr, {t.name: (tuple(t.dims), tuple(reshapes[t.name].get("shape", [])))
                                         for t in declared if t.name in reshapes})  # fmt: skip

    def args(instance: str, kind: str) -> dict[str, str]:
        return {
            "model_config": config_json,
            "model_instance_kind": kind,
            "model_instance_name": instance,
            "model_instance_device_id": "0",
            "model_repository": str(Path(folder).parent),
            "model_version": str(version),
            "model_name": name,
        }

    model.bind(names[0][0], folder)
    if in_processes:  # each worker makes its own instance, named by its number
        asks = triton_ready.WorkerReadiness(model.instances) if triton_ready.defines_is_ready(getattr(module, CLASS)) else None
        object.__setattr__(model, "_ready", asks)
        if asks is not None:
            weakref.finalize(model, asks.close)  # at unload
        recipe = TritonFile(
            str(path), source, CLASS, name, version, tuple(args(*names[0]).items()), triton_metrics.listen(),
            tuple(n for n, _ in names), asks.address if asks is not None else "", folder, backend,
        )
        bind_file(model, recipe)
        return model
    objects = [make_instance(module, args(*n), folder) for n in names]
    instances = Instances(objects, in_flight, folder)
    if triton_ready.defines_is_ready(getattr(module, CLASS)):
        object.__setattr__(model, "_ready", triton_ready.Readiness([(o, n) for o, (n, _) in zip(objects, names)]))
    object.__setattr__(model, "fn", instances)
    object.__setattr__(model, "_source", instances)
    weakref.finalize(model, instances.finalize)  # at unload, once the last request is answered
    return model
