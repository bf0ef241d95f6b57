"""The cache of compiled code (the torch shim, PT2 packages) is checked as code is: a folder or
file of it that is not the server user's own, or that group or others can write, is not loaded
or obeyed, and the error names the path and why. As root, the other user is `nobody`."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest
import requests

import openinfer
from openinfer import _code_cache

EXAMPLES = openinfer.examples_path()


def _nobody() -> int:
    if os.geteuid() != 0:
        pytest.skip("making a file another user's needs root")
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user nobody")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "shared" / "openinfer"
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(root))
    return root


def _refused(sub: str = "pt2") -> str:
    with pytest.raises(_code_cache.UntrustedCache) as e:
        fd, _ = _code_cache.directory(sub)
        os.close(fd)
    return str(e.value)


def test_the_folders_it_makes_are_the_users_own_0700(cache: Path) -> None:
    fd, path = _code_cache.directory("pt2")
    os.close(fd)
    assert path == cache / "pt2"
    for folder in (cache.parent, cache, cache / "pt2"):
        st = folder.stat()
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid(), folder


@pytest.mark.parametrize("mode,why", [(0o777, "is writable by others"), (0o770, "is writable by its group"),
                                      (0o1777, "is writable by others")])
def test_a_cache_others_can_write_is_refused(cache: Path, mode: int, why: str) -> None:
    cache.mkdir(parents=True)
    cache.chmod(mode)
    assert _refused() == (
        f"the cache {cache} {why}; it holds code the server loads, so it is not used "
        "(make it the server user's own with mode 0700, or set OPENINFER_CACHE_DIR)"
    )


def test_a_folder_below_the_root_is_checked_too(cache: Path) -> None:
    (cache / "pt2").mkdir(parents=True, mode=0o700)
    (cache / "pt2").chmod(0o757)
    assert f"the cache {cache / 'pt2'} is writable by others" in _refused()


def test_a_cache_another_user_owns_is_refused(cache: Path) -> None:
    nobody = _nobody()
    (cache / "pt2").mkdir(parents=True, mode=0o700)
    os.chown(cache, nobody, -1)
    assert f"the cache {cache} is owned by uid {nobody}" in _refused()
    os.chown(cache, 0, -1)
    os.chown(cache / "pt2", nobody, -1)
    assert f"the cache {cache / 'pt2'} is owned by uid {nobody}" in _refused()


def test_a_link_in_the_cache_is_not_followed(cache: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    cache.mkdir(parents=True, mode=0o700)
    (cache / "pt2").symlink_to(tmp_path / "elsewhere")
    assert f"the cache {cache / 'pt2'} is not a folder (a symbolic link is not followed)" in _refused()
    (cache / "torch_shim").mkdir(mode=0o700)
    (cache / "torch_shim" / "lib.so").symlink_to(tmp_path / "elsewhere")
    fd, folder = _code_cache.directory("torch_shim")
    try:
        with pytest.raises(_code_cache.UntrustedCache, match="lib.so is a symbolic link; it is not followed"):
            _code_cache.open_file(fd, "lib.so", folder)
        assert _code_cache.open_file(fd, "missing.so", folder) is None
    finally:
        os.close(fd)


def test_a_planted_torch_shim_is_not_loaded(cache: Path, tmp_path: Path) -> None:
    """A shim library in the cache that another user owns is refused before it is mapped (the
    package directory given holds no shim of its own, so the cache's would be used)."""
    nobody = _nobody()
    pytest.importorskip("torch")
    from openinfer import _torch_build

    name = _torch_build.library_name(_torch_build.build_key())
    (cache / "torch_shim").mkdir(parents=True, mode=0o700)
    (cache / "torch_shim" / name).write_bytes(b"\x7fELF planted")
    os.chown(cache / "torch_shim" / name, nobody, -1)
    with pytest.raises(_code_cache.UntrustedCache, match=f"the cache {cache / 'torch_shim' / name} is owned by uid {nobody}"):
        with _torch_build.shim(package_dir=tmp_path):
            pass


@pytest.mark.parametrize("planted", [".pt2", ".pt2.failed"])
def test_a_planted_pt2_package_or_marker_is_not_used(cache: Path, tmp_path: Path, planted: str) -> None:
    """A PT2 example's package (the library its wrapper.so is mapped from) or its `.failed`
    marker, planted in the cache by another user: the example is not served from it, and the
    repository index says why, naming the file."""
    nobody = _nobody()
    pytest.importorskip("torch")
    from openinfer import _pt2_build

    target = _pt2_build.package_path(EXAMPLES / "mlp_pt2" / "1")
    planted_file = target.with_name(target.stem + planted)
    target.parent.mkdir(parents=True, mode=0o700)
    planted_file.write_bytes(b"PK\x03\x04 planted: the example is not built" if planted == ".pt2" else b"do not build\n")
    os.chown(planted_file, nobody, -1)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "mlp_pt2").symlink_to(EXAMPLES / "mlp_pt2")
    with openinfer.serve(repo, http_port=0, grpc_port=None, log=False) as srv:
        index = requests.post(f"{srv.url}/v2/repository/index", timeout=30).json()
    (entry,) = [m for m in index if m["name"] == "mlp_pt2"]
    assert entry["state"] == "UNAVAILABLE", entry
    assert f"the cache {planted_file} is owned by uid {nobody}" in entry["reason"], entry
    assert "do not build" not in entry["reason"]


def test_a_cached_shim_of_the_users_own_is_loaded_through_its_descriptor(cache: Path, tmp_path: Path) -> None:
    """The normal cache still works: a shim in a cache of the server user's own is loaded, as
    /proc/self/fd/N of the descriptor that was checked (copied here from the package's own
    build, which otherwise takes precedence, rather than compiled again)."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    from openinfer import _torch_build

    name = _torch_build.library_name(_torch_build.build_key())
    built = Path(_torch_build.__file__).parent / name
    if not built.is_file():
        pytest.skip("no shim built in the package directory to copy")
    (cache / "torch_shim").mkdir(parents=True, mode=0o700)
    (cache / "torch_shim" / name).write_bytes(built.read_bytes())
    code = (
        "import os, sys, torch\n"
        "from openinfer import _core, _torch_build\n"
        "with _torch_build.shim(package_dir=sys.argv[1]) as path:\n"
        "    assert path.startswith('/proc/self/fd/'), path\n"
        "    _core.torch_open_shim(path)\n"
        "    print(os.path.realpath(path))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(cache / "torch_shim" / name)
