"""Builds the libtorch shim (csrc/backends/torch_shim/) against the installed torch.

The shim is C++ that links libtorch, so it must match the torch in the environment: its
version, its C++ ABI flag (``torch._C._GLIBCXX_USE_CXX11_ABI``) and whether it has CUDA. It
is built at ``pip install`` when torch is importable there (setup.py calls `build` into the
package directory), and otherwise on first use into a cache directory keyed by all of that
(`shim`). This module imports torch only inside its functions, and setup.py loads it
by path, so it needs nothing but the standard library to import.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

SHIM_SOURCES = ("backends/torch_shim/torch_shim.cpp", "backends/torch_shim/torch_shim.h")
C_SOURCES = ("core/dtype.c", "core/dtype.h")
_LIBRARY = "libopeninfer_torch"


class ShimBuildError(RuntimeError):
    """The shim could not be built (no compiler, or the compiler failed); the message says
    what to install or what went wrong."""


def source_dir() -> Path:
    """The C sources the shim needs: the package's copy in an installed wheel
    (``openinfer/_csrc``), else ``csrc`` of a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_csrc", here.parents[1] / "csrc"):
        if (candidate / SHIM_SOURCES[0]).is_file():
            return candidate
    raise ShimBuildError(f"the torch shim's C++ sources are missing from this installation ({here})")


def build_key(src: Path | None = None) -> str:
    """torch version, C++ ABI, CUDA or not, and a digest of the shim's sources: a shim built
    for any other combination is never loaded."""
    import torch

    src = src or source_dir()
    digest = hashlib.sha256()
    for rel in (*SHIM_SOURCES, *C_SOURCES):
        digest.update((src / rel).read_bytes())
    cuda = f"cu{torch.version.cuda}" if torch.version.cuda else "cpu"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    version = torch.__version__.split("+")[0]
    return f"torch{version}-{cuda}-cxxabi{abi}-{digest.hexdigest()[:12]}"


def library_name(key: str) -> str:
    return f"{_LIBRARY}-{key}.so"


def _compiler(kind: str) -> str:
    env = os.environ.get("CXX" if kind == "c++" else "CC")
    names = [env] if env else (["g++", "c++", "clang++"] if kind == "c++" else ["gcc", "cc", "clang"])
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise ShimBuildError(
        f"no {kind} compiler found (tried {', '.join(names)}): serving TorchScript models "
        "compiles a small C++ shim against the installed torch on first use; install one "
        "(Debian/Ubuntu: apt-get install g++) or set "
        + ("CXX" if kind == "c++" else "CC")
    )


# What a sanitizer run (make test-asan) puts in the environment for the openinfer process
# alone: a compiler started with it inherits the preloaded runtime, LeakSanitizer then reports
# the compiler's own allocations, and the compiler exits non-zero.
_SANITIZER_OPTIONS = ("ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS", "MSAN_OPTIONS")
_SANITIZER_RUNTIMES = ("libasan", "liblsan", "libubsan", "libtsan", "libmsan", "libclang_rt.")


def child_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a process openinfer starts (the compiler): the caller's, less the
    sanitizer runtimes in LD_PRELOAD and the sanitizers' options. Other preloads stay."""
    out = dict(os.environ if env is None else env)
    for name in _SANITIZER_OPTIONS:
        out.pop(name, None)
    kept = [
        lib
        for lib in out.get("LD_PRELOAD", "").replace(":", " ").split()
        if not os.path.basename(lib).startswith(_SANITIZER_RUNTIMES)
    ]
    if kept:
        out["LD_PRELOAD"] = " ".join(kept)
    else:
        out.pop("LD_PRELOAD", None)
    return out


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_environment())
    if proc.returncode != 0:
        raise ShimBuildError(
            "compiling the torch shim failed:\n  "
            + " ".join(cmd)
            + "\n"
            + (proc.stderr or proc.stdout)[-4000:]
        )


def cuda_include_dirs(cuda_home: str | None) -> list[str]:
    """Where c10/cuda's headers find CUDA's own (cuda_runtime_api.h): the toolkit's when
    there is one (torch's CUDA_HOME), and the include folders of the nvidia-* wheels that a pip
    torch depends on (nvidia/cuda_runtime/include for CUDA 12, nvidia/cu13/include for 13), so
    no toolkit is needed. g++ searches none of them by itself."""
    candidates = [Path(cuda_home) / "include"] if cuda_home else []
    try:
        import nvidia  # the namespace package of the nvidia-* wheels

        for base in nvidia.__path__:
            candidates += sorted(Path(base).glob("*/include"))
    except ImportError:
        pass
    return [str(d) for d in candidates if (d / "cuda_runtime_api.h").is_file()]


