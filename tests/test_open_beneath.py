"""paths.open_beneath: the one opener of files a model configuration names. Each case runs
twice: through openat2(RESOLVE_BENEATH) and through the O_NOFOLLOW walk used where the kernel
(or a seccomp filter) refuses openat2."""

import os
import threading

import pytest

from openinfer._config import paths


@pytest.fixture(params=["openat2", "walk"])
def opener(request, monkeypatch):
    if request.param == "openat2":
        if not paths._openat2_usable:
            pytest.skip("this kernel has no openat2")
    else:
        monkeypatch.setattr(paths, "_openat2_usable", False)
    return request.param


@pytest.fixture
def model_dir(tmp_path):
    model = tmp_path / "repo" / "m"
    (model / "warmup").mkdir(parents=True)
    (model / "1").mkdir()
    (model / "labels.txt").write_text("cat\ndog\n")
    (model / "warmup" / "raw").write_bytes(b"\x01\x02")
    (tmp_path / "secret").write_text("root's secret\n")
    return model


def read(model_dir, name, folder="", nested=False):
    return paths.read_beneath(model_dir / folder if folder else model_dir, name, "field", model_dir, nested)


def test_reads_a_file_and_a_file_in_a_folder(opener, model_dir):
    assert read(model_dir, "labels.txt") == b"cat\ndog\n"
    assert read(model_dir, "raw", "warmup") == b"\x01\x02"


def test_a_link_that_stays_inside_is_followed(opener, model_dir):
    os.symlink("labels.txt", model_dir / "alias.txt")
    os.symlink("../labels.txt", model_dir / "1" / "up.txt")
    assert read(model_dir, "alias.txt") == b"cat\ndog\n"
    assert read(model_dir, "1/up.txt", nested=True) == b"cat\ndog\n"


@pytest.mark.parametrize("target", ["../secret", "/etc/passwd", "1/../../secret"])
def test_a_link_that_leads_outside_is_refused(opener, model_dir, target):
    os.symlink(target, model_dir / "labels2.txt")
    with pytest.raises(paths.PathError, match=r"field 'labels2.txt' leads outside the model directory"):
        read(model_dir, "labels2.txt")


def test_a_link_inside_a_folder_to_its_parent_is_refused(opener, model_dir):
    # Inside the model directory, but outside warmup/, which is where the field's file belongs.
    os.symlink("../labels.txt", model_dir / "warmup" / "up")
    with pytest.raises(paths.PathError, match="leads outside the model's warmup/ directory"):
        read(model_dir, "up", "warmup")


def test_the_folder_itself_swapped_for_a_link_is_refused(opener, model_dir, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "raw").write_text("not the model's")
    os.rename(model_dir / "warmup", model_dir / "warmup.old")
    os.symlink(tmp_path / "elsewhere", model_dir / "warmup")
    with pytest.raises(paths.PathError, match="leads outside"):
        read(model_dir, "raw", "warmup")


def test_a_link_loop_is_refused(opener, model_dir):
    os.symlink("b", model_dir / "a")
    os.symlink("a", model_dir / "b")
    with pytest.raises(paths.PathError, match="too many levels of symbolic links"):
        read(model_dir, "a")


def test_not_a_regular_file(opener, model_dir):
    os.mkfifo(model_dir / "fifo")  # opening it must neither block nor be read
    with pytest.raises(paths.PathError, match="'fifo' in the model directory is not a regular file"):
        read(model_dir, "fifo")
    with pytest.raises(paths.PathError, match="not a regular file"):
        read(model_dir, "1")


def test_missing_file_is_an_os_error(opener, model_dir):
    with pytest.raises(FileNotFoundError):
        read(model_dir, "nope.txt")


@pytest.mark.parametrize("name", ["../secret", "/etc/passwd", "a/b", "", "x\0y"])
def test_names_of_the_wrong_shape_are_refused_before_any_access(opener, model_dir, name):
    with pytest.raises(paths.PathError, match="must be a file name inside the model directory"):
        read(model_dir, name)


def test_a_file_flipped_with_a_link_never_yields_the_target(opener, model_dir):
    """The race of a check and a later open: a writer in the model directory flips labels.txt
    between a file and a link to a secret while the server reads it."""
    secret = model_dir.parent.parent / "secret"
    stop = threading.Event()

    def flip():
        link, real = model_dir / "flip.lnk", model_dir / "flip.real"
        real.write_text("cat\n")
        os.symlink(secret, link)
        while not stop.is_set():
            os.replace(link, model_dir / "labels.txt")
            os.symlink(secret, link)
            real.write_text("cat\n")
            os.replace(real, model_dir / "labels.txt")

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        seen = set()
        for _ in range(2000):
            try:
                seen.add(read(model_dir, "labels.txt"))
            except (paths.PathError, FileNotFoundError):
                seen.add("refused")
    finally:
        stop.set()
        flipper.join()
    assert b"root's secret\n" not in seen
    assert b"cat\n" in seen


def test_the_folder_of_a_path_a_library_opens_itself_is_held(opener, model_dir, tmp_path):
    """An accelerator's cache path: its folder is opened beneath the model directory and held,
    and the library is given that folder's descriptor path and the last component."""
    (model_dir / "caches" / "trt").mkdir(parents=True)
    held, last = paths.open_parent_beneath(model_dir, "caches/trt/engine", "field", model_dir)
    assert last == "engine" and held.source == paths.fd_path(held.fd)
    assert os.readlink(held.source) == str(model_dir / "caches" / "trt")
    os.rename(model_dir / "caches", model_dir / "moved")  # the folder held is the one checked
    os.symlink(tmp_path, model_dir / "caches")
    assert os.path.realpath(f"{held.source}/{last}") == str(model_dir / "moved" / "trt" / "engine")
    held, last = paths.open_parent_beneath(model_dir, "engine", "field", model_dir)
    assert (os.readlink(held.source), last) == (str(model_dir), "engine")


def test_the_folder_of_a_path_a_library_opens_itself_may_not_lead_out(opener, model_dir, tmp_path):
    os.symlink(tmp_path, model_dir / "out")
    with pytest.raises(paths.PathError, match="field 'out/engine' leads outside the model directory"):
        paths.open_parent_beneath(model_dir, "out/engine", "field", model_dir)
    with pytest.raises(paths.PathError, match="must be a relative path inside the model directory"):
        paths.open_parent_beneath(model_dir, "../engine", "field", model_dir)
