"""TLS on the HTTP/1.1 and gRPC listeners (issue 35): real outside clients (requests, curl,
tritonclient HTTP and gRPC, grpcio) against serve(ssl=...), with certificates made here by the
openssl command line: a CA, server and client certificates, an expired one, one for another
host, and a second CA whose certificates must be refused."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import requests

import openinfer
from openinfer import Model, Tensor

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def _outside_env() -> dict[str, str]:
    """The environment for an outside program (openssl, curl): without a sanitizer run's
    preload, which is for this Python's extension, not for them."""
    drop = {"LD_PRELOAD", "ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS", "PYTHONMALLOC"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, env=_outside_env())
    assert r.returncode == 0, f"openssl {' '.join(args)}: {r.stderr}"


def _key_and_csr(d: Path, name: str, cn: str) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)


def _sign(d: Path, name: str, ca: str, ext: str, days: str = "30") -> None:
    (d / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", days, "-extfile", f"{name}.ext", cwd=d)


SERVER_EXT = "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
CLIENT_EXT = "extendedKeyUsage=clientAuth\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other_ca"):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                 f"{ca}.key", "-out", f"{ca}.pem", "-days", "30", "-subj", f"/CN=openinfer test {ca}", cwd=d)
    for name, cn, ca, ext, days in (
        ("server", "localhost", "ca", SERVER_EXT, "30"),
        ("server2", "localhost", "ca", SERVER_EXT, "30"),  # the renewed certificate of the reload test
        ("expired", "localhost", "ca", SERVER_EXT, "-1"),
        ("otherhost", "other.example", "ca", "subjectAltName=DNS:other.example\n", "30"),
        ("client", "client", "ca", CLIENT_EXT, "30"),
        ("stranger", "stranger", "other_ca", CLIENT_EXT, "30"),
    ):
        _key_and_csr(d, name, cn)
        _sign(d, name, ca, ext, days)
    return d


def _echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}


def _models() -> list[Model]:
    return [Model("echo", _echo, inputs=[Tensor("INPUT0", "FP32", [-1])], outputs=[Tensor("OUTPUT0", "FP32", [-1])])]


def _serve(ssl_options: Any, metrics: bool = False, **kw: Any) -> openinfer.Server:
    if not metrics:
        kw["metrics_port"] = None
    return openinfer.serve(models=_models(), http_port=0, grpc_port=0, threads=2, log=False, ssl=ssl_options,
                           max_body_bytes=64 << 20, **kw)


@pytest.fixture(scope="module")
def live_cert(pki: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's certificate and key at paths of their own, which the reload tests rewrite."""
    d = tmp_path_factory.mktemp("live")
    shutil.copy(pki / "server.pem", d / "cert.pem")
    shutil.copy(pki / "server.key", d / "key.pem")
    return d


@pytest.fixture(scope="module")
def tls_server(live_cert: Path) -> Iterator[openinfer.Server]:
    srv = _serve({"server_cert": live_cert / "cert.pem", "server_key": live_cert / "key.pem"},
                 first_byte_timeout_ms=1000, metrics=True)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def mutual_server(pki: Path) -> Iterator[openinfer.Server]:
    srv = _serve({"server_cert": pki / "server.pem", "server_key": pki / "server.key", "root_cert": pki / "ca.pem",
                  "mutual": True})
    try:
        yield srv
    finally:
        srv.stop()


def _infer_body(data: np.ndarray) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [data.size], "data": data.tolist()}]}


def _assert_https_alive(srv: openinfer.Server, ca: Path, **kw: Any) -> None:
    r = requests.get(f"https://127.0.0.1:{srv.http_port}/v2/health/live", verify=str(ca), timeout=30, **kw)
    assert (r.status_code, r.json()) == (200, {"live": True})


def _grpc_live(port: int, credentials: Any) -> bytes:
    import grpc

    with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
        return channel.unary_unary("/inference.GRPCInferenceService/ServerLive")(b"", timeout=30)


# ---- clients that work -----------------------------------------------------------------------


