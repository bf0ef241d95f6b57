"""Builds openinfer._core from csrc/ with libuv, llhttp (compiled from Debian's node-llhttp
sources), nghttp2, protobuf-c (C code generated from proto/ with protoc-c at build time) and
the numpy C API.

Environment:
  OI_WERROR=1    compile our sources with -Werror (CI and `make test` do).
  OI_SANITIZE=1  build with AddressSanitizer and UndefinedBehaviorSanitizer.

When torch is importable in the build, the libtorch shim (csrc/backends/torch_shim/) is built
too, into the package; otherwise openinfer builds it on first use (python/openinfer/_torch_build.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from glob import glob
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
LLHTTP_SRC = Path(os.environ.get("OI_LLHTTP_SRC", "/usr/share/llhttp"))
LLHTTP_INC = Path(os.environ.get("OI_LLHTTP_INCLUDE", "/usr/share/include/llhttp"))
LLHTTP_FILES = ("api.c", "http.c", "llhttp.c")
PROTOS = ("model_config.proto", "grpc_service.proto", "health.proto")


def fail(message: str) -> None:
    sys.exit(f"openinfer build: {message}")


def check_dependencies() -> None:
    if not all((LLHTTP_SRC / f).is_file() for f in LLHTTP_FILES) or not (LLHTTP_INC / "llhttp.h").is_file():
        fail(
            f"llhttp C sources not found in {LLHTTP_SRC} and {LLHTTP_INC}; "
            "install Debian's package `node-llhttp` (apt-get install node-llhttp) "
            "or set OI_LLHTTP_SRC / OI_LLHTTP_INCLUDE"
        )
    if not any(Path(d, "uv.h").is_file() for d in ("/usr/include", "/usr/local/include")):
        fail("libuv headers (uv.h) not found; install Debian's package `libuv1-dev`")
    if not _header("nghttp2/nghttp2.h"):
        fail("nghttp2 headers (nghttp2/nghttp2.h) not found; install Debian's package `libnghttp2-dev`")
    if not _header("protobuf-c/protobuf-c.h"):
        fail("protobuf-c headers not found; install Debian's package `libprotobuf-c-dev`")
    if shutil.which("protoc-c") is None:
        fail("protoc-c (the protobuf-c code generator) not found; install Debian's package `protobuf-c-compiler`")


def _header(name: str) -> bool:
    return any(Path(d, name).is_file() for d in ("/usr/include", "/usr/local/include"))


def generate_protobuf_c(out_dir: Path) -> list[str]:
    """Runs protoc-c on proto/ into out_dir (a build directory, never the source tree) when a
    .proto is newer than its output; returns the generated C sources."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = []
    for proto in PROTOS:
        src = ROOT / "proto" / proto
        c_file = out_dir / proto.replace(".proto", ".pb-c.c")
        if not c_file.is_file() or c_file.stat().st_mtime < src.stat().st_mtime:
            cmd = ["protoc-c", f"--c_out={out_dir}", f"-I{ROOT / 'proto'}", str(src)]
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
    """Compiles llhttp's generated sources with their own relaxed warnings (its callbacks have
    unused parameters) and links them into the extension."""

    def build_extension(self, ext: Extension) -> None:
        check_dependencies()
        import numpy

        ext.include_dirs.append(numpy.get_include())
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
    libraries=["uv", "z", "nghttp2", "protobuf-c"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION"), ("_GNU_SOURCE", None)],
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
