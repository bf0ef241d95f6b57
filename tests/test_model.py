"""Tensor and Model validation, the datatype mapping and Model.handler, called directly."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import openinfer
from openinfer import InferenceServerError, Model, Tensor
from openinfer.model import DATATYPES, datatype_of, numpy_dtype


def add(inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    return {"SUM": inputs["A"] + inputs["B"], "DIFF": inputs["A"] - inputs["B"]}


def adder(fn: Any = add, name: str = "adder", **kw: Any) -> Model:
    spec: dict[str, Any] = dict(
        inputs=[Tensor("A", "INT32", [-1, 4]), Tensor("B", "INT32", [-1, 4])],
        outputs=[Tensor("SUM", "INT32", [-1, 4]), Tensor("DIFF", "INT32", [-1, 4])],
        max_batch_size=8,
    )
    spec.update(kw)
    return Model(name, fn, **spec)


# Tensor


def test_tensor_normalises_shape() -> None:
    tensor = Tensor("x", "FP32", [np.int64(-1), 3])
    assert tensor.shape == (-1, 3) and type(tensor.shape[0]) is int
    assert Tensor("x", "BYTES", ()).shape == ()
    assert tensor == Tensor("x", "FP32", (-1, 3))
    with pytest.raises(AttributeError):
        tensor.name = "y"  # type: ignore[misc]


def test_tensor_of_any_shape() -> None:
    assert Tensor("x", "FP32", None).shape is None
    with pytest.raises(ValueError, match="input 'x' has any shape, but with max_batch_size=4"):
        Model(
            "m",
            add,
            inputs=[Tensor("x", "FP32", None)],
            outputs=[("y", "FP32", [-1])],
            max_batch_size=4,
        )
    assert (
        Model("m", add, inputs=[("x", "FP32", None)], outputs=[("y", "FP32", None)])
        .outputs[0]
        .shape
        is None
    )


@pytest.mark.parametrize("datatype", DATATYPES)
def test_tensor_accepts_every_v2_datatype(datatype: str) -> None:
    assert Tensor("x", datatype, [1]).datatype == datatype


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("x", "FLOAT32", [1]),
            "tensor 'x': datatype 'FLOAT32' is not a V2 datatype (expected one of BOOL,",
        ),
        (("x", "fp32", [1]), "datatype 'fp32' is not a V2 datatype"),
        (("x", "FP32", [-2]), "tensor 'x': shape [-2] must hold ints >= -1"),
        (("x", "FP32", [1.0]), "must hold ints >= -1 (-1 for a variable dimension), got 1.0"),
        (("x", "FP32", [True]), "got True"),
        (("x", "FP32", "16"), "shape must be a sequence of ints or None"),
        (("x", "FP32", 16), "shape must be a sequence of ints"),
        (("", "FP32", [1]), "tensor name must be a non-empty string"),
    ],
)
def test_tensor_rejects(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError) as error:
        Tensor(*args)
    assert message in str(error.value)


# Datatype mapping


def test_numpy_dtype_mapping_round_trips() -> None:
    for datatype in DATATYPES:
        if datatype != "BF16":
            assert datatype_of(numpy_dtype(datatype)) == datatype
    assert numpy_dtype("BF16") == np.uint16  # bit patterns: numpy has no bfloat16
    assert datatype_of(np.uint16) == "UINT16"
    assert datatype_of(np.dtype(">i4")) == "INT32"
    assert datatype_of(np.dtype("S5")) == "BYTES" and datatype_of(np.dtype("U3")) == "BYTES"
    with pytest.raises(ValueError, match="not a V2 datatype"):
        numpy_dtype("FLOAT")
    with pytest.raises(ValueError, match="complex128 has no V2 datatype"):
        datatype_of(np.complex128)


def test_bfloat16_from_ml_dtypes() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert datatype_of(ml_dtypes.bfloat16) == "BF16"


# Model validation


def test_model_fields() -> None:
    model = adder(version=3, instances=2)
    assert model.name == "adder" and model.fn is add
    assert model.inputs == (Tensor("A", "INT32", (-1, 4)), Tensor("B", "INT32", (-1, 4)))
    assert (model.max_batch_size, model.version, model.instances, model.platform) == (
        8,
        3,
        2,
        "python",
    )


def test_model_accepts_tuples_as_tensors() -> None:
    model = Model("m", add, inputs=[("A", "FP32", [2])], outputs=(("SUM", "FP32", [2]),))
    assert model.inputs == (Tensor("A", "FP32", (2,)),)
    assert model.outputs == (Tensor("SUM", "FP32", (2,)),)


def test_batching_model_needs_a_leading_batch_dimension() -> None:
    with pytest.raises(ValueError) as error:
        adder(inputs=[Tensor("A", "INT32", [4])])
    assert str(error.value) == (
        "model 'adder': input 'A' has shape [4], but with max_batch_size=8 the first dimension "
        "is the batch and must be -1, e.g. [-1, 4]"
    )
    with pytest.raises(ValueError, match="output 'SUM' has shape \\[\\]"):
        adder(outputs=[Tensor("SUM", "INT32", [])])
    # Without batching any shape goes, -1 included.
    assert adder(max_batch_size=0, inputs=[Tensor("A", "INT32", [4, -1])]).max_batch_size == 0


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        ({"name": "a/b"}, ValueError, "model name must be a non-empty string without '/'"),
        ({"name": ""}, ValueError, "model name must be a non-empty string"),
        ({"fn": 3}, TypeError, "model 'adder': fn must be callable"),
        ({"outputs": []}, ValueError, "model 'adder': declare at least one output"),
        (
            {"inputs": [Tensor("A", "INT32", [-1]), Tensor("A", "FP32", [-1])]},
            ValueError,
            "model 'adder': input 'A' is declared twice",
        ),
        (
            {"inputs": Tensor("A", "INT32", [-1])},
            TypeError,
            "inputs must be a list of openinfer.Tensor",
        ),
        ({"max_batch_size": -1}, ValueError, "max_batch_size must be an int >= 0, got -1"),
        ({"max_batch_size": 1.5}, ValueError, "max_batch_size must be an int >= 0"),
        ({"version": -1}, ValueError, "version must be an int >= 0"),
        ({"instances": 0}, ValueError, "instances must be an int >= 1"),
        ({"instances": True}, ValueError, "instances must be an int >= 1"),
    ],
)
def test_model_rejects(kw: dict[str, Any], error: type[Exception], message: str) -> None:
    name = kw.pop("name", "adder")
    fn = kw.pop("fn", add)
    spec: dict[str, Any] = dict(
        inputs=[Tensor("A", "INT32", [-1, 4])],
        outputs=[Tensor("SUM", "INT32", [-1, 4])],
        max_batch_size=8,
    )
    spec.update(kw)
    with pytest.raises(error) as raised:
        Model(name, fn, **spec)
    assert message in str(raised.value)


def test_decorator() -> None:
    @openinfer.model(inputs=[Tensor("A", "FP32", [-1])], outputs=[Tensor("B", "FP32", [-1])])
    def double(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"B": inputs["A"] * 2}

    assert isinstance(double, Model) and double.name == "double"
    named = openinfer.model(name="twice", inputs=[], outputs=[("B", "FP32", [1])], version=2)(
        double.fn
    )
    assert (named.name, named.version, named.inputs) == ("twice", 2, ())


# Model.handler


def test_handler_returns_the_requested_outputs_in_order() -> None:
    a = np.arange(8, dtype=np.int32).reshape(2, 4)
    b = np.ones((2, 4), dtype=np.int32)
    a.flags.writeable = b.flags.writeable = False  # what the core hands over
    model = adder()
    result = model.handler({"A": a, "B": b}, None, ("DIFF", "SUM"))
    assert list(result) == ["DIFF", "SUM"]
    np.testing.assert_array_equal(result["SUM"], a + 1)
    np.testing.assert_array_equal(result["DIFF"], a - 1)
    assert list(model.handler({"A": a, "B": b}, None, ("SUM",))) == ["SUM"]


def test_handler_passes_parameters_to_models_that_take_them() -> None:
    seen: list[Any] = []

    def keyword(inputs: dict[str, np.ndarray], *, parameters: dict[str, Any]) -> dict[str, Any]:
        seen.append(parameters)
        return {"Y": inputs["X"]}

    def positional(inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> dict[str, Any]:
        seen.append(parameters)
        return {"Y": inputs["X"]}

    io: dict[str, Any] = dict(inputs=[Tensor("X", "FP32", [1])], outputs=[Tensor("Y", "FP32", [1])])
    x = np.zeros(1, dtype=np.float32)
    Model("k", keyword, **io).handler({"X": x}, b'{"scale": 2, "tag": "a"}', ("Y",))
    Model("p", positional, **io).handler({"X": x}, None, ("Y",))
    assert seen == [{"scale": 2, "tag": "a"}, {}]


def test_handler_does_not_pass_parameters_to_models_without_them() -> None:
    def kwargs_only(inputs: dict[str, np.ndarray], **kw: Any) -> dict[str, Any]:
        assert kw == {}
        return {"Y": inputs["X"]}

    model = Model(
        "m", kwargs_only, inputs=[Tensor("X", "FP32", [1])], outputs=[Tensor("Y", "FP32", [1])]
    )
    assert "Y" in model.handler({"X": np.zeros(1, np.float32)}, b'{"a": 1}', ("Y",))
    builtin = Model("b", dict, inputs=[], outputs=[Tensor("Y", "FP32", [1])])
    assert builtin.handler({"Y": 1.0}, b"{}", ("Y",)) == {"Y": 1.0}  # type: ignore[dict-item]


def test_handler_reports_a_non_mapping_result() -> None:
    def returns_a_list(inputs: dict[str, np.ndarray]) -> Any:
        return [1, 2]

    model = Model("bad", returns_a_list, inputs=[], outputs=[Tensor("Y", "FP32", [2])])
    with pytest.raises(TypeError) as error:
        model.handler({}, None, ("Y",))
    assert str(error.value) == "model 'bad' returned list; expected a dict of output name -> array"


def test_handler_reports_a_missing_output() -> None:
    model = adder(fn=lambda inputs: {"SUM": 1})
    with pytest.raises(ValueError) as error:
        model.handler({}, None, ("SUM", "DIFF"))
    assert str(error.value) == "model 'adder' did not return output 'DIFF' (returned 'SUM')"
    with pytest.raises(ValueError, match=r"\(returned nothing\)"):
        adder(fn=lambda inputs: {}).handler({}, None, ("SUM",))


def test_handler_converts_bf16_outputs_to_bit_patterns() -> None:
    values = np.array([1.0, -2.5, 3.140625, np.inf, 1.00390625, 1.01171875], dtype=np.float32)
    outputs: dict[str, Any] = {}
    model = Model("bf", lambda inputs: outputs, inputs=[], outputs=[Tensor("Y", "BF16", [-1])])

    outputs["Y"] = values
    bits = model.handler({}, None, ("Y",))["Y"]
    assert isinstance(bits, np.ndarray) and bits.dtype == np.uint16
    # 1.00390625 is halfway between two bfloat16 values and rounds to even (1.0); 1.01171875
    # is halfway too and rounds up to the even 1.015625.
    assert bits.tolist() == [0x3F80, 0xC020, 0x4049, 0x7F80, 0x3F80, 0x3F82]

    outputs["Y"] = [float("nan"), -0.0, 2]  # lists and ints convert numerically
    nan, negative_zero, two = model.handler({}, None, ("Y",))["Y"].tolist()  # type: ignore[attr-defined]
    assert nan & 0x7F80 == 0x7F80 and nan & 0x007F and (negative_zero, two) == (0x8000, 0x4000)

    outputs["Y"] = np.array([0x3F80], dtype=np.uint16)  # bit patterns pass through
    assert model.handler({}, None, ("Y",))["Y"] is outputs["Y"]

    outputs["Y"] = np.array([b"x"], dtype=object)
    with pytest.raises(
        TypeError, match="model 'bf': output 'Y' is BF16 but the model returned object"
    ):
        model.handler({}, None, ("Y",))


def test_handler_accepts_ml_dtypes_bfloat16() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = np.array([1.0, -2.5], dtype=ml_dtypes.bfloat16)
    model = Model(
        "bf", lambda inputs: {"Y": values}, inputs=[], outputs=[Tensor("Y", "BF16", [-1])]
    )
    assert model.handler({}, None, ("Y",))["Y"].tolist() == [0x3F80, 0xC020]  # type: ignore[attr-defined]


# Errors


def test_inference_server_error() -> None:
    error = InferenceServerError(404, "unknown model 'x'")
    assert (error.status, error.message) == (404, "unknown model 'x'")
    assert str(error) == "[404] unknown model 'x'"
    assert isinstance(error, Exception)


GEVENT_HUB_ON_AN_EXECUTOR = """\
import gevent
import numpy as np
import openinfer
from openinfer import Model, Tensor

