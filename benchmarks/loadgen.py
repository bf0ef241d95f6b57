#!/usr/bin/env python3
"""Worker side of the Python-client scenarios (S4, S7): the load generator.

Started by common.Worker, pinned with taskset; reads one JSON command per line
on stdin and answers one JSON line on stdout (stderr is the log). Kinds:

    loadgen.py openinfer URL      openinfer.Client (http:// or grpc:// URL; socket path:
                                  shared_memory=False)
    loadgen.py openinfer-shm URL  openinfer.Client as it is against a local server (shared memory)
    loadgen.py tritonclient URL   tritonclient.http.InferenceServerClient
    loadgen.py tritonclient-grpc URL   tritonclient.grpc.InferenceServerClient
    loadgen.py raw                TCP echo client and numpy memcpy (limits)
    loadgen.py echo-server PORT   TCP echo server on 127.0.0.1 (not a JSON worker)

Ops (keyword arguments in the command):
    verify                                  one checked request of each kind
    simple   seconds, mode, concurrency     model `simple`, INT32 [1,16]; mode seq, async,
                                            threads, greenlets (tritonclient.http), stream (gRPC)
    tensor   seconds, nbytes, min_iters     identity_fp32, FP32 of nbytes, sequential
    tensor_inplace  seconds, nbytes, min_iters  the same on an array in a registered region,
                                            output into the same place (openinfer-shm)
    echo     seconds, nbytes, min_iters, port   raw: send nbytes, receive nbytes back
    memcpy   seconds, nbytes, min_iters     raw: numpy copy of nbytes

Every measuring op answers {n, elapsed, cpu, bytes_per_req, p50_us, p90_us,
p99_us, max_us}: requests completed, wall seconds, this process's CPU seconds
(user+system, all threads, from getrusage) over the measured loop, the payload
bytes counted per request (request + response), latency percentiles.
"""

from __future__ import annotations

import inspect
import json
import resource
import socket
import struct
import sys
import threading
import time
from collections import deque

import numpy as np

SIMPLE_A = np.arange(16, dtype=np.int32).reshape(1, 16)
SIMPLE_B = np.ones((1, 16), dtype=np.int32)


def dist_version(name: str) -> str:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:  # noqa: BLE001
        return "?"


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def summary(lat_ns: list[int], elapsed: float, cpu: float, bytes_per_req: int = 0) -> dict:
    lat = np.sort(np.asarray(lat_ns, dtype=np.float64)) / 1e3
    if len(lat) == 0:
        raise RuntimeError("no request completed")
    p = np.percentile(lat, [50, 90, 99])
    return {"n": int(len(lat)), "elapsed": elapsed, "cpu": cpu,
            "bytes_per_req": bytes_per_req, "p50_us": float(p[0]),
            "p90_us": float(p[1]), "p99_us": float(p[2]), "max_us": float(lat[-1])}


def timed_seq(fn, seconds: float, min_iters: int = 1, bytes_per_req: int = 0) -> dict:
    """Call fn() back to back for `seconds` (and at least min_iters times)."""
    lat: list[int] = []
    now = time.perf_counter_ns
    c0, t0 = cpu_seconds(), now()
    deadline = t0 + int(seconds * 1e9)
    while True:
        a = now()
        fn()
        b = now()
        lat.append(b - a)
        if b >= deadline and len(lat) >= min_iters:
            break
    t1, c1 = now(), cpu_seconds()
    return summary(lat, (t1 - t0) / 1e9, c1 - c0, bytes_per_req)


def timed_threads(fn, seconds: float, concurrency: int) -> dict:
    """`concurrency` threads each calling fn() back to back for `seconds`."""
    lat: list[int] = []
    errors: list[BaseException] = []
    now = time.perf_counter_ns
    start = threading.Barrier(concurrency + 1)
    deadline = [0]

    def loop():
        mine = []
        try:
            start.wait()
            while True:
                a = now()
                fn()
                b = now()
                mine.append(b - a)
                if b >= deadline[0]:
                    break
        except BaseException as e:  # noqa: BLE001 - reported to the driver
            errors.append(e)
        lat.extend(mine)

    threads = [threading.Thread(target=loop) for _ in range(concurrency)]
    for t in threads:
        t.start()
    c0, t0 = cpu_seconds(), now()
    deadline[0] = t0 + int(seconds * 1e9)
    start.wait()
    for t in threads:
        t.join()
    t1, c1 = now(), cpu_seconds()
    if errors:
        raise errors[0]
    return summary(lat, (t1 - t0) / 1e9, c1 - c0)


