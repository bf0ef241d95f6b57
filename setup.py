"""Builds openinfer._core from csrc/ with libuv, llhttp (compiled in from its C sources),
nghttp2, protobuf-c (C code generated from every proto/*.proto with protoc-c at build time),
zlib, OpenSSL (TLS) and the numpy C API.

libuv, nghttp2, protobuf-c, zlib and OpenSSL (libssl, libcrypto) are found with pkg-config
(falling back to the compiler's default directories when pkg-config is absent or does not
know them); a missing one is an error that names the Debian package to install. llhttp's sources come from Debian's
`node-llhttp` unless OI_LLHTTP_SRC / OI_LLHTTP_INCLUDE say where they are.

Environment:
  OI_WERROR=1          compile our sources with -Werror (CI and `make test` do).
  OI_SANITIZE=1        build with AddressSanitizer and UndefinedBehaviorSanitizer.
  OI_LLHTTP_SRC        directory with llhttp's api.c, http.c and llhttp.c (default
                       /usr/share/llhttp); on other systems, the src/ of an llhttp release.
  OI_LLHTTP_INCLUDE    directory with llhttp.h (default /usr/share/include/llhttp); the
                       include/ of an llhttp release.
  PKG_CONFIG_PATH      where pkg-config looks for libuv.pc, libnghttp2.pc, libprotobuf-c.pc,
                       zlib.pc, libssl.pc and libcrypto.pc, for libraries installed outside
                       the system directories.

When torch is importable in the build, the libtorch shim (csrc/backends/torch_shim/) is built
too, into the package; otherwise openinfer builds it on first use (python/openinfer/_torch_build.py).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from glob import glob
from pathlib import Path
from typing import NoReturn

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
LLHTTP_SRC = Path(os.environ.get("OI_LLHTTP_SRC", "/usr/share/llhttp"))
LLHTTP_INC = Path(os.environ.get("OI_LLHTTP_INCLUDE", "/usr/share/include/llhttp"))
LLHTTP_FILES = ("api.c", "http.c", "llhttp.c")
# Every .proto in proto/ is compiled in: adding one needs no edit here.
PROTOS = tuple(sorted(p.name for p in (ROOT / "proto").glob("*.proto")))
# TensorRT Inference Server 1.x (package nvidia.inferenceserver): a folder of their own, since
# their file names repeat V2's; generated into <build>/proto/legacy and included as "legacy/...".
LEGACY_PROTOS = tuple(sorted("legacy/" + p.name for p in (ROOT / "proto" / "legacy").glob("*.proto")))
# The C libraries the extension links: pkg-config name, a header it provides, the library to
# link when pkg-config cannot say, and the Debian package with the headers.
LIBRARIES = (
    ("libuv", "uv.h", "uv", "libuv1-dev"),
    ("libnghttp2", "nghttp2/nghttp2.h", "nghttp2", "libnghttp2-dev"),
    ("libprotobuf-c", "protobuf-c/protobuf-c.h", "protobuf-c", "libprotobuf-c-dev"),
    ("zlib", "zlib.h", "z", "zlib1g-dev"),
    ("libssl", "openssl/ssl.h", "ssl", "libssl-dev"),
    ("libcrypto", "openssl/crypto.h", "crypto", "libssl-dev"),
)
DEFAULT_INCLUDE_DIRS = ("/usr/local/include", "/usr/include")


def package_version() -> str:
    """openinfer.__version__, read without importing the package: the one place the version
    is written (python/openinfer/_version.py; pyproject.toml reads it too), given to the
    extension as OI_VERSION."""
    tree = ast.parse((ROOT / "python" / "openinfer" / "_version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    fail("python/openinfer/_version.py sets no __version__")


def fail(message: str) -> NoReturn:
    sys.exit(f"openinfer build: {message}")


class Flags:
    """Include directories, library directories and libraries for the extension."""

    def __init__(self) -> None:
        self.include_dirs: list[str] = []
        self.library_dirs: list[str] = []
        self.libraries: list[str] = []

    def add(self, other: Flags) -> None:
        for mine, theirs in (
            (self.include_dirs, other.include_dirs),
            (self.library_dirs, other.library_dirs),
            (self.libraries, other.libraries),
        ):
            mine.extend(x for x in theirs if x not in mine)


def _pkg_config(name: str) -> Flags | None:
    """What pkg-config says about `name`, or None when pkg-config is absent or does not know
    it."""
    exe = os.environ.get("PKG_CONFIG", "pkg-config")
    if shutil.which(exe) is None:
        return None
    r = subprocess.run([exe, "--cflags", "--libs", name], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    flags = Flags()
    for word in r.stdout.split():
        if word.startswith("-I"):
            flags.include_dirs.append(word[2:])
        elif word.startswith("-L"):
            flags.library_dirs.append(word[2:])
        elif word.startswith("-l"):
            flags.libraries.append(word[2:])
    return flags


def _search_dirs() -> list[str]:
    env = [d for var in ("CPATH", "C_INCLUDE_PATH") for d in os.environ.get(var, "").split(":") if d]
    return [*env, *DEFAULT_INCLUDE_DIRS]


def find_libraries() -> Flags:
    """The flags for every library in LIBRARIES; exits naming each one that is missing and the
    package that provides it."""
    found = Flags()
    missing = []
    for name, header, lib, debian in LIBRARIES:
        flags = _pkg_config(name)
        known = flags is not None
        if flags is None:
            flags = Flags()
            flags.libraries.append(lib)
        searched = [*flags.include_dirs, *_search_dirs()]
        if not any(Path(d, header).is_file() for d in searched):
            missing.append(
                f"  {name}: {header} is not in {', '.join(searched)}"
                + ("" if known else f" and pkg-config has no {name}")
                + f"; install Debian's package `{debian}`, or point PKG_CONFIG_PATH at its {name}.pc"
            )
            continue
        found.add(flags)
    if missing:
        fail("C libraries missing:\n" + "\n".join(missing))
    return found


def check_tools() -> None:
    if not all((LLHTTP_SRC / f).is_file() for f in LLHTTP_FILES) or not (LLHTTP_INC / "llhttp.h").is_file():
        fail(
            f"llhttp C sources not found in {LLHTTP_SRC} and {LLHTTP_INC}; "
            "install Debian's package `node-llhttp` (apt-get install node-llhttp) "
            "or set OI_LLHTTP_SRC / OI_LLHTTP_INCLUDE to the src/ and include/ of an llhttp release"
        )
    if shutil.which("protoc-c") is None:
        fail("protoc-c (the protobuf-c code generator) not found; install Debian's package `protobuf-c-compiler`")


def generate_protobuf_c(out_dir: Path) -> list[str]:
    """Runs protoc-c on proto/ into out_dir (a build directory, never the source tree) when a
    .proto is newer than its output; returns the generated C sources."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = []
    for proto in PROTOS + LEGACY_PROTOS:
        src = ROOT / "proto" / proto
        c_file = out_dir / proto.replace(".proto", ".pb-c.c")
        if not c_file.is_file() or c_file.stat().st_mtime < src.stat().st_mtime:
            c_file.parent.mkdir(parents=True, exist_ok=True)
            cmd = ["protoc-c", f"--c_out={c_file.parent}", f"-I{src.parent}", str(src)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                fail(f"protoc-c failed on proto/{proto}:\n{r.stderr}")
        sources.append(str(c_file))
    return sources


def sanitize_flags() -> list[str]:
    if os.environ.get("OI_SANITIZE") == "1":
        return ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
    return []


class BuildExt(build_ext):
    """Checks for the tools and libraries first (naming what to install), then compiles
    llhttp's generated sources with their own relaxed warnings (its callbacks have unused
    parameters) and links them into the extension."""

    def build_extension(self, ext: Extension) -> None:
        check_tools()
        libs = find_libraries()
        import numpy

        ext.include_dirs += [*libs.include_dirs, numpy.get_include()]
        ext.library_dirs += libs.library_dirs
        ext.libraries += libs.libraries
        san = sanitize_flags()
        objects = self.compiler.compile(
            [str(LLHTTP_SRC / f) for f in LLHTTP_FILES],
            output_dir=self.build_temp,
            include_dirs=[str(LLHTTP_INC)],
            extra_postargs=["-O2", "-fPIC", "-fvisibility=hidden", *san],
        )
        # The protobuf-c code generated from proto/, compiled like llhttp with its own flags.
        gen_dir = Path(self.build_temp).resolve() / "proto"
        objects += self.compiler.compile(
            generate_protobuf_c(gen_dir),
            output_dir=self.build_temp,
            extra_postargs=["-O2", "-fPIC", "-fvisibility=hidden", *san],
        )
        ext.include_dirs.append(str(gen_dir))
        ext.extra_objects = list(objects)
        if os.environ.get("OI_WERROR") == "1":
            ext.extra_compile_args.append("-Werror")
        ext.extra_compile_args += san
        ext.extra_link_args += san
        super().build_extension(ext)

    def run(self) -> None:
        super().run()
        if not sanitize_flags():  # the sanitizer run loads the shim from the cache
            inplace = self.inplace or getattr(self, "editable_mode", False)
            self.build_torch_shim(ROOT / "python" / "openinfer" if inplace else Path(self.build_lib, "openinfer"))

    def build_torch_shim(self, package_dir: Path) -> None:
        """The shim against the torch of this environment, if there is one; a failure only
        means it is built on first use instead."""
        import importlib.util

        try:
            import torch  # noqa: F401
        except ImportError:
            return
        spec = importlib.util.spec_from_file_location("_oi_torch_build", ROOT / "python/openinfer/_torch_build.py")
        assert spec is not None and spec.loader is not None
        builder = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(builder)
        try:
            path = builder.build(package_dir, werror=os.environ.get("OI_WERROR") == "1")
            print(f"openinfer build: torch shim {path}")
        except builder.ShimBuildError as e:
            if os.environ.get("OI_WERROR") == "1":
                raise
            print(f"openinfer build: torch shim not built now (it will be on first use): {e}", file=sys.stderr)


class BuildPy(build_py):
    """Ships the example model repository inside the package (openinfer/examples/models), so
    that `openinfer serve` with no repository works from an installed wheel."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            dest = Path(self.build_lib, "openinfer", "examples", "models")
            self.copy_tree(str(ROOT / "examples" / "models"), str(dest))
            # The torch shim's sources, for building it on first use against the torch found then.
            for rel in ("backends/torch_shim/torch_shim.cpp", "backends/torch_shim/torch_shim.h", "core/dtype.c", "core/dtype.h"):
                target = Path(self.build_lib, "openinfer", "_csrc", rel)
                target.parent.mkdir(parents=True, exist_ok=True)
                self.copy_file(str(ROOT / "csrc" / rel), str(target))


sources = sorted(
    p
    for p in glob("csrc/**/*.c", recursive=True)
    if "/torch_shim/" not in p
)

core = Extension(
    "openinfer._core",
    sources=sources,
    include_dirs=["csrc", str(LLHTTP_INC)],
    define_macros=[
        ("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION"),
        ("_GNU_SOURCE", None),
        ("OI_VERSION", f'"{package_version()}"'),
    ],
    extra_compile_args=[
        "-std=c11",
        "-O2",
        "-g",
        "-Wall",
        "-Wextra",
        "-Wshadow",
        "-Wno-missing-field-initializers",
        "-fvisibility=hidden",
    ],
)

setup(ext_modules=[core], cmdclass={"build_ext": BuildExt, "build_py": BuildPy})
