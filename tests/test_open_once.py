"""A file a model's configuration names, and config.pbtxt itself, is opened once, beneath the
model's directory, and read from that descriptor: whoever can write in the model directory and
swaps `labels.txt` for a symbolic link to a secret file, over and over while the model is loaded
and reloaded, never gets the secret back through classification outputs (or load errors)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import requests

import openinfer

MODEL = """\
import numpy as np

def infer(inputs):
    return {"PROB": inputs["SCORES"]}
"""
CONFIG = """\
backend: "python"
max_batch_size: 0
input [{ name: "SCORES" data_type: TYPE_FP32 dims: [ 3 ] }]
output [{ name: "PROB" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" }]
"""
SECRET = "root:$6$SECRET-HASH$\n"
# Swaps labels.txt with a link to the secret as fast as it can, each swap one atomic
# renameat2(RENAME_EXCHANGE), until killed: another process, so that no lock of the server's
# paces it.
FLIPPER = """\
import ctypes, os, sys
labels, secret = sys.argv[1].encode(), sys.argv[2]
os.symlink(secret, labels + b".link")
renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
AT_FDCWD, RENAME_EXCHANGE = -100, 2
while True:
    if renameat2(AT_FDCWD, labels, AT_FDCWD, labels + b".link", RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
"""
LOADS = 60  # enough that the link is seen at every step of a load (a bound, not a timing claim)


def test_a_label_file_swapped_for_a_link_never_returns_the_secret(tmp_path: Path) -> None:
    model = tmp_path / "repo" / "cls"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(MODEL)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "labels.txt").write_text("cat\ndog\nfish\n")
    secret = tmp_path / "shadow"
    secret.write_text(SECRET * 3)
    flipper = subprocess.Popen([sys.executable, "-c", FLIPPER, str(model / "labels.txt"), str(secret)])
    loaded = refused = 0
    try:
        with openinfer.serve(tmp_path / "repo", http_port=0, grpc_port=None, log=False,
                             model_control_mode="explicit") as srv:
            time.sleep(0.2)  # the flipper under way
            for _ in range(LOADS):
                r = requests.post(f"{srv.url}/v2/repository/models/cls/load", timeout=60)
                assert "SECRET" not in r.text
                if r.status_code != 200:
                    assert "label_filename 'labels.txt' leads outside the model directory" in r.text, r.text
                    refused += 1
                    continue
                loaded += 1
                r = requests.post(f"{srv.url}/v2/models/cls/infer", timeout=60, json={
                    "inputs": [{"name": "SCORES", "shape": [3], "datatype": "FP32", "data": [0.1, 0.7, 0.2]}],
                    "outputs": [{"name": "PROB", "parameters": {"classification": 3}}]})
                assert "SECRET" not in r.text, r.text
                if r.status_code == 200:  # (a failed reload leaves no version to infer on)
                    labels = [s.split(":", 2)[2] for s in r.json()["outputs"][0]["data"]]
                    assert labels == ["dog", "fish", "cat"], r.text
    finally:
        flipper.kill()
        flipper.wait()
    assert loaded and refused, (loaded, refused)  # both sides of the swap were seen


def test_a_config_pbtxt_that_links_out_is_not_parsed(tmp_path: Path) -> None:
    """config.pbtxt is opened as the files it names are: a link to a secret file is refused,
    not parsed into a syntax error that quotes the secret."""
    model = tmp_path / "repo" / "leak"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(MODEL)
    (tmp_path / "shadow").write_text(SECRET)
    (model / "config.pbtxt").symlink_to(tmp_path / "shadow")
    with openinfer.serve(tmp_path / "repo", http_port=0, grpc_port=None, log=False) as srv:
        (entry,) = requests.post(f"{srv.url}/v2/repository/index", timeout=30).json()
    assert entry["state"] == "UNAVAILABLE", entry
    assert "config.pbtxt 'config.pbtxt' leads outside the model directory" in entry["reason"], entry
    assert "SECRET" not in entry["reason"]