def test_https_with_requests_serves_json_inference(tls_server: openinfer.Server, pki: Path) -> None:
    assert tls_server.url.startswith("https://")
    data = np.arange(1000, dtype=np.float32)
    r = requests.post(f"https://127.0.0.1:{tls_server.http_port}/v2/models/echo/infer",
                      json=_infer_body(data), verify=str(pki / "ca.pem"), timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == data.tolist()


def test_tritonclient_http_ssl_with_16mib_tensor(tls_server: openinfer.Server, pki: Path) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(
        f"localhost:{tls_server.http_port}", ssl=True, network_timeout=60,
        ssl_context_factory=lambda: ssl.create_default_context(cafile=str(pki / "ca.pem")))
    try:
        data = np.random.default_rng(1).random(4 << 20, dtype=np.float32)  # 16 MiB each way
        inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data, binary_data=True)
        for _ in range(3):  # keep-alive: the same TLS connection carries each
            result = client.infer("echo", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
        assert client.is_server_live()
    finally:
        client.close()


def test_tritonclient_grpc_ssl_with_16mib_tensor(tls_server: openinfer.Server, pki: Path) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"localhost:{tls_server.grpc_port}", ssl=True,
                                              root_certificates=str(pki / "ca.pem"))
    try:
        assert client.is_server_live()
        data = np.random.default_rng(2).random(4 << 20, dtype=np.float32)
        inp = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        for _ in range(2):
            result = client.infer("echo", [inp])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    finally:
        client.close()


def test_grpcio_secure_channel_negotiates_h2(tls_server: openinfer.Server, pki: Path) -> None:
    import grpc

    creds = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.pem").read_bytes())
    assert _grpc_live(tls_server.grpc_port, creds) == b"\x08\x01"
    # The ALPN answer itself: gRPC's port picks h2.
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", tls_server.grpc_port), timeout=30) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            assert s.selected_alpn_protocol() == "h2"
            assert s.version() in ("TLSv1.2", "TLSv1.3")


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_with_cacert(tls_server: openinfer.Server, pki: Path) -> None:
    r = subprocess.run(["curl", "-sS", "--max-time", "30", "--cacert", str(pki / "ca.pem"),
                        f"https://localhost:{tls_server.http_port}/v2/health/ready"], capture_output=True, text=True,
                       env=_outside_env())
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"ready": True}


def test_metrics_port_speaks_tls_with_http(tls_server: openinfer.Server, pki: Path) -> None:
    assert tls_server.metrics_url.startswith("https://")
    r = requests.get(f"https://127.0.0.1:{tls_server.metrics_port}/metrics", verify=str(pki / "ca.pem"), timeout=30)
    assert r.status_code == 200 and "nv_" in r.text


def test_tls_below_1_2_is_refused(tls_server: openinfer.Server) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        ctx.set_ciphers("ALL:@SECLEVEL=0")
    except (ValueError, ssl.SSLError):
        pytest.skip("this Python's OpenSSL cannot offer TLS 1.1")
    with socket.create_connection(("127.0.0.1", tls_server.http_port), timeout=30) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            ctx.wrap_socket(raw).close()


# ---- what must fail, cleanly -----------------------------------------------------------------


def test_plain_http_on_tls_port_is_closed_and_server_serves_on(tls_server: openinfer.Server, pki: Path) -> None:
    for port in (tls_server.http_port, tls_server.grpc_port):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                got = s.recv(4096)
            except ConnectionResetError:
                got = b""
            assert b"HTTP/1.1 200" not in got and b"live" not in got
            if port == tls_server.http_port:  # told what went wrong, in its own protocol (as nginx)
                assert got.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"use https://" in got, got
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{tls_server.grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as e:
            channel.unary_unary("/inference.GRPCInferenceService/ServerLive")(b"", timeout=10)
        assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    _assert_https_alive(tls_server, pki / "ca.pem")
    assert _grpc_live(tls_server.grpc_port, grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())) == b"\x08\x01"


def test_tls_client_on_plain_port_fails_cleanly(pki: Path) -> None:
    with openinfer.serve(models=_models(), http_port=0, grpc_port=None, metrics_port=None, threads=1,
                         log=False) as plain:
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(f"https://127.0.0.1:{plain.http_port}/v2/health/live", verify=str(pki / "ca.pem"), timeout=30)
        assert requests.get(f"{plain.url}/v2/health/live", timeout=30).json() == {"live": True}