def build(dest_dir: str | os.PathLike[str], *, werror: bool = False) -> Path:
    """Compiles the shim into `dest_dir` under its keyed name and returns its path; an
    existing build with that name is kept. Raises ShimBuildError."""
    import torch
    import torch.utils.cpp_extension as cpp

    src = source_dir()
    dest = Path(dest_dir)
    target = dest / library_name(build_key(src))
    if target.is_file():
        return target
    dest.mkdir(parents=True, exist_ok=True)
    cxx, cc = _compiler("c++"), _compiler("c")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    lib_dirs = cpp.library_paths()
    libs = ["c10", "torch_cpu", "torch"]
    defines = [
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f'-DOITS_TORCH_VERSION="{torch.__version__}"',
    ]
    includes = list(cpp.include_paths())
    if torch.version.cuda:
        libs += ["c10_cuda", "torch_cuda"]
        defines.append("-DOITS_WITH_CUDA")
        includes += cuda_include_dirs(cpp.CUDA_HOME)
    warn = ["-Wall", "-Wextra", *(["-Werror"] if werror else [])]
    with tempfile.TemporaryDirectory(prefix="oi-shim-", dir=dest) as tmp:
        obj_c = os.path.join(tmp, "dtype.o")
        obj_cpp = os.path.join(tmp, "torch_shim.o")
        out = os.path.join(tmp, target.name)
        _run([cc, "-std=c11", "-O2", "-fPIC", *warn, f"-I{src}", "-c", str(src / C_SOURCES[0]), "-o", obj_c])
        _run(
            [
                cxx, "-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", *warn, *defines,
                f"-I{src}", *(f"-isystem{p}" for p in includes),
                "-c", str(src / SHIM_SOURCES[0]), "-o", obj_cpp,
            ]
        )  # fmt: skip
        # --no-as-needed: the CUDA libraries register their kernels when loaded, and nothing
        # in the shim references them by symbol, so the linker would otherwise drop them.
        _run(
            [
                cxx, "-shared", "-o", out, obj_cpp, obj_c,
                *(f"-L{d}" for d in lib_dirs), *(f"-Wl,-rpath,{d}" for d in lib_dirs),
                "-Wl,--no-as-needed", *(f"-l{lib}" for lib in libs), "-Wl,--as-needed",
            ]
        )  # fmt: skip
        os.replace(out, target)  # atomic: a concurrent loader sees all of it or nothing
    return target


@contextlib.contextmanager
def shim(package_dir: str | os.PathLike[str] | None = None) -> Iterator[str]:
    """The path to load the shim for the installed torch from, valid inside the with block:
    the one built at install time in the package directory, else the cached one, else a new
    build into the cache, announced by one line on the "openinfer" logger (a WARNING, so that
    it shows where logging is not configured: the first TorchScript model waits for the
    compiler). A cached shim is given as the descriptor it was checked through (see
    _code_cache: the cache is refused unless it is the server user's own). Imports torch
    first. Raises ShimBuildError, before announcing anything when no compiler is found, and
    _code_cache.UntrustedCache."""
    import torch  # noqa: F401  (the shim links the libraries this loads)

    from ._code_cache import directory, open_file

    src = source_dir()
    name = library_name(build_key(src))
    here = Path(package_dir) if package_dir else Path(__file__).resolve().parent
    if (here / name).is_file():
        yield str(here / name)
        return
    dir_fd, cache = directory("torch_shim")
    try:
        fd = open_file(dir_fd, name, cache)
        if fd is None:
            fd = _build_cached(dir_fd, cache, name)
    finally:
        os.close(dir_fd)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _build_cached(dir_fd: int, cache: Path, name: str) -> int:
    """Builds shim `name` into the checked cache folder `dir_fd` (`cache`), one compiler at a
    time per cache, and opens it (see `shim`)."""
    import torch

    from ._code_cache import open_file

    cxx = _compiler("c++")
    _compiler("c")
    lock = open_file(dir_fd, ".lock", cache, os.O_RDWR, create=True)
    assert lock is not None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fd = open_file(dir_fd, name, cache)
        if fd is None:
            logging.getLogger("openinfer").warning(
                "compiling the libtorch shim for torch %s with %s into %s "
                "(once per torch version, about a minute; $OPENINFER_CACHE_DIR moves the cache)",
                torch.__version__, cxx, cache,
            )  # fmt: skip
            build(cache)
            fd = open_file(dir_fd, name, cache)
    finally:
        os.close(lock)
    if fd is None:
        raise ShimBuildError(f"the torch shim built into {cache} is not there")
    return fd


if __name__ == "__main__":
    # python -m openinfer._torch_build [DIR]: build into DIR (a package directory), else into
    # the cache now.
    if len(sys.argv) > 1:
        print(build(sys.argv[1], werror=os.environ.get("OI_WERROR") == "1"))
    else:
        with shim() as path:
            print(os.path.realpath(path))
