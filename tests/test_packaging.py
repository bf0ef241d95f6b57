"""Packaging, as a user meets it: the repaired manylinux wheel (scripts/build_wheels.py, what
`make wheel` runs) installs into a new virtual environment and serves over HTTP and gRPC on a
system where the -dev packages and the libuv, nghttp2 and protobuf-c shared libraries are
hidden (a mount namespace); the sdist installs into a new virtual environment with pip and
serves; building from the sdist where the headers are hidden fails naming each Debian package.

Slow: the wheel and sdist are built once per session, and the new environments install numpy
(and the sdist's build requirements) from PyPI as a user's would.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest

import openinfer

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.slow,
    # The sanitizer run tests the sanitized extension in place; these build and install their
    # own unsanitized copies, which the plain run already tested.
    pytest.mark.skipif(
        bool(os.environ.get("OI_PACKAGE_DIR")),
        reason="packaging is tested by the plain run; this run tests the sanitized extension",
    ),
]

# The packages whose files the wheel must not need at run time: the shared libraries and the
# -dev packages (headers, static libraries, linker symlinks, .pc files).
HIDDEN_PACKAGES = ("libuv1", "libuv1-dev", "libnghttp2-14", "libnghttp2-dev", "libprotobuf-c1", "libprotobuf-c-dev")
RUNTIME_SONAMES = ("libuv.so.1", "libnghttp2.so.14", "libprotobuf-c.so.1")
DEBIAN_DEV = {"libuv": "libuv1-dev", "libnghttp2": "libnghttp2-dev", "libprotobuf-c": "libprotobuf-c-dev", "zlib": "zlib1g-dev"}


def _env() -> dict[str, str]:
    """The environment of what runs from a new virtual environment: no path to this checkout's
    python/, no sanitizer runtime."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_PRELOAD", "OPENINFER_CACHE_DIR")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def _run(cmd: list[str | Path], timeout: float = 900, **kwargs) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([str(c) for c in cmd], env=_env(), capture_output=True, text=True, timeout=timeout, **kwargs)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{(r.stdout + r.stderr)[-6000:]}"
    return r


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and this interpreter's repaired wheel, built as `make wheel` builds them."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, ROOT / "scripts" / "build_wheels.py", "--python", sys.executable, "--no-smoke",
          "--out", out, "--work", tmp_path_factory.mktemp("wheel-work")])  # fmt: skip
    return out


def _wheel(dist: Path) -> Path:
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    (wheel,) = dist.glob(f"openinfer-{openinfer.__version__}-{tag}-{tag}-manylinux_2_*_x86_64.whl")
    return wheel


def _sdist(dist: Path) -> Path:
    return dist / f"openinfer-{openinfer.__version__}.tar.gz"


def test_wheel_is_self_contained_and_carries_no_tests(dist: Path) -> None:
    names = zipfile.ZipFile(_wheel(dist)).namelist()
    libs = sorted(n for n in names if n.startswith("openinfer.libs/") and n.endswith(tuple("0123456789")))
    assert [re.sub(r"-[0-9a-f]{8}\.so.*", "", n) for n in libs] == [
        "openinfer.libs/libcrypto", "openinfer.libs/libnghttp2", "openinfer.libs/libprotobuf-c",
        "openinfer.libs/libssl", "openinfer.libs/libuv",
    ]  # fmt: skip
    assert not any(re.search(r"(^|/)(tests?|benchmarks)/|conftest|(^|/)test_", n) for n in names), names
    assert "openinfer/examples/models/simple/config.pbtxt" in names
    assert "openinfer/_examples/tiny_llama_corpus.txt" in names  # the tiny Llama's tokenizer is trained on it
    metadata = zipfile.ZipFile(_wheel(dist)).read(f"openinfer-{openinfer.__version__}.dist-info/METADATA").decode()
    assert f"\nVersion: {openinfer.__version__}\n" in metadata and "\nLicense-Expression: Apache-2.0\n" in metadata
    assert 'Requires-Dist: torch>=2.0; extra == "torch"' in metadata
    assert 'Requires-Dist: pytest>=7; extra == "test"' in metadata
    licenses = f"openinfer-{openinfer.__version__}.dist-info/licenses/"
    assert {licenses + "LICENSE", *(f"{licenses}licenses/{lib}.txt" for lib in ("libuv", "nghttp2", "protobuf-c", "llhttp", "openssl"))} <= set(names)
    try:
        from openinfer import _torch_build

        key = _torch_build.build_key()
    except ImportError:  # no torch here: the wheel compiles the shim on first use
        assert not [n for n in names if "libopeninfer_torch" in n]
    else:  # torch at build time: the shim built against it, and libtorch not bundled
        assert f"openinfer/{_torch_build.library_name(key)}" in names
        assert not [n for n in names if re.search(r"libs/lib(torch|c10)", n)]