def fn(inputs):
    gevent.get_hub()  # a hub of its own in this executor thread's thread-locals
    return {"OUTPUT0": inputs["INPUT0"]}

gevent.get_hub()  # the default loop goes to the main thread, as tritonclient.http's use does
srv = openinfer.serve(models=[Model("hub", fn, inputs=[Tensor("INPUT0", "INT32", [-1])],
                                    outputs=[Tensor("OUTPUT0", "INT32", [-1])])], http_port=0, log=False)
with openinfer.Client(srv.url) as client:
    assert client.infer("hub", {"INPUT0": np.array([1], np.int32)})["OUTPUT0"].tolist() == [1]
srv.stop()
print("stopped")
"""


def test_stop_ends_executors_whose_thread_locals_take_the_gil_when_freed() -> None:
    """gevent's hub, left in an executor thread's thread-locals (a model used gevent, or the
    garbage collector ran a gevent finalizer there), takes the GIL as it is freed. Freed at
    thread exit after Python's record of the thread was cleared, it waited forever for the GIL
    its own thread held, and stop() never returned."""
    r = subprocess.run([sys.executable, "-c", GEVENT_HUB_ON_AN_EXECUTOR], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "stopped", r.stderr[-2000:]


# The core calls a plain model's function itself (Model.direct), without the handler


def test_direct_is_offered_only_for_plain_models() -> None:
    plain = adder()
    assert plain.direct == (plain.fn, plain._select)
    assert adder(fn=lambda inputs, parameters: {}).direct is None  # wants parameters
    assert adder(fn=lambda inputs, request: {}).direct is None  # wants the request
    assert adder(decoupled=True).direct is None
    bf16 = Model("b", lambda inputs: {}, inputs=[], outputs=[Tensor("Y", "BF16", [1])])
    assert bf16.direct is None  # its outputs are converted by the handler


def test_direct_models_answer_and_fail_as_through_the_handler() -> None:
    """Each function served twice, plain (called directly by the core) and taking
    `parameters` (called through the handler): the same answers and the same errors, through
    tritonclient.http."""
    import types

    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    def raises(inputs: dict[str, np.ndarray]) -> Any:
        raise RuntimeError("no")

    fns: dict[str, Any] = {
        "extra": lambda inputs: {"SUM": inputs["A"] + inputs["B"], "DIFF": inputs["A"] - inputs["B"], "X": 1},
        "proxy": lambda inputs: types.MappingProxyType({"SUM": inputs["A"] * 2, "DIFF": inputs["B"] * 2}),
        "returns_list": lambda inputs: [1, 2],
        "missing": lambda inputs: {"SUM": inputs["A"]},
        "raises": raises,
    }
    models = []
    for name, fn in fns.items():
        models.append(adder(fn=fn, name=name))
        models.append(adder(fn=lambda inputs, parameters, fn=fn: fn(inputs), name=f"{name}_handler"))
    assert all((m.direct is None) == m.name.endswith("_handler") for m in models)

    def not_called(*args: Any) -> Any:
        raise AssertionError("the handler of a plain model was called")

    for m in models:  # the plain ones must not need it
        if m.direct is not None:
            object.__setattr__(m, "handler", not_called)
    srv = openinfer.serve(models=models, http_port=0, log=False)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{srv.http_port}")
    try:
        a = np.array([[1, 2, 3, 4]], np.int32)
        b = np.array([[4, 3, 2, 1]], np.int32)

        def call(model: str) -> tuple[str, Any]:
            inputs = [httpclient.InferInput("A", [1, 4], "INT32"), httpclient.InferInput("B", [1, 4], "INT32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            outputs = [httpclient.InferRequestedOutput("DIFF"), httpclient.InferRequestedOutput("SUM")]
            try:
                r = client.infer(model, inputs, outputs=outputs)
            except InferenceServerException as e:
                return "error", (e.status(), e.message().replace(f"'{model}'", "'M'"))
            return "ok", (r.as_numpy("DIFF").tolist(), r.as_numpy("SUM").tolist(), r.get_response()["outputs"][0]["name"])

        seen = {name: call(name) for name in fns}
        assert seen == {name: call(f"{name}_handler") for name in fns}
        assert seen["extra"] == ("ok", ((a - b).tolist(), (a + b).tolist(), "DIFF"))
        assert seen["proxy"] == ("ok", ((b * 2).tolist(), (a * 2).tolist(), "DIFF"))
        assert seen["returns_list"] == (
            "error", ("500", "model 'M' raised TypeError: model 'M' returned list; expected a dict of output name -> array"))
        assert seen["missing"] == (
            "error", ("500", "model 'M' raised ValueError: model 'M' did not return output 'DIFF' (returned 'SUM')"))
        assert seen["raises"] == ("error", ("500", "model 'M' raised RuntimeError: no"))
    finally:
        client.close()
        srv.stop()


def test_a_malformed_direct_spec_is_refused() -> None:
    """add_model(direct=...) must be (fn, select): anything else is a TypeError saying so, and
    nothing is registered."""
    model = adder()
    with openinfer.serve(models=[], http_port=0, log=False) as srv:
        for bad in [(model.fn,), model.fn, (model.fn, model._select, 3), (model.fn, 3)]:
            with pytest.raises(TypeError, match=r"direct is \(fn, select\)"):
                srv._core.add_model("bad_direct", 1, inputs=[("A", "INT32", (-1, 4))], outputs=[("SUM", "INT32", (-1, 4))],
                                    max_batch_size=8, metadata_json=b"{}", handler=model.handler, direct=bad)
        assert "bad_direct" not in srv.models
