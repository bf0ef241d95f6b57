"""A file a model's configuration names is opened once, beneath the model's directory, and read
from that descriptor: whoever can write in the model directory and swaps `labels.txt` for a
symbolic link to a secret file, over and over while the model is loaded and reloaded, never
gets the secret back through classification outputs (or load errors)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
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
# Swaps labels.txt between a regular file and a link to the secret as fast as it can, each swap
# an atomic rename, until killed: another process, so that no lock of the server's paces it.
FLIPPER = """\
import os, sys
labels, secret = sys.argv[1], sys.argv[2]
while True:
    os.symlink(secret, labels + ".link")
    os.replace(labels + ".link", labels)
    with open(labels + ".file", "w") as f:
        f.write("cat\\ndog\\nfish\\n")
    os.replace(labels + ".file", labels)
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
                if r.status_code == 200:  # (a failed reload leaves no version to infer on)
                    labels = [s.rsplit(":", 1)[-1] for s in r.json()["outputs"][0]["data"]]
                    assert labels == ["dog", "fish", "cat"], r.text
    finally:
        flipper.kill()
        flipper.wait()
    assert loaded and refused, (loaded, refused)  # both sides of the swap were seen
