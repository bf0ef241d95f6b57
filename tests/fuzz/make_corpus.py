"""Regenerates the recorded part of the seed corpora of fuzz_http1 and fuzz_grpc: real
clients (tritonclient.http, tritonclient.grpc, grpcio) talk to a real openinfer server through
a recording proxy, and what each client connection sent becomes one seed file, after a first
byte 0 (written at once: see harness_chunk in server_harness.h). gRPC seeds leave out the
24-byte client preface (fuzz_grpc puts it in front of every input).

    PYTHONPATH=python .venv/bin/python tests/fuzz/make_corpus.py

The models are the example repository's (simple, simple_string, identity_fp32), which the
fuzz harness imitates; shared-memory seeds use the one key the harness can open
(OI_FUZZ_SHM_KEY in server_harness.h). Hand-written seeds (edge cases of framing) live beside
the recorded ones and are not touched: recorded files are named rec-*.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

import openinfer

CORPUS = Path(__file__).resolve().parent / "corpus"
SHM_KEY = "/oi_fuzz_region"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Recorder:
    """A TCP proxy on a free loopback port that forwards to `target` and keeps the bytes
    each client connection sent, in the order the connections were accepted."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.conns: list[bytearray] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            sent = bytearray()
            with self.lock:
                self.conns.append(sent)
            threading.Thread(target=self._pipe, args=(client, upstream, sent), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, None), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, keep: bytearray | None) -> None:
        try:
            while data := src.recv(65536):
                if keep is not None:
                    keep += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def take(self) -> list[bytes]:
        with self.lock:
            out = [bytes(c) for c in self.conns]
            self.conns.clear()
        return out


def record(rec: Recorder, target: str, name: str, scenario: Callable[[str], None], strip: bytes = b"") -> None:
    import time

    rec.take()
    try:
        scenario(f"127.0.0.1:{rec.port}")
    except Exception as e:  # an error answer is as good a seed as any: its request counts
        print(f"  {name}: {type(e).__name__}: {str(e)[:120]}")
    time.sleep(0.3)  # let the proxy pass on the last bytes
    out = CORPUS / target
    out.mkdir(parents=True, exist_ok=True)
    for i, data in enumerate(c for c in rec.take() if c):
        if strip and data.startswith(strip):
            data = data[len(strip):]
        path = out / f"rec-{name}-{i}"
        path.write_bytes(b"\0" + data)
        print(f"  {path.relative_to(CORPUS)}: {len(data)} bytes")


def simple_inputs(mod) -> list:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    ins = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
    return ins, a


def http_scenarios() -> dict[str, Callable[[str], None]]:
    import tritonclient.http as th

    def health(url: str) -> None:
        c = th.InferenceServerClient(url)
        c.is_server_live(), c.is_server_ready(), c.get_server_metadata()
        c.get_model_metadata("simple"), c.is_model_ready("simple", "1")

    def infer(binary: bool, compression: str | None = None) -> Callable[[str], None]:
        def run(url: str) -> None:
            c = th.InferenceServerClient(url)
            ins, a = simple_inputs(th)
            ins[0].set_data_from_numpy(a, binary_data=binary)
            ins[1].set_data_from_numpy(a + 1, binary_data=binary)
            outs = [th.InferRequestedOutput("OUTPUT0", binary_data=binary), th.InferRequestedOutput("OUTPUT1")]
            c.infer("simple", ins, outputs=outs, request_id="7", request_compression_algorithm=compression,
                    response_compression_algorithm=compression)
        return run

    def strings(url: str) -> None:
        c = th.InferenceServerClient(url)
        s = np.array([[str(i).encode() for i in range(16)]], dtype=object)
        ins = [th.InferInput("INPUT0", [1, 16], "BYTES"), th.InferInput("INPUT1", [1, 16], "BYTES")]
        ins[0].set_data_from_numpy(s)
        ins[1].set_data_from_numpy(s, binary_data=False)
        c.infer("simple_string", ins)

    def identity(url: str) -> None:
        c = th.InferenceServerClient(url)
        x = th.InferInput("INPUT0", [5], "FP32")
        x.set_data_from_numpy(np.array([1.5, -2, 3e38, 0, 7], dtype=np.float32), binary_data=False)
        c.infer("identity_fp32", [x])

    def shm(url: str) -> None:
        import tritonclient.utils.shared_memory as shm_util

        c = th.InferenceServerClient(url)
        h = shm_util.create_shared_memory_region("fuzz_in", SHM_KEY, 4096)
        try:
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            shm_util.set_shared_memory_region(h, [a])
            c.register_system_shared_memory("fuzz_in", SHM_KEY, 4096)
            c.get_system_shared_memory_status()
            ins, _ = simple_inputs(th)
            ins[0].set_shared_memory("fuzz_in", 64)
            ins[1].set_shared_memory("fuzz_in", 64, offset=0)
            out = th.InferRequestedOutput("OUTPUT0", binary_data=True)
            out.set_shared_memory("fuzz_in", 64, offset=128)
            c.infer("simple", ins, outputs=[out, th.InferRequestedOutput("OUTPUT1")])
            c.unregister_system_shared_memory("fuzz_in")
            c.unregister_system_shared_memory()
            c.get_cuda_shared_memory_status()
        finally:
            shm_util.destroy_shared_memory_region(h)

    return {"http-health": health, "http-infer-json": infer(False), "http-infer-binary": infer(True),
            "http-infer-gzip": infer(True, "gzip"), "http-infer-deflate": infer(False, "deflate"),
            "http-strings": strings, "http-identity": identity, "http-shm": shm}


