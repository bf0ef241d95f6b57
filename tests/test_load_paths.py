"""Paths a model's configuration names stay inside the model's directory (issue 29, item 1).

A load request's config override (and the files sent with a load) is what a client controls.
Every path-bearing field -- default_model_filename, cc_model_filenames, label_filename, warm-up
input_data_file, initial_state data_file, an accelerator's cache path, ONNX external data --
given as an absolute path, as '../' out of the directory, or as a symbolic link that leads out,
is refused with a 400 / INVALID_ARGUMENT naming the field and the value, over HTTP and gRPC, and
a Python file so named is never run: `evil.py` would write MARKER (as the server's user, root).
The same attack made by another user (nobody) against this root server runs nothing either.
Files sent with a load that fail name paths relative to the model, not the server's temporary
directory; legitimate names and uploads still load."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

import openinfer
from conftest import INT32_IO, INT32_IO_PBTXT, triton_grpc, triton_http

NOBODY = 65534
OUTSIDE_ENV = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONMALLOC", "PYTHONPATH")}

CONFIG: dict[str, Any] = {
    "name": "simple",
    "backend": "python",
    **INT32_IO,
}
PBTXT = INT32_IO_PBTXT
ECHO = "def infer(inputs):\n    return {'OUTPUT0': inputs['INPUT0']}\n"
PLUS_ONE = "def infer(inputs):\n    return {'OUTPUT0': inputs['INPUT0'] + 1}\n"
EVIL = textwrap.dedent(
    """
    import os
    open({marker!r}, "a").write("ran as uid %d\\n" % os.geteuid())

    def infer(inputs):
        return {{"OUTPUT0": inputs["INPUT0"]}}
    """
)


class Layout:
    """The repository, a directory beside it (`outside`) holding evil.py and a secret, and the
    marker evil.py writes, in a directory only root may write."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.repo = root / "repo"
        self.outside = root / "outside"
        self.marker = root / "root-only" / "MARKER"
        self.marker.parent.mkdir(mode=0o700)
        self.outside.mkdir()
        self.evil = self.outside / "evil.py"
        self.evil.write_text(EVIL.format(marker=str(self.marker)))
        (self.outside / "secret").write_bytes(b"root's secret\n" * 8)
        simple = self.repo / "simple"
        (simple / "1").mkdir(parents=True)
        (simple / "config.pbtxt").write_text(f'name: "simple"\n{PBTXT}')
        (simple / "1" / "model.py").write_text(ECHO)
        # Symbolic links in the model's directories that lead out of them.
        (simple / "1" / "link.py").symlink_to(self.evil)
        (simple / "link.txt").symlink_to(self.outside / "secret")
        for folder in ("warmup", "initial_state"):
            (simple / folder).mkdir()
            (simple / folder / "link.bin").symlink_to(self.outside / "secret")
        alt = self.repo / "alt"
        (alt / "1").mkdir(parents=True)
        (alt / "config.pbtxt").write_text(f'name: "alt"\n{PBTXT}')
        (alt / "1" / "model.py").write_text(ECHO)
        (alt / "1" / "other.py").write_text(PLUS_ONE)

    def ran(self) -> bool:
        return self.marker.exists()


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Layout:
    return Layout(tmp_path_factory.mktemp("load-paths"))


@pytest.fixture(scope="module")
def server(layout: Layout) -> Iterator[openinfer.Server]:
    srv = openinfer.serve(layout.repo, http_port=0, grpc_port=0, threads=2, log=False,
                          model_control_mode="explicit", load_models=["simple", "alt"])
    try:
        yield srv
    finally:
        srv.stop()


def _with(**fields: Any) -> str:
    return json.dumps({**CONFIG, **fields})


def _state(data_file: str) -> dict[str, Any]:
    return {
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [1]}],
        "sequence_batching": {"state": [{
            "input_name": "S_IN", "output_name": "S_OUT", "data_type": "TYPE_INT32", "dims": [1],
            "initial_state": [{"name": "i", "data_type": "TYPE_INT32", "dims": [1], "data_file": data_file}],
        }]},
    }  # fmt: skip


def _warmup(name: str) -> dict[str, Any]:
    sample = {"name": "w", "batch_size": 1, "inputs": {"INPUT0": {"data_type": "TYPE_INT32", "dims": [1],
                                                                 "input_data_file": name}}}
    return {"model_warmup": [sample]}