def test_sdist_has_sources_headers_protos_and_examples(dist: Path) -> None:
    with tarfile.open(_sdist(dist)) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    tracked = subprocess.run(["git", "ls-files", "csrc", "proto", "examples"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()  # fmt: skip
    assert tracked and not set(tracked) - names, set(tracked) - names
    assert {"LICENSE", "licenses/libuv.txt", "CHANGELOG.md", "README.md", "setup.py", "pyproject.toml"} <= names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]


# --- a system without the libraries ------------------------------------------------------


def _package_files() -> tuple[list[Path], list[Path]]:
    """(library files, header files) of HIDDEN_PACKAGES: regular files only, so that a
    symlink shared with another package (zlib's) is never followed."""
    libs, headers = [], []
    for pkg in HIDDEN_PACKAGES:
        r = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"dpkg does not know {pkg} (scripts/setup.sh installs it): {r.stderr}")
        for line in r.stdout.split():
            p = Path(line)
            if p.is_symlink() or not p.is_file():
                continue
            if line.startswith("/usr/include/"):
                headers.append(p)
            elif re.search(r"\.so(\.[0-9.]+)?$|\.a$|\.pc$", p.name):
                libs.append(p)
    return libs, headers


def _shadow(orig: Path, view: Path, hidden: set[Path], seen_as: Path) -> None:
    """Fills `view` with symlinks to each entry of `orig` (as it will be seen at `seen_as`)
    except the hidden files, descending into directories that hold hidden files."""
    for entry in sorted(orig.iterdir()):
        if entry in hidden:
            continue
        if entry.is_dir() and not entry.is_symlink() and any(entry in h.parents for h in hidden):
            (view / entry.name).mkdir()
            _shadow(entry, view / entry.name, hidden, seen_as / entry.name)
        else:
            (view / entry.name).symlink_to(seen_as / entry.name)


def _bare_system(tmp: Path, extra_headers: tuple[str, ...] = ()) -> list[str]:
    """The command prefix that runs a command in a new mount namespace where HIDDEN_PACKAGES'
    libraries are empty files and /usr/include lacks their headers (and `extra_headers`)."""
    if os.geteuid() != 0:
        pytest.skip("hiding the system's libraries needs root (unshare -m); CI runs as root")
    if shutil.which("unshare") is None or shutil.which("dpkg") is None:
        pytest.skip("needs unshare (util-linux) and dpkg to find and hide the -dev packages' files")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"this machine cannot make a mount namespace: {probe.stderr.strip()}")
    libs, headers = _package_files()
    headers += [Path("/usr/include", h) for h in extra_headers]
    assert libs and headers
    empty = tmp / "empty"
    empty.write_bytes(b"")
    orig, view = tmp / "orig-include", tmp / "include"
    orig.mkdir()
    view.mkdir()
    _shadow(Path("/usr/include"), view, set(headers), orig)
    mounts = ["mount --make-rprivate /", f"mount --bind /usr/include {orig}", f"mount --bind {view} /usr/include"]
    mounts += [f"mount --bind {empty} {lib}" for lib in libs]
    script = " && ".join(mounts) + ' && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, "bare-system"]


CHECK_HIDDEN = """
import ctypes, os, sys
for name in sys.argv[1:]:
    try:
        ctypes.CDLL(name)
    except OSError:
        continue
    sys.exit(f"{name} still loads")
for h in ("uv.h", "nghttp2/nghttp2.h", "protobuf-c/protobuf-c.h"):
    assert not os.path.exists("/usr/include/" + h), h
print("hidden")
"""