def grpc_scenarios() -> dict[str, Callable[[str], None]]:
    import tritonclient.grpc as tg

    def health(url: str) -> None:
        c = tg.InferenceServerClient(url)
        c.is_server_live(), c.is_server_ready(), c.get_server_metadata()
        c.get_model_metadata("simple"), c.is_model_ready("simple")
        c.close()

    def infer(url: str) -> None:
        c = tg.InferenceServerClient(url)
        ins, a = simple_inputs(tg)
        ins[0].set_data_from_numpy(a)
        ins[1].set_data_from_numpy(a + 1)
        c.infer("simple", ins, outputs=[tg.InferRequestedOutput("OUTPUT1")], request_id="9", client_timeout=30)
        c.close()

    def strings(url: str) -> None:
        c = tg.InferenceServerClient(url)
        s = np.array([[str(i).encode() for i in range(16)]], dtype=object)
        ins = [tg.InferInput("INPUT0", [1, 16], "BYTES"), tg.InferInput("INPUT1", [1, 16], "BYTES")]
        ins[0].set_data_from_numpy(s)
        ins[1].set_data_from_numpy(s)
        c.infer("simple_string", ins)
        c.close()

    def stream(url: str) -> None:
        import queue

        c = tg.InferenceServerClient(url)
        got: queue.Queue = queue.Queue()
        c.start_stream(callback=lambda result, error: got.put((result, error)))
        for k in range(3):
            ins, a = simple_inputs(tg)
            ins[0].set_data_from_numpy(a + k)
            ins[1].set_data_from_numpy(a)
            c.async_stream_infer("simple", ins, request_id=str(k))
        for _ in range(3):
            got.get(timeout=10)
        c.stop_stream()
        c.close()

    def shm(url: str) -> None:
        import tritonclient.utils.shared_memory as shm_util

        c = tg.InferenceServerClient(url)
        h = shm_util.create_shared_memory_region("fuzz_in", SHM_KEY, 4096)
        try:
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            shm_util.set_shared_memory_region(h, [a])
            c.register_system_shared_memory("fuzz_in", SHM_KEY, 4096)
            c.get_system_shared_memory_status()
            ins, _ = simple_inputs(tg)
            ins[0].set_shared_memory("fuzz_in", 64)
            ins[1].set_shared_memory("fuzz_in", 64)
            out = tg.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory("fuzz_in", 64, offset=128)
            c.infer("simple", ins, outputs=[out])
            c.unregister_system_shared_memory("fuzz_in")
            c.get_cuda_shared_memory_status()
        finally:
            shm_util.destroy_shared_memory_region(h)
        c.close()

    def errors(url: str) -> None:
        c = tg.InferenceServerClient(url)
        for f in (lambda: c.get_model_metadata("nope"), lambda: c.get_model_metadata("broken"),
                  lambda: c.infer("simple", [tg.InferInput("INPUT0", [1, 3], "FP32")])):
            try:
                f()
            except Exception:
                pass
        c.close()

    return {"grpc-health": health, "grpc-infer": infer, "grpc-strings": strings, "grpc-stream": stream,
            "grpc-shm": shm, "grpc-errors": errors}


