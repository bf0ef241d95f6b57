"""BLS cycles fail fast (issue 38, point 6): a Triton Python model's
pb_utils.InferenceRequest(...).exec() into a model that is already waiting up its own call chain
(A -> A, A -> B -> A), or past 16 nested calls, is refused at once with an error naming
the chain, instead of waiting on itself; the chain travels with each request, in the server
and across the worker-process wire (the server side of a worker's BLS knows the request the
worker runs). A chain of distinct models still works.

Every model here is the same "hop" model: it calls the first model named by its PATH input with
the rest of the path, and answers what came back (or the error's message); at the end of the
path, "reached <name>". Served over HTTP through tritonclient, with a client timeout that a
deadlock would run into."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as thttp

import openinfer
from conftest import triton_http

DEPTH = 16  # openinfer's bound on nested BLS calls (OI_BLS_MAX_DEPTH)
HOP = textwrap.dedent(
    """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.name = args["model_name"]

        def execute(self, requests):
            responses = []
            for request in requests:
                path = pb_utils.get_input_tensor_by_name(request, "PATH").as_numpy()[0].decode()
                hops = [hop for hop in path.split(",") if hop]
                if not hops:
                    out = f"reached {self.name}"
                else:
                    rest = pb_utils.Tensor("PATH", np.array([",".join(hops[1:]).encode()], np.object_))
                    r = pb_utils.InferenceRequest(model_name=hops[0], inputs=[rest],
                                                  requested_output_names=["OUT"]).exec()
                    if r.has_error():
                        out = r.error().message()
                    else:
                        out = pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0].decode()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([out.encode()],
                                                                                             np.object_))]))
            return responses
    """
)


def _hop(repo: Path, name: str, group: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        input [ {{ name: "PATH" data_type: TYPE_STRING dims: [ 1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
        instance_group [ {{ {group} }} ]
        """))
    (repo / name / "1" / "model.py").write_text(HOP)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("bls_cycles")
    for name in ("a", "b", "c", *(f"d{i}" for i in range(1, DEPTH + 1))):
        _hop(repo, name, "count: 1 kind: KIND_MODEL")  # one instance in the server: a cycle would deadlock
    for name in ("wa", "wb"):
        _hop(repo, name, "count: 2 kind: KIND_CPU")  # worker processes
    srv = openinfer.serve(repo, http_port=0, grpc_port=None, log=False)
    try:
        yield srv
    finally:
        srv.stop()


def _walk(srv: openinfer.Server, first: str, path: list[str]) -> str:
    x = thttp.InferInput("PATH", [1], "BYTES")
    x.set_data_from_numpy(np.array([",".join(path).encode()], np.object_))
    result = triton_http(srv, timeout=20.0).infer(first, [x])
    return str(result.as_numpy("OUT")[0].decode())


def _cycle(*names: str) -> str:
    return f"BLS call cycle: {' -> '.join(names)} (model '{names[-1]}' is waiting up the call chain for this request)"


@pytest.mark.parametrize(
    ("first", "path", "answer"),
    [
        ("a", ["a"], _cycle("a", "a")),
        ("a", ["b", "a"], _cycle("a", "b", "a")),
        ("a", ["b", "c", "b"], _cycle("a", "b", "c", "b")),
        ("wa", ["wa"], _cycle("wa", "wa")),  # from a worker process, to its own model
        ("wa", ["wb", "wa"], _cycle("wa", "wb", "wa")),  # across two models' workers
        ("a", ["wa", "a"], _cycle("a", "wa", "a")),  # the server, a worker, the server again
        ("wa", ["a", "wa"], _cycle("wa", "a", "wa")),
    ],
)
def test_a_call_into_a_model_waiting_up_its_chain_fails_at_once_naming_the_chain(
    server: openinfer.Server, first: str, path: list[str], answer: str
) -> None:
    assert _walk(server, first, path) == answer


@pytest.mark.parametrize(("first", "path"), [("a", ["b", "c"]), ("wa", ["wb", "a"]), ("a", ["wa", "b", "wb"])])
def test_a_chain_of_distinct_models_works(server: openinfer.Server, first: str, path: list[str]) -> None:
    assert _walk(server, first, path) == f"reached {path[-1]}"
    assert _walk(server, first, path) == f"reached {path[-1]}"  # and the instances were all freed


def test_a_chain_deeper_than_the_bound_is_refused(server: openinfer.Server) -> None:
    deep = [f"d{i}" for i in range(1, DEPTH + 1)]
    assert _walk(server, "a", deep) == f"reached d{DEPTH}"  # a -> d1 ... -> d16: 16 nested calls, the most
    chain = " -> ".join(["a", *deep, "d17"])  # refused before d17 is looked for
    assert _walk(server, "a", [*deep, "d17"]) == (
        f"BLS call chain {chain} is deeper than openinfer allows ({DEPTH} nested calls)")