class Served:
    """`openinfer serve` from a virtual environment, inside a bare system; its output read by
    a thread until the "listening on" line gives both ports."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.http = self.grpc = ""
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(120):
            self.stop()
            raise AssertionError("no 'listening on' line:\n" + "".join(self.lines))

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            m = re.search(r"listening on http://(127\.0\.0\.1:\d+) and grpc://(127\.0\.0\.1:\d+)", line)
            if m:
                self.http, self.grpc = m.groups()
                self.ready.set()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(60)


def _infer_both(http: str, grpc: str) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 5, dtype=np.int32)
    for module, url in ((httpclient, http), (grpcclient, grpc)):
        client = module.InferenceServerClient(url)
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        client.close()


def test_wheel_serves_where_the_libraries_are_hidden(dist: Path, tmp_path: Path) -> None:
    bare = _bare_system(tmp_path)
    venv = tmp_path / "venv"
    py = venv / "bin" / "python"
    # A new environment, made and filled inside the bare system (numpy from PyPI).
    setup = f"{sys._base_executable} -m venv {venv} && {py} -m pip install -q {_wheel(dist)} && {py} -c '{CHECK_HIDDEN}' {' '.join(RUNTIME_SONAMES)}"  # noqa: E501
    r = _run([*bare, "sh", "-c", setup])
    assert r.stdout.strip().endswith("hidden"), r.stdout
    served = Served([*bare, str(venv / "bin" / "openinfer"), "serve", "--http-port", "0", "--grpc-port", "0",
                     "--threads", "1"])  # fmt: skip
    try:
        maps = Path(f"/proc/{served.proc.pid}/maps").read_text()
        loaded = {m.group(1) for m in re.finditer(r"\s(/\S+/lib(?:uv|nghttp2|protobuf-c)\S*\.so\S*)", maps)}
        assert len(loaded) == 3 and all(f"{venv}/lib/" in p and "/openinfer.libs/" in p for p in loaded), loaded
        _infer_both(served.http, served.grpc)
    finally:
        rc = served.stop()
    assert rc == 0, "".join(served.lines)


def test_sdist_build_names_each_missing_debian_package(dist: Path, tmp_path: Path) -> None:
    """Building the sdist where the headers of libuv, nghttp2, protobuf-c and zlib are hidden
    stops before compiling, naming each header and the package that provides it."""
    bare = _bare_system(tmp_path, extra_headers=("zlib.h", "zconf.h"))
    with tarfile.open(_sdist(dist)) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    (src,) = (tmp_path / "src").iterdir()
    r = subprocess.run([*bare, sys.executable, "setup.py", "build_ext"], cwd=src, env=_env(),
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode != 0
    assert "openinfer build: C libraries missing:" in r.stderr, r.stderr[-4000:]
    for name, header in (("libuv", "uv.h"), ("libnghttp2", "nghttp2/nghttp2.h"),
                         ("libprotobuf-c", "protobuf-c/protobuf-c.h"), ("zlib", "zlib.h")):  # fmt: skip
        line = next((x for x in r.stderr.splitlines() if x.strip().startswith(f"{name}:")), "")
        assert f"{header} is not in" in line and f"install Debian's package `{DEBIAN_DEV[name]}`" in line, r.stderr
    assert "gcc" not in r.stdout + r.stderr  # nothing was compiled


VERSIONS = """
import importlib.metadata, openinfer, openinfer._core
print(openinfer.__file__, openinfer.__version__, importlib.metadata.version("openinfer"), openinfer._core.__version__)
"""


def test_sdist_installs_into_a_new_venv_and_serves(dist: Path, tmp_path: Path) -> None:
    """pip install openinfer-X.tar.gz as a user would (its build requirements from PyPI in an
    isolated build), then serve from that environment."""
    venv = tmp_path / "venv"
    _run([sys._base_executable, "-m", "venv", venv])
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", _sdist(dist)])
    served = Served([str(venv / "bin" / "openinfer"), "serve", "--http-port", "0", "--grpc-port", "0",
                     "--threads", "1"])  # fmt: skip
    try:
        _infer_both(served.http, served.grpc)
    finally:
        rc = served.stop()
    assert rc == 0, "".join(served.lines)
    # One version everywhere: the package, its metadata and the extension.
    r = _run([venv / "bin" / "python", "-c", VERSIONS], cwd=tmp_path)
    where, *versions = r.stdout.split()
    assert where.startswith(f"{venv}/lib/") and versions == [openinfer.__version__] * 3
    assert _run([venv / "bin" / "openinfer", "--version"]).stdout.strip() == f"openinfer {openinfer.__version__}"