def _label(name: str) -> dict[str, Any]:
    return {"output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [1], "label_filename": name}]}


def _accelerator(path: str) -> dict[str, Any]:
    accel = {"name": "openvino", "parameters": {"cache_dir": path}}
    return {"optimization": {"execution_accelerators": {"cpu_execution_accelerator": [accel]}}}


# (field as messages name it, the override's fields for a value, the directory the value is in)
FIELDS = [
    ("default_model_filename", lambda v: {"default_model_filename": v}, "1"),
    ("cc_model_filenames['7.5']", lambda v: {"cc_model_filenames": {"7.5": v}}, "1"),
    ("output[0].label_filename", _label, ""),
    ("model_warmup[0].inputs['INPUT0'].input_data_file", _warmup, "warmup"),
    ("sequence_batching.state[0].initial_state[0].data_file", _state, "initial_state"),
    ("optimization.execution_accelerators.cpu_execution_accelerator[0].parameters['cache_dir']", _accelerator, ""),
]


def _load(protocol: str, srv: openinfer.Server, name: str, config: str | None = None,
          files: dict[str, bytes] | None = None) -> tuple[str, str]:
    """Loads through tritonclient: ("ok", "") or (the status, the message)."""
    client = triton_http(srv) if protocol == "http" else triton_grpc(srv)
    try:
        client.load_model(name, config=config, files=files)
    except InferenceServerException as e:
        return str(e.status()), e.message() or ""
    return "ok", ""


BAD = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("field,fields,folder", FIELDS, ids=[f[0].split("[")[0].split(".")[-1] for f in FIELDS])
@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_a_path_out_of_the_model_is_refused(
    layout: Layout, server: openinfer.Server, protocol: str, field: str, fields: Any, folder: str, how: str
) -> None:
    directory = layout.repo / "simple" / folder
    value = str(layout.evil) if how == "absolute" else os.path.relpath(layout.evil, directory)
    assert os.path.exists(directory / value)  # the name does reach evil.py from there
    status, message = _load(protocol, server, "simple", _with(**fields(value)))
    assert status == BAD[protocol], message
    assert f"failed to load 'simple': Invalid config override: {field} '{value}' must be " in message
    assert "inside the " in message
    assert not layout.ran()
    assert triton_http(server).is_model_ready("simple")  # as it was


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("field,fields,link,where", [
    ("default_model_filename", lambda v: {"default_model_filename": v}, "link.py", "the version directory 1/"),
    ("label_filename", _label, "link.txt", "the model directory"),
    ("input_data_file", _warmup, "link.bin", "the model's warmup/ directory"),
    ("data_file", _state, "link.bin", "the model's initial_state/ directory"),
], ids=["default_model_filename", "label_filename", "input_data_file", "data_file"])  # fmt: skip
def test_a_symbolic_link_out_of_the_model_is_refused(
    layout: Layout, server: openinfer.Server, protocol: str, field: str, fields: Any, link: str, where: str
) -> None:
    status, message = _load(protocol, server, "simple", _with(**fields(link)))
    assert status == BAD[protocol], message
    assert message.startswith("load failed for model 'simple': ")
    assert f"{field} '{link}' leads outside {where} (through a symbolic link)" in message
    assert "root's secret" not in message
    assert not layout.ran()
    assert triton_http(server).is_model_ready("simple")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("value", ["a/b.py", ".", "..", "x\\y.py", "nul\0.py"])
def test_a_default_model_filename_is_one_file_name(
    layout: Layout, server: openinfer.Server, protocol: str, value: str
) -> None:
    status, message = _load(protocol, server, "simple", _with(default_model_filename=value))
    assert status == BAD[protocol], message
    shown = value.replace("\0", "\\x00")
    assert message == (f"failed to load 'simple': Invalid config override: default_model_filename '{shown}' "
                       "must be a file name inside the version directory")
    assert not layout.ran()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_another_file_of_the_version_directory_still_loads(server: openinfer.Server, protocol: str) -> None:
    assert _load(protocol, server, "alt", _with(name="alt", default_model_filename="other.py")) == ("ok", "")
    client = triton_http(server)
    x = thttp.InferInput("INPUT0", [1], "INT32")
    x.set_data_from_numpy(np.array([41], dtype=np.int32))
    assert client.infer("alt", [x]).as_numpy("OUTPUT0").tolist() == [42]
    assert _load(protocol, server, "alt") == ("ok", "")  # config.pbtxt again: model.py
    assert client.infer("alt", [x]).as_numpy("OUTPUT0").tolist() == [41]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_another_user_cannot_make_the_server_run_a_file(layout: Layout, server: openinfer.Server, how: str) -> None:
    # The server runs as root. A process of nobody writes evil.py into a directory of its own
    # under /tmp and asks the server, over HTTP, to load it as the model's file: evil.py would
    # write into a directory only root may write.
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin") or pytest.skip("no system python3")
    attack = textwrap.dedent(
        """
        import json, os, sys, tempfile, urllib.error, urllib.request
        port, marker, how = int(sys.argv[1]), sys.argv[2], sys.argv[3]
        folder = tempfile.mkdtemp(prefix="attack-")
        evil = os.path.join(folder, "evil.py")
        with open(evil, "w") as f:
            f.write("import os\\nopen(%r, 'a').write('ran as uid %%d' %% os.geteuid())\\n"
                    "def infer(inputs):\\n    return {'OUTPUT0': inputs['INPUT0']}\\n" % marker)
        name = evil if how == "absolute" else "../../../../../../../../.." + evil
        config = {"backend": "python", "default_model_filename": name,
                  "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [1]}],
                  "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [1]}]}
        body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
        request = urllib.request.Request(
            "http://127.0.0.1:%d/v2/repository/models/simple/load" % port, data=body, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                print(r.status, r.read().decode())
        except urllib.error.HTTPError as e:
            print(e.code, e.read().decode())
        print(os.geteuid(), folder)
        """
    )
    r = subprocess.run([python, "-c", attack, str(server.http_port), str(layout.marker), how], capture_output=True,
                       text=True, timeout=120, user=NOBODY, group=NOBODY, extra_groups=[], env=OUTSIDE_ENV, cwd="/")
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 2, r
    status, _, body = lines[0].partition(" ")
    uid, folder = lines[1].split()
    shutil.rmtree(folder, ignore_errors=True)
    assert uid == str(NOBODY)
    assert status == "400", body
    assert "Invalid config override: default_model_filename" in json.loads(body)["error"]
    assert not layout.ran()


# ---- ONNX: external data and uploads --------------------------------------------------------------


def _onnx(location: str | None = None) -> bytes:
    """An ONNX model whose output W (3 UINT8) is an initializer: its data inline, or in the
    external file `location`. X is an input the graph passes through."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.array([7, 8, 9], dtype=np.uint8), "W")
    if location is not None:
        w.ClearField("raw_data")
        w.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", "0"), ("length", "3")):
            entry = w.external_data.add()
            entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Identity", ["W"], ["Y"]), helper.make_node("Identity", ["X"], ["Z"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.UINT8, [3])],
        [helper.make_tensor_value_info("Y", TensorProto.UINT8, [3]),
         helper.make_tensor_value_info("Z", TensorProto.UINT8, [3])], [w])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


ONNX_CONFIG = json.dumps({"platform": "onnxruntime_onnx", "max_batch_size": 0})


def _weights(srv: openinfer.Server, name: str) -> list[int]:
    x = thttp.InferInput("X", [3], "UINT8")
    x.set_data_from_numpy(np.zeros(3, dtype=np.uint8))
    return triton_http(srv).infer(name, [x]).as_numpy("Y").tolist()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_an_uploaded_onnx_model_cannot_read_files_of_the_server(
    layout: Layout, server: openinfer.Server, protocol: str, how: str
) -> None:
    # Its external data would be the server's files, served back as the model's output.
    location = str(layout.outside / "secret") if how == "absolute" else "../../../../../../../../etc/hostname"
    files = {"file:1/model.onnx": _onnx(location)}
    status, message = _load(protocol, server, f"ext_{how}_{protocol}", ONNX_CONFIG, files)
    assert status == BAD[protocol], message
    assert (f"version 1 is at UNAVAILABLE state: model.onnx: external data location '{location}' must be a "
            "relative path inside the version directory 1/") in message
    assert "openinfer-repository-" not in message


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_external_data_through_a_symbolic_link_is_refused(
    layout: Layout, server: openinfer.Server, protocol: str
) -> None:
    model = layout.repo / f"ext_link_{protocol}"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(_onnx("w.bin"))
    (model / "1" / "w.bin").symlink_to(layout.outside / "secret")
    status, message = _load(protocol, server, model.name, ONNX_CONFIG)
    assert status == BAD[protocol], message
    assert ("model.onnx: external data location 'w.bin' leads outside the version directory 1/ (through a "
            "symbolic link)") in message


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_onnx_uploads_still_load(server: openinfer.Server, protocol: str) -> None:
    name = f"upload_{protocol}"
    assert _load(protocol, server, name, ONNX_CONFIG, {"file:1/model.onnx": _onnx()}) == ("ok", "")
    assert _weights(server, name) == [7, 8, 9]
    files = {"file:1/model.onnx": _onnx("weights/w.bin"), "file:1/weights/w.bin": bytes([4, 5, 6])}
    assert _load(protocol, server, name, ONNX_CONFIG, files) == ("ok", "")  # external data inside: fine
    assert _weights(server, name) == [4, 5, 6]


@pytest.mark.parametrize("swapped", ["w.bin", "model.onnx"])
def test_onnx_files_swapped_for_links_after_the_check_are_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swapped: str
) -> None:
    """The model file and its external data are read through the descriptors they were
    checked as (issue 38): swapped for links to another file once the model is described,
    the second instance's session still reads what was checked, never the file linked to."""
    from openinfer._backends import onnx_model

    version = tmp_path / "repo" / "ext" / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(_onnx("w.bin"))
    (version / "w.bin").write_bytes(bytes([7, 8, 9]))
    (version.parent / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n')
    (tmp_path / "secret.bin").write_bytes(b"SEC")  # as weights: served back; as the model: no model
    describe = onnx_model.describe

    def describe_then_swap(spec: dict[str, Any]) -> dict[str, Any]:
        described = describe(spec)
        os.symlink(tmp_path / "secret.bin", version / "link")
        os.replace(version / "link", version / swapped)
        return described

    monkeypatch.setattr(onnx_model, "describe", describe_then_swap)
    with openinfer.serve(tmp_path / "repo", http_port=0, grpc_port=None, log=False) as srv:
        for _ in range(4):  # both instances answer in turn
            assert _weights(srv, "ext") == [7, 8, 9]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_upload_errors_do_not_show_the_temporary_directory(server: openinfer.Server, protocol: str) -> None:
    status, message = _load(protocol, server, f"broken_{protocol}", ONNX_CONFIG,
                            {"file:1/model.onnx": b"not a model \xff\xfe"})
    assert status == BAD[protocol], message
    assert "1/model.onnx: not a valid ONNX model file" in message
    assert "openinfer-repository-" not in message and "/tmp" not in message
    index = {m["name"]: m for m in triton_http(server).get_model_repository_index()}
    assert "openinfer-repository-" not in index[f"broken_{protocol}"]["reason"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("key,why", [
    ("trt_extra_plugin_lib_paths", "names a library"),
    ("trt_engine_decryption_lib_path", "names a library"),
    ("gpu_external_alloc", "passes a memory address"),
    ("user_compute_stream", "passes a memory address"),
])  # fmt: skip
def test_accelerator_parameters_that_run_code_are_refused(
    server: openinfer.Server, protocol: str, key: str, why: str
) -> None:
    config = json.loads(ONNX_CONFIG)
    accel = {"name": "tensorrt", "parameters": {key: "/tmp/x.so"}}
    config["optimization"] = {"execution_accelerators": {"gpu_execution_accelerator": [accel]}}
    status, message = _load(protocol, server, f"accel_{protocol}", json.dumps(config),
                            {"file:1/model.onnx": _onnx()})
    assert status == BAD[protocol], message
    assert (f"optimization.execution_accelerators.gpu_execution_accelerator[0].parameters['{key}'] is not "
            f"accepted: it {why}") in message


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("filename,platform", [("model.pt2", "torch_aoti"), ("model.pt2", "pytorch_libtorch"),
                                               ("model.pt", "torch_aoti")])
def test_an_uploaded_pt2_package_is_not_loaded(
    layout: Layout, server: openinfer.Server, protocol: str, filename: str, platform: str
) -> None:
    # A PT2 (AOTInductor) package holds a shared library that loading it runs: uploaded, it would
    # run as the server's own code, as a model.py would.
    config = json.dumps({"platform": platform, "default_model_filename": filename,
                         **{k: v for k, v in CONFIG.items() if k in ("input", "output")}})
    status, message = _load(protocol, server, f"pt2_{protocol}", config, {f"file:1/{filename}": b"PK\3\4 not a zip"})
    assert status == BAD[protocol], message
    assert (f"version 1 is at UNAVAILABLE state: {filename}: a PT2 package sent with the load request is not "
            "loaded (its compiled library would run as the server's own code); put PT2 packages in the model "
            "repository") in message