def codec_seeds() -> None:
    """Seeds of the codec targets: V2 JSON bodies (fuzz_json), ModelInferRequest messages
    (fuzz_pb_infer), ModelInferResponse and ModelStreamInferResponse messages (fuzz_pb_response)."""
    import json
    import struct

    from tritonclient.grpc import service_pb2 as pb

    def write(target: str, name: str, data: bytes) -> None:
        out = CORPUS / target
        out.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)

    simple = {"id": "1", "parameters": {"binary_data_output": True, "priority": 2},
              "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [list(range(16))]},
                         {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}],
              "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}, {"name": "OUTPUT1"}]}
    write("fuzz_json", "simple.json", json.dumps(simple).encode())
    kinds = {"BOOL": [True, False], "UINT8": [0, 255], "INT64": [-(2**63), 2**63 - 1], "FP16": [65504, 1e-7],
             "BF16": [0.1, -3.5], "FP64": [1e308, -0.0], "BYTES": ["a\u00e9", ""], "UINT64": [0, 2**64 - 1]}
    write("fuzz_json", "datatypes.json", json.dumps({"inputs": [
        {"name": k.lower(), "shape": [2], "datatype": k, "data": v} for k, v in kinds.items()]}).encode())
    head = json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 8}},
                                  {"name": "s", "shape": [1], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": 7}}],
                       "outputs": [{"name": "x", "parameters": {"binary_data": True}}]}).encode()
    write("fuzz_json", "binary.json", head + struct.pack("<2f", 1.5, -2) + struct.pack("<I", 3) + b"abc")
    write("fuzz_json", "shm.json", json.dumps({"inputs": [{"name": "x", "shape": [4], "datatype": "FP32",
        "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16, "shared_memory_offset": 8}}],
        "outputs": [{"name": "y", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}}]}).encode())

    write("fuzz_json", "sequence.json", json.dumps({"parameters": {
        "sequence_id": "s\u00e9q\n", "sequence_start": True, "sequence_end": False, "sequence_id ": 5},
        "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}).encode())
    seq = pb.ModelInferRequest(model_name="simple_sequence")
    seq.parameters["sequence_id"].string_param = "abc"
    seq.parameters["sequence_start"].bool_param = True
    seq.parameters["sequence_end"].bool_param = False
    seq.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
    seq.raw_input_contents.append(np.arange(1, dtype=np.int32).tobytes())
    write("fuzz_pb_infer", "sequence.pb", seq.SerializeToString())

    req = pb.ModelInferRequest(model_name="simple", model_version="1", id="7")
    req.parameters["priority"].int64_param = 1
    req.parameters["tag"].string_param = "t"
    for name in ("INPUT0", "INPUT1"):
        t = req.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        t.parameters["p"].bool_param = True
    req.raw_input_contents.extend([np.arange(16, dtype=np.int32).tobytes()] * 2)
    req.outputs.add(name="OUTPUT0").parameters["binary_data"].bool_param = True
    write("fuzz_pb_infer", "raw.pb", req.SerializeToString())
    typed = pb.ModelInferRequest(model_name="identity_fp32")
    t = typed.inputs.add(name="INPUT0", datatype="FP32", shape=[3])
    t.contents.fp32_contents.extend([1.5, -2, 3e38])
    t = typed.inputs.add(name="s", datatype="BYTES", shape=[2])
    t.contents.bytes_contents.extend([b"ab", b""])
    t = typed.inputs.add(name="b", datatype="BOOL", shape=[1])
    t.contents.bool_contents.append(True)
    t = typed.inputs.add(name="i", datatype="INT64", shape=[1])
    t.contents.int64_contents.append(-5)
    write("fuzz_pb_infer", "typed.pb", typed.SerializeToString())
    shm = pb.ModelInferRequest(model_name="simple")
    t = shm.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    t.parameters["shared_memory_region"].string_param = "r"
    t.parameters["shared_memory_byte_size"].int64_param = 64
    shm.outputs.add(name="OUTPUT0").parameters["shared_memory_region"].string_param = "r"
    write("fuzz_pb_infer", "shm.pb", shm.SerializeToString())

    resp = pb.ModelInferResponse(model_name="simple", model_version="1", id="7")
    for name in ("OUTPUT0", "OUTPUT1"):
        resp.outputs.add(name=name, datatype="INT32", shape=[1, 16])
    resp.raw_output_contents.extend([np.arange(16, dtype=np.int32).tobytes()] * 2)
    write("fuzz_pb_response", "raw.pb", resp.SerializeToString())
    typed_resp = pb.ModelInferResponse(model_name="m")
    o = typed_resp.outputs.add(name="y", datatype="FP64", shape=[2])
    o.contents.fp64_contents.extend([0.5, -1])
    o = typed_resp.outputs.add(name="s", datatype="BYTES", shape=[1])
    o.contents.bytes_contents.append(b"xyz")
    write("fuzz_pb_response", "typed.pb", typed_resp.SerializeToString())
    write("fuzz_pb_response", "stream.pb", pb.ModelStreamInferResponse(infer_response=resp).SerializeToString())
    write("fuzz_pb_response", "stream-error.pb",
          pb.ModelStreamInferResponse(error_message="input 'x': bad").SerializeToString())


def main() -> None:
    codec_seeds()
    server = openinfer.serve(http_port=0, grpc_port=0)
    try:
        http = Recorder(server.http_port)
        grpc = Recorder(server.grpc_port)
        for name, scenario in http_scenarios().items():
            record(http, "fuzz_http1", name, scenario)
        for name, scenario in grpc_scenarios().items():
            record(grpc, "fuzz_grpc", name, scenario, strip=PREFACE)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