# --------------------------------------------------------------------------
# openinfer.Client
# --------------------------------------------------------------------------


class OpenInfer:
    def __init__(self, url: str, shm: bool = False):
        import openinfer
        # The socket path, unless `shm` (kind openinfer-shm, s4_shm.py): the client then
        # uses system shared memory on its own, as it does against a local server.
        if "shared_memory" in inspect.signature(openinfer.Client).parameters:
            self.client = openinfer.Client(url, shared_memory=None if shm else False)
        else:
            self.client = openinfer.Client(url)
        self.shm = shm
        self.version = getattr(openinfer, "__version__", None) or dist_version("openinfer")

    def _simple(self):
        out = self.client.infer("simple", {"INPUT0": SIMPLE_A, "INPUT1": SIMPLE_B})
        return out["OUTPUT0"], out["OUTPUT1"]

    def op_verify(self) -> dict:
        o0, o1 = self._simple()
        if not (np.array_equal(o0, SIMPLE_A + SIMPLE_B) and np.array_equal(o1, SIMPLE_A - SIMPLE_B)):
            raise RuntimeError(f"wrong simple answer: {o0!r} {o1!r}")
        x = np.random.default_rng(1).random((3, 1000), dtype=np.float32)
        y = self.client.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        if y.dtype != np.float32 or not np.array_equal(x, y):
            raise RuntimeError("wrong identity_fp32 answer")
        return {"ok": True}

    def op_simple(self, seconds: float, mode: str = "seq", concurrency: int = 1) -> dict:
        if mode == "seq":
            return timed_seq(self._simple, seconds)
        if mode == "threads":  # N threads sharing one Client
            return timed_threads(self._simple, seconds, concurrency)
        if mode == "async":  # infer_async, a window of N requests in flight
            return self._async_window(seconds, concurrency)
        if mode == "stream":  # stream_infer (gRPC), N requests in flight on one stream
            return self._stream_window(seconds, concurrency)
        raise ValueError(f"unknown mode {mode!r}")

    def _stream_window(self, seconds: float, concurrency: int) -> dict:
        # Latency: from the request leaving the generator (stream_infer sends it) to its
        # result coming out of the iterator; results come in request order.
        now = time.perf_counter_ns
        inputs = {"INPUT0": SIMPLE_A, "INPUT1": SIMPLE_B}
        sent: deque = deque()
        lat: list[int] = []
        deadline = [0]

        def requests():
            while now() < deadline[0]:
                sent.append(now())
                yield inputs

        c0, t0 = cpu_seconds(), now()
        deadline[0] = t0 + int(seconds * 1e9)
        for out in self.client.stream_infer("simple", requests(), max_in_flight=concurrency):
            out["OUTPUT0"], out["OUTPUT1"]
            lat.append(now() - sent.popleft())
        t1, c1 = now(), cpu_seconds()
        return summary(lat, (t1 - t0) / 1e9, c1 - c0)

    def _async_window(self, seconds: float, concurrency: int) -> dict:
        client = self.client
        inputs = {"INPUT0": SIMPLE_A, "INPUT1": SIMPLE_B}
        now = time.perf_counter_ns
        lat: list[int] = []
        errors: list[BaseException] = []
        lock = threading.Lock()
        inflight = [concurrency]
        done = threading.Event()
        deadline = [0]

        def submit():
            t = now()
            f = client.infer_async("simple", inputs)
            f.add_done_callback(lambda f, t=t: on_done(t, f))

        def on_done(t, f):
            b = now()
            exc = f.exception()
            if exc is None:
                out = f.result()
                out["OUTPUT0"], out["OUTPUT1"]
                lat.append(b - t)
                if b < deadline[0]:
                    submit()
                    return
            else:
                errors.append(exc)
            with lock:
                inflight[0] -= 1
                if inflight[0] == 0:
                    done.set()

        c0, t0 = cpu_seconds(), now()
        deadline[0] = t0 + int(seconds * 1e9)
        for _ in range(concurrency):
            submit()
        if not done.wait(seconds + 60):
            raise RuntimeError("infer_async window did not drain in 60 s")
        t1, c1 = now(), cpu_seconds()
        if errors:
            raise errors[0]
        return summary(lat, (t1 - t0) / 1e9, c1 - c0)

    def op_tensor(self, seconds: float, nbytes: int, min_iters: int = 3) -> dict:
        x = np.random.default_rng(2).random(nbytes // 4, dtype=np.float32)
        y = self.client.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        if not np.array_equal(x, y):
            raise RuntimeError(f"identity_fp32 of {nbytes} bytes came back different")
        del y

        if self.shm and not self.client._shm_pool:
            raise RuntimeError("the client did not take shared memory")

        def one():
            return self.client.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"]
        return timed_seq(one, seconds, min_iters, 2 * x.nbytes)

    def op_tensor_inplace(self, seconds: float, nbytes: int, min_iters: int = 3) -> dict:
        """identity_fp32 on an array that already lives in a registered region, its output
        asked back into the same place (client.shared_memory(), out=)."""
        region = self.client.shared_memory(nbytes)
        try:
            x = region.array((nbytes // 4,), np.float32)
            x[:] = np.random.default_rng(2).random(nbytes // 4, dtype=np.float32)
            want = x.copy()
            y = self.client.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": x})["OUTPUT0"]
            if not np.array_equal(want, y):
                raise RuntimeError(f"identity_fp32 of {nbytes} bytes in place came back different")
            del y

            def one():
                return self.client.infer("identity_fp32", {"INPUT0": x}, out={"OUTPUT0": x})["OUTPUT0"]
            return timed_seq(one, seconds, min_iters, 2 * x.nbytes)
        finally:
            self.client.unregister(region)
            region.close()


# --------------------------------------------------------------------------
# tritonclient.http
# --------------------------------------------------------------------------


class Triton:
    def __init__(self, url: str):
        import tritonclient.http as http
        self.http = http
        self.url = url.split("://", 1)[-1]
        self.version = dist_version("tritonclient")
        self.clients: dict[int, object] = {}
        self.simple_outputs = [http.InferRequestedOutput("OUTPUT0", binary_data=True),
                               http.InferRequestedOutput("OUTPUT1", binary_data=True)]
        self.tensor_outputs = [http.InferRequestedOutput("OUTPUT0", binary_data=True)]

    def client(self, concurrency: int = 1):
        if concurrency not in self.clients:
            self.clients[concurrency] = self.http.InferenceServerClient(
                self.url, concurrency=concurrency, network_timeout=120.0)
        return self.clients[concurrency]

    def _simple_inputs(self):
        i0 = self.http.InferInput("INPUT0", [1, 16], "INT32")
        i0.set_data_from_numpy(SIMPLE_A, binary_data=True)
        i1 = self.http.InferInput("INPUT1", [1, 16], "INT32")
        i1.set_data_from_numpy(SIMPLE_B, binary_data=True)
        return [i0, i1]

    def _simple(self, client=None):
        r = (client or self.client()).infer("simple", self._simple_inputs(),
                                            outputs=self.simple_outputs)
        return r.as_numpy("OUTPUT0"), r.as_numpy("OUTPUT1")

    def op_verify(self) -> dict:
        o0, o1 = self._simple()
        if not (np.array_equal(o0, SIMPLE_A + SIMPLE_B) and np.array_equal(o1, SIMPLE_A - SIMPLE_B)):
            raise RuntimeError(f"wrong simple answer: {o0!r} {o1!r}")
        return {"ok": True}

    def op_simple(self, seconds: float, mode: str = "seq", concurrency: int = 1) -> dict:
        if mode == "seq":
            c = self.client()
            return timed_seq(lambda: self._simple(c), seconds)
        if mode == "async":  # async_infer on a concurrency=N client, window of N
            return self._async_window(seconds, concurrency)
        if mode == "greenlets":  # N greenlets calling infer() on a concurrency=N client
            return self._greenlets(seconds, concurrency)
        raise ValueError(f"unknown mode {mode!r}")

    def _async_window(self, seconds: float, concurrency: int) -> dict:
        # Latency = from async_infer() to get_result() returning, oldest first
        # (an upper bound when a later request finished earlier).
        c = self.client(concurrency)
        now = time.perf_counter_ns
        lat: list[int] = []
        q: deque = deque()
        c0, t0 = cpu_seconds(), now()
        deadline = t0 + int(seconds * 1e9)

        def submit():
            t = now()
            q.append((t, c.async_infer("simple", self._simple_inputs(),
                                       outputs=self.simple_outputs)))
        for _ in range(concurrency):
            submit()
        while q:
            t, req = q.popleft()
            r = req.get_result()
            r.as_numpy("OUTPUT0"), r.as_numpy("OUTPUT1")
            b = now()
            lat.append(b - t)
            if b < deadline:
                submit()
        t1, c1 = now(), cpu_seconds()
        return summary(lat, (t1 - t0) / 1e9, c1 - c0)

    def _greenlets(self, seconds: float, concurrency: int) -> dict:
        import gevent
        c = self.client(concurrency)
        now = time.perf_counter_ns
        lat: list[int] = []
        c0, t0 = cpu_seconds(), now()
        deadline = t0 + int(seconds * 1e9)

        def loop():
            while True:
                a = now()
                self._simple(c)
                b = now()
                lat.append(b - a)
                if b >= deadline:
                    break
        gs = [gevent.spawn(loop) for _ in range(concurrency)]
        gevent.joinall(gs, raise_error=True)
        t1, c1 = now(), cpu_seconds()
        return summary(lat, (t1 - t0) / 1e9, c1 - c0)

    def op_tensor(self, seconds: float, nbytes: int, min_iters: int = 3) -> dict:
        x = np.random.default_rng(2).random(nbytes // 4, dtype=np.float32)
        c = self.client()

        def one():
            i = self.http.InferInput("INPUT0", list(x.shape), "FP32")
            i.set_data_from_numpy(x, binary_data=True)
            r = c.infer("identity_fp32", [i], outputs=self.tensor_outputs)
            return r.as_numpy("OUTPUT0")
        if not np.array_equal(one(), x):
            raise RuntimeError(f"identity_fp32 of {nbytes} bytes came back different")
        return timed_seq(one, seconds, min_iters, 2 * x.nbytes)


# --------------------------------------------------------------------------
# tritonclient.grpc
# --------------------------------------------------------------------------


class TritonGrpc:
    def __init__(self, url: str):
        import tritonclient.grpc as grpc
        self.grpc = grpc
        self.url = url.split("://", 1)[-1]
        self.version = dist_version("tritonclient")
        # gRPC's 4 MiB default message limit lifted, as for any large-tensor user.
        self.client = grpc.InferenceServerClient(
            self.url, channel_args=[("grpc.max_send_message_length", -1),
                                    ("grpc.max_receive_message_length", -1)])
        self.simple_outputs = [grpc.InferRequestedOutput("OUTPUT0"),
                               grpc.InferRequestedOutput("OUTPUT1")]
        self.tensor_outputs = [grpc.InferRequestedOutput("OUTPUT0")]

    def _simple_inputs(self):
        i0 = self.grpc.InferInput("INPUT0", [1, 16], "INT32")
        i0.set_data_from_numpy(SIMPLE_A)
        i1 = self.grpc.InferInput("INPUT1", [1, 16], "INT32")
        i1.set_data_from_numpy(SIMPLE_B)
        return [i0, i1]

    def _simple(self):
        r = self.client.infer("simple", self._simple_inputs(), outputs=self.simple_outputs)
        return r.as_numpy("OUTPUT0"), r.as_numpy("OUTPUT1")

    def op_verify(self) -> dict:
        o0, o1 = self._simple()
        if not (np.array_equal(o0, SIMPLE_A + SIMPLE_B) and np.array_equal(o1, SIMPLE_A - SIMPLE_B)):
            raise RuntimeError(f"wrong simple answer: {o0!r} {o1!r}")
        return {"ok": True}

    def op_simple(self, seconds: float, mode: str = "seq", concurrency: int = 1) -> dict:
        if mode == "seq":
            return timed_seq(self._simple, seconds)
        if mode == "threads":  # N threads sharing one client (gRPC channels are thread-safe)
            return timed_threads(self._simple, seconds, concurrency)
        if mode == "async":  # async_infer with a callback, a window of N in flight
            return self._window(seconds, concurrency, stream=False)
        if mode == "stream":  # start_stream + async_stream_infer, a window of N in flight
            return self._window(seconds, concurrency, stream=True)
        raise ValueError(f"unknown mode {mode!r}")

    def _window(self, seconds: float, concurrency: int, stream: bool) -> dict:
        now = time.perf_counter_ns
        lat: list[int] = []
        errors: list[BaseException] = []
        lock = threading.Lock()
        inflight = [concurrency]
        done = threading.Event()
        deadline = [0]
        sent: deque = deque()  # stream: send times, answered in order on one stream

        def submit():
            if stream:
                sent.append(now())
                self.client.async_stream_infer("simple", self._simple_inputs(),
                                               outputs=self.simple_outputs)
            else:
                t = now()
                self.client.async_infer("simple", self._simple_inputs(),
                                        lambda result, error, t=t: on_done(t, result, error),
                                        outputs=self.simple_outputs)

        def on_done(t, result, error):
            b = now()
            if stream:
                t = sent.popleft()
            if error is None:
                result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
                lat.append(b - t)
                if b < deadline[0]:
                    submit()
                    return
            else:
                errors.append(RuntimeError(str(error)))
            with lock:
                inflight[0] -= 1
                if inflight[0] == 0:
                    done.set()

        if stream:
            self.client.start_stream(lambda result, error: on_done(0, result, error))
        c0, t0 = cpu_seconds(), now()
        deadline[0] = t0 + int(seconds * 1e9)
        try:
            for _ in range(concurrency):
                submit()
            if not done.wait(seconds + 60):
                raise RuntimeError("tritonclient.grpc window did not drain in 60 s")
            t1, c1 = now(), cpu_seconds()
        finally:
            if stream:
                self.client.stop_stream()
        if errors:
            raise errors[0]
        return summary(lat, (t1 - t0) / 1e9, c1 - c0)

    def op_tensor(self, seconds: float, nbytes: int, min_iters: int = 3) -> dict:
        x = np.random.default_rng(2).random(nbytes // 4, dtype=np.float32)

        def one():
            i = self.grpc.InferInput("INPUT0", list(x.shape), "FP32")
            i.set_data_from_numpy(x)
            r = self.client.infer("identity_fp32", [i], outputs=self.tensor_outputs)
            return r.as_numpy("OUTPUT0")
        if not np.array_equal(one(), x):
            raise RuntimeError(f"identity_fp32 of {nbytes} bytes came back different")
        return timed_seq(one, seconds, min_iters, 2 * x.nbytes)


# --------------------------------------------------------------------------
# Physical limits: TCP loopback echo, memcpy
# --------------------------------------------------------------------------


def _recv_exact(sock: socket.socket, view: memoryview) -> bool:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
        if k == 0:
            return False
        got += k
    return True


def echo_server(port: int) -> None:
    """Per connection: an 8-byte size N, then repeatedly receive N bytes and
    send the same N bytes back. One connection at a time."""
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(8)
    print(f"echo server on 127.0.0.1:{port}", file=sys.stderr, flush=True)
    while True:
        conn, _ = ls.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hdr = bytearray(8)
            if not _recv_exact(conn, memoryview(hdr)):
                continue
            (n,) = struct.unpack("<Q", hdr)
            buf = memoryview(bytearray(n))
            while _recv_exact(conn, buf):
                conn.sendall(buf)


class Raw:
    version = "-"

    def op_verify(self) -> dict:
        return {"ok": True}

    def op_echo(self, seconds: float, nbytes: int, port: int, min_iters: int = 3) -> dict:
        data = np.random.default_rng(3).integers(0, 255, nbytes, dtype=np.uint8)
        back = np.empty_like(data)
        sview, rview = memoryview(data), memoryview(back)
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(struct.pack("<Q", nbytes))

            def one():
                s.sendall(sview)
                if not _recv_exact(s, rview):
                    raise RuntimeError("echo server closed the connection")
            one()
            if not np.array_equal(data, back):
                raise RuntimeError("echo came back different")
            return timed_seq(one, seconds, min_iters, 2 * nbytes)

    def op_memcpy(self, seconds: float, nbytes: int, min_iters: int = 3) -> dict:
        src = np.random.default_rng(4).integers(0, 255, nbytes, dtype=np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        return timed_seq(lambda: np.copyto(dst, src), seconds, min_iters, nbytes)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    kind = argv[0]
    if kind == "echo-server":
        echo_server(int(argv[1]))
        return 0
    try:
        impl = {"openinfer": lambda: OpenInfer(argv[1]),
                "openinfer-shm": lambda: OpenInfer(argv[1], shm=True),
                "tritonclient": lambda: Triton(argv[1]),
                "tritonclient-grpc": lambda: TritonGrpc(argv[1]),
                "raw": Raw}[kind]()
    except KeyError:
        print(f"unknown kind {kind!r}", file=sys.stderr)
        return 2
    out = sys.stdout
    out.write(json.dumps({"ready": True, "kind": kind, "version": impl.version}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            res = getattr(impl, "op_" + op)(**cmd)
        except Exception as e:  # noqa: BLE001 - answered to the driver
            res = {"error": f"{op}: {type(e).__name__}: {e}"}
        out.write(json.dumps(res) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