def test_client_with_another_ca_refuses_the_server(tls_server: openinfer.Server, pki: Path) -> None:
    with pytest.raises(requests.exceptions.SSLError, match="certificate verify failed"):
        requests.get(f"https://127.0.0.1:{tls_server.http_port}/v2/health/live", verify=str(pki / "other_ca.pem"),
                     timeout=30)
    _assert_https_alive(tls_server, pki / "ca.pem")


def test_stalled_handshake_is_closed_at_first_byte_timeout(tls_server: openinfer.Server) -> None:
    # A real ClientHello, cut in half: the server waits for the rest until the first-byte
    # deadline (1 s here), then closes. The socket's own timeout only bounds the test.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    hello = outgoing.read()
    for port in (tls_server.http_port, tls_server.grpc_port):  # gRPC: its preface deadline, the same
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(hello[: len(hello) // 2])
            try:
                assert s.recv(4096) == b""  # closed by the server, not the 60 s of this socket
            except ConnectionResetError:
                pass


@pytest.mark.parametrize("cert", ["expired", "otherhost"])
def test_clients_refuse_expired_and_wrong_host_certificates(
        tls_server: openinfer.Server, pki: Path, live_cert: Path, cert: str) -> None:
    shutil.copy(pki / f"{cert}.pem", live_cert / "cert.pem")
    shutil.copy(pki / f"{cert}.key", live_cert / "key.pem")
    try:
        tls_server.reload_tls()
        expect = "certificate has expired" if cert == "expired" else "match"
        with pytest.raises(requests.exceptions.SSLError, match=expect):
            requests.get(f"https://127.0.0.1:{tls_server.http_port}/v2/health/live", verify=str(pki / "ca.pem"),
                         timeout=30)
        import grpc

        with pytest.raises(grpc.RpcError) as e:
            _grpc_live(tls_server.grpc_port, grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes()))
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        mine = "certificate has expired" if cert == "expired" else "hostname mismatch"
        for url in (f"https://localhost:{tls_server.http_port}", f"grpcs://localhost:{tls_server.grpc_port}"):
            with openinfer.Client(url, ca_file=pki / "ca.pem") as client:
                with pytest.raises(ConnectionError, match=mine):
                    client.is_server_live()
    finally:
        shutil.copy(pki / "server.pem", live_cert / "cert.pem")
        shutil.copy(pki / "server.key", live_cert / "key.pem")
        tls_server.reload_tls()
    _assert_https_alive(tls_server, pki / "ca.pem")


def _read_answer(sock: socket.socket) -> bytes:
    """One HTTP answer with a Content-Length body, read to its end."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < length:
        chunk = sock.recv(4096)
        assert chunk, f"closed after {body!r}"
        body += chunk
    return body


def test_reload_new_connections_get_new_cert_old_ones_finish(
        tls_server: openinfer.Server, pki: Path, live_cert: Path) -> None:
    def served_cert(sock: ssl.SSLSocket) -> bytes:
        return sock.getpeercert(binary_form=True) or b""

    def der(name: str) -> bytes:
        return ssl.PEM_cert_to_DER_cert((pki / f"{name}.pem").read_text())

    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    request = b"GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\n\r\n"
    old = ctx.wrap_socket(socket.create_connection(("127.0.0.1", tls_server.http_port), timeout=30),
                          server_hostname="localhost")
    try:
        old.sendall(request)
        assert _read_answer(old) == b'{"live":true}'
        assert served_cert(old) == der("server")
        shutil.copy(pki / "server2.pem", live_cert / "cert.pem")
        shutil.copy(pki / "server2.key", live_cert / "key.pem")
        tls_server.reload_tls()
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", tls_server.http_port), timeout=30),
                             server_hostname="localhost") as new:
            assert served_cert(new) == der("server2")
        old.sendall(request)  # the connection made before the reload goes on
        assert _read_answer(old) == b'{"live":true}'
    finally:
        old.close()
        shutil.copy(pki / "server.pem", live_cert / "cert.pem")
        shutil.copy(pki / "server.key", live_cert / "key.pem")
        tls_server.reload_tls()


def test_reload_with_a_broken_file_keeps_the_old_cert(tls_server: openinfer.Server, pki: Path,
                                                      live_cert: Path) -> None:
    (live_cert / "cert.pem").write_text("not a certificate\n")
    try:
        with pytest.raises(ValueError, match="cert.pem"):
            tls_server.reload_tls()
        _assert_https_alive(tls_server, pki / "ca.pem")
    finally:
        shutil.copy(pki / "server.pem", live_cert / "cert.pem")


@pytest.mark.parametrize("options, message", [
    ({"server_cert": "/nonexistent/cert.pem", "server_key": "/nonexistent/key.pem"},
     "cannot read the server certificate '/nonexistent/cert.pem': No such file"),
    ({"server_cert": "CERT"}, "server_key required"),
    ({"server_cert": "CERT", "server_key": "KEY", "mutual": True}, "mutual TLS needs root_cert"),
    ({"server_cert": "CERT", "server_key": "KEY", "ciphers": "x"}, "unknown option"),
    ({"server_cert": "CERT", "server_key": "OTHERKEY"}, "server key .*client.key.*mismatch"),
])
def test_bad_ssl_options_are_clear_errors(pki: Path, options: dict[str, Any], message: str) -> None:
    paths = {"CERT": pki / "server.pem", "KEY": pki / "server.key", "OTHERKEY": pki / "client.key"}
    options = {k: paths.get(v, v) if isinstance(v, str) else v for k, v in options.items()}
    with pytest.raises(ValueError, match=message):
        _serve(options)


# ---- mutual TLS ----------------------------------------------------------------------------


def test_mutual_tls_accepts_a_client_certificate(mutual_server: openinfer.Server, pki: Path) -> None:
    _assert_https_alive(mutual_server, pki / "ca.pem", cert=(str(pki / "client.pem"), str(pki / "client.key")))
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(
        f"localhost:{mutual_server.grpc_port}", ssl=True, root_certificates=str(pki / "ca.pem"),
        private_key=str(pki / "client.key"), certificate_chain=str(pki / "client.pem"))
    try:
        data = np.arange(16, dtype=np.float32)
        inp = grpcclient.InferInput("INPUT0", [16], "FP32")
        inp.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer("echo", [inp]).as_numpy("OUTPUT0"), data)
    finally:
        client.close()
    if shutil.which("curl"):
        r = subprocess.run(["curl", "-sS", "--max-time", "30", "--cacert", str(pki / "ca.pem"),
                            "--cert", str(pki / "client.pem"), "--key", str(pki / "client.key"),
                            f"https://localhost:{mutual_server.http_port}/v2/health/live"],
                           capture_output=True, text=True, env=_outside_env())
        assert r.returncode == 0 and json.loads(r.stdout) == {"live": True}, r.stderr


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate"])
def test_mutual_tls_refuses_other_clients(mutual_server: openinfer.Server, pki: Path, who: str) -> None:
    import grpc

    cert = None if who == "no certificate" else (str(pki / "stranger.pem"), str(pki / "stranger.key"))
    with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
        r = requests.get(f"https://127.0.0.1:{mutual_server.http_port}/v2/health/live", verify=str(pki / "ca.pem"),
                         cert=cert, timeout=30)
        r.raise_for_status()
    creds = grpc.ssl_channel_credentials(
        (pki / "ca.pem").read_bytes(),
        private_key=None if cert is None else (pki / "stranger.key").read_bytes(),
        certificate_chain=None if cert is None else (pki / "stranger.pem").read_bytes())
    with pytest.raises(grpc.RpcError) as e:
        _grpc_live(mutual_server.grpc_port, creds)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    _assert_https_alive(mutual_server, pki / "ca.pem", cert=(str(pki / "client.pem"), str(pki / "client.key")))


# ---- openinfer's own client ------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["https", "grpcs"])
def test_openinfer_client_over_tls_with_16mib_tensor(tls_server: openinfer.Server, pki: Path, scheme: str) -> None:
    port = tls_server.http_port if scheme == "https" else tls_server.grpc_port
    with openinfer.Client(f"{scheme}://localhost:{port}", ca_file=pki / "ca.pem") as client:
        assert client.is_server_live()
        small = np.arange(7, dtype=np.float32)
        np.testing.assert_array_equal(client.infer("echo", {"INPUT0": small})["OUTPUT0"], small)
        big = np.random.default_rng(3).random(4 << 20, dtype=np.float32)
        for _ in range(2):  # the pooled connection goes on
            np.testing.assert_array_equal(client.infer("echo", {"INPUT0": big})["OUTPUT0"], big)


@pytest.mark.parametrize("scheme", ["https", "grpcs"])
def test_openinfer_client_refuses_a_server_its_ca_did_not_sign(tls_server: openinfer.Server, pki: Path,
                                                              scheme: str) -> None:
    port = tls_server.http_port if scheme == "https" else tls_server.grpc_port
    with openinfer.Client(f"{scheme}://localhost:{port}", ca_file=pki / "other_ca.pem") as client:
        with pytest.raises(Exception, match="certificate verify failed"):
            client.is_server_live()
    with openinfer.Client(f"{scheme}://localhost:{port}", ca_file=pki / "other_ca.pem", verify=False) as client:
        assert client.is_server_live()  # told not to check


@pytest.mark.parametrize("scheme", ["https", "grpcs"])
def test_openinfer_client_mutual_tls(mutual_server: openinfer.Server, pki: Path, scheme: str) -> None:
    port = mutual_server.http_port if scheme == "https" else mutual_server.grpc_port
    url = f"{scheme}://127.0.0.1:{port}"
    with openinfer.Client(url, ca_file=pki / "ca.pem", cert_file=pki / "client.pem",
                          key_file=pki / "client.key") as client:
        data = np.arange(5, dtype=np.float32)
        np.testing.assert_array_equal(client.infer("echo", {"INPUT0": data})["OUTPUT0"], data)
    with openinfer.Client(url, ca_file=pki / "ca.pem", timeout=30) as client:
        with pytest.raises(ConnectionError, match="certificate required"):  # TLS 1.3's alert
            client.is_server_live()


def test_openinfer_client_tls_options_need_a_tls_url(pki: Path) -> None:
    with pytest.raises(ValueError, match="https:// and grpcs://"):
        openinfer.Client("http://127.0.0.1:1", ca_file=pki / "ca.pem")


# ---- openinfer serve: tritonserver's flags, SIGHUP ----------------------------------------------


def test_cli_flags_and_sighup_reload(pki: Path, tmp_path: Path) -> None:
    import re
    import signal
    import time

    import grpc

    from conftest import Cli

    shutil.copy(pki / "server.pem", tmp_path / "cert.pem")
    shutil.copy(pki / "server.key", tmp_path / "key.pem")
    (tmp_path / "repo").mkdir()
    cli = Cli(str(tmp_path / "repo"), "--grpc-port", "0", "--metrics-port", "0",
              "--http-use-ssl", "--http-server-cert", str(tmp_path / "cert.pem"),
              "--http-server-key", str(tmp_path / "key.pem"),
              "--grpc-use-ssl-mutual=true", "--grpc-server-cert", str(pki / "server.pem"),
              "--grpc-server-key", str(pki / "server.key"), "--grpc-root-cert", str(pki / "ca.pem"))
    try:
        http_port = int(re.search(r"https://127\.0\.0\.1:(\d+)", cli.output()).group(1))  # type: ignore[union-attr]
        grpc_port = int(re.search(r"grpcs://127\.0\.0\.1:(\d+)", cli.output()).group(1))  # type: ignore[union-attr]
        creds = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes(), (pki / "client.key").read_bytes(),
                                             (pki / "client.pem").read_bytes())
        assert _grpc_live(grpc_port, creds) == b"\x08\x01"
        with pytest.raises(grpc.RpcError):  # mutual: no client certificate, no service
            _grpc_live(grpc_port, grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes()))

        ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        request = b"GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\n\r\n"
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", http_port), timeout=30),
                             server_hostname="localhost") as old:
            old.sendall(request)
            assert _read_answer(old) == b'{"live":true}'
            shutil.copy(pki / "server2.pem", tmp_path / "cert.pem")
            shutil.copy(pki / "server2.key", tmp_path / "key.pem")
            cli.proc.send_signal(signal.SIGHUP)
            for _ in range(300):  # the log line says it is done; 30 s at most
                if "TLS certificates and keys reloaded" in cli.output():
                    break
                time.sleep(0.1)
            assert "TLS certificates and keys reloaded" in cli.output(), cli.output()
            with ctx.wrap_socket(socket.create_connection(("127.0.0.1", http_port), timeout=30),
                                 server_hostname="localhost") as new:
                assert new.getpeercert(binary_form=True) == ssl.PEM_cert_to_DER_cert(
                    (pki / "server2.pem").read_text())
            old.sendall(request)  # opened before the reload: still served
            assert _read_answer(old) == b'{"live":true}'
        assert cli.proc.poll() is None
    finally:
        cli.kill()


def test_cli_use_ssl_without_a_certificate_is_an_error(tmp_path: Path) -> None:
    r = subprocess.run([__import__("sys").executable, "-m", "openinfer", "serve", str(tmp_path), "--http-port", "0",
                        "--grpc-use-ssl"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "server_cert and server_key required" in r.stderr, r.stderr


def test_client_leaving_during_a_16mib_answer_leaves_the_server_serving(tls_server: openinfer.Server,
                                                                         pki: Path) -> None:
    # The answer goes out a chunk at a time: the connection closes with chunks still queued,
    # one with libuv and the rest not yet encrypted (freed, not leaked; ASan's run checks).
    data = np.zeros(4 << 20, dtype=np.float32).tobytes()
    head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4 << 20],
                                   "parameters": {"binary_data_size": len(data)}}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    request = (f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(head) + len(data)}\r\n"
               f"Inference-Header-Content-Length: {len(head)}\r\n\r\n").encode() + head
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    for _ in range(3):
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", tls_server.http_port), timeout=30),
                             server_hostname="localhost") as s:
            s.sendall(request)
            s.sendall(data)
            assert s.recv(16).startswith(b"HTTP/1.1 200")  # the answer has begun; we leave
    _assert_https_alive(tls_server, pki / "ca.pem")


def test_cli_workers_serve_tls_and_reload_on_sighup(pki: Path, tmp_path: Path) -> None:
    import re
    import signal
    import time

    from conftest import Cli

    shutil.copy(pki / "server.pem", tmp_path / "cert.pem")
    shutil.copy(pki / "server.key", tmp_path / "key.pem")
    (tmp_path / "repo").mkdir()
    cli = Cli(str(tmp_path / "repo"), "--workers", "2", "--grpc-port", "0", "--metrics-port", "0",
              "--http-use-ssl", "--http-server-cert", str(tmp_path / "cert.pem"),
              "--http-server-key", str(tmp_path / "key.pem"))
    try:
        http_port = int(re.search(r"https://127\.0\.0\.1:(\d+)", cli.output()).group(1))  # type: ignore[union-attr]
        ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))

        def served() -> bytes:
            for _ in range(600):  # a worker still starting refuses; 60 s at most
                try:
                    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", http_port), timeout=30),
                                         server_hostname="localhost") as s:
                        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\n\r\n")
                        assert _read_answer(s) == b'{"live":true}'
                        return s.getpeercert(binary_form=True) or b""
                except (ConnectionError, ssl.SSLError):
                    time.sleep(0.1)
            raise AssertionError(cli.output())

        assert served() == ssl.PEM_cert_to_DER_cert((pki / "server.pem").read_text())
        for _ in range(600):  # both workers up before the signal: each must hear it
            if cli.output().count("listening on") >= 3:
                break
            time.sleep(0.1)
        shutil.copy(pki / "server2.pem", tmp_path / "cert.pem")
        shutil.copy(pki / "server2.key", tmp_path / "key.pem")
        cli.proc.send_signal(signal.SIGHUP)
        for _ in range(300):
            if cli.output().count("TLS certificates and keys reloaded") >= 2:
                break
            time.sleep(0.1)
        assert cli.output().count("TLS certificates and keys reloaded") == 2, cli.output()
        new = ssl.PEM_cert_to_DER_cert((pki / "server2.pem").read_text())
        assert all(served() == new for _ in range(6))  # whichever worker accepts
    finally:
        cli.kill()
