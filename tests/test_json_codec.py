"""Builds the V2 JSON codec's C unit test and fuzz target under AddressSanitizer and
UndefinedBehaviorSanitizer (LeakSanitizer included) and runs them."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CC = shutil.which("cc")
CFLAGS = [
    "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror",
    "-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-Icsrc",
]
# The codec and the core modules it uses (not all of csrc/core: the codec needs no threads).
CODEC_SOURCES = [
    "csrc/core/buf.c", "csrc/core/budget.c", "csrc/core/dtype.c", "csrc/core/status.c", "csrc/core/tensor.c",
    "csrc/codec/json_decode.c", "csrc/codec/json_encode.c", "csrc/codec/json_params.c", "csrc/codec/num.c",
]
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) on PATH")


def _clean_env() -> dict[str, str]:
    """This process's environment without the sanitizer run's LD_PRELOAD and options (the
    compiler must not run under LeakSanitizer; the test binaries link their own runtime)."""
    drop = {"LD_PRELOAD", "ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS", "PYTHONMALLOC"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _build(out: Path, main_source: str, *defines: str, sources: list[str] = CODEC_SOURCES) -> Path:
    cmd = [CC, *CFLAGS, *defines, main_source, *sources, "-o", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, env=_clean_env(), capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return out


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**_clean_env(), **SANITIZER_ENV}
    return subprocess.run(cmd, env=env, capture_output=True, timeout=600, **kwargs)


@pytest.fixture(scope="module")
def test_json_bin(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("json") / "test_json", "tests/c/test_json.c")


@pytest.fixture(scope="module")
def fuzz_json_bin(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("fuzz") / "fuzz_json", "tests/fuzz/fuzz_json.c",
                  "-DOI_FUZZ_MAIN")


def test_c_unit_tests(test_json_bin: Path) -> None:
    r = _run([str(test_json_bin)], text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^\d+ passed, 0 failed$", r.stdout, re.M), r.stdout


def test_decimal_text_ignores_a_comma_locale(test_json_bin: Path, tmp_path: Path) -> None:
    """JSON numbers are read and written with '.' while the process runs under de_DE, whose
    decimal point is ','. The locale is compiled here (the `locales` package, installed by
    scripts/setup.sh, carries its source), so the test runs on any machine."""
    localedef = shutil.which("localedef")
    assert localedef and Path("/usr/share/i18n/locales/de_DE").exists(), "apt package locales is missing"
    r = subprocess.run([localedef, "-i", "de_DE", "-f", "UTF-8", str(tmp_path / "de_DE.UTF-8")],
                       capture_output=True, text=True)
    assert r.returncode in (0, 1), r.stderr  # 1: warnings only
    r = subprocess.run([str(test_json_bin), "--locale", "de_DE.UTF-8"], text=True, capture_output=True,
                       env={**_clean_env(), **SANITIZER_ENV, "LOCPATH": str(tmp_path)}, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^[1-9]\d* passed, 0 failed$", r.stdout, re.M), r.stdout


def _valid_bodies() -> list[bytes]:
    def body(inputs, **top):
        return json.dumps({**top, "inputs": inputs}).encode()

    bodies = [
        body([{"name": "INPUT0", "shape": [2, 2], "datatype": "FP32",
               "data": [[1.5, -2e-3], [float("nan"), float("-inf")]]}],
             id="req-\u00e9", parameters={"binary_data_output": False}),
        body([{"name": "a", "shape": [3], "datatype": "INT64",
               "data": [-9223372036854775808, 0, 9223372036854775807]},
              {"name": "b", "shape": [2], "datatype": "BYTES", "data": ["x\ny", "\u2603\U0001F600"]},
              {"name": "c", "shape": [1, 2], "datatype": "BOOL", "data": [[True, False]]}],
             outputs=[{"name": "a", "parameters": {"binary_data": True}}, {"name": "b"}]),
        body([{"data": [1, 2, 3, 4], "datatype": "UINT8", "shape": [4], "name": "late"},
              {"name": "h", "shape": [3], "datatype": "FP16", "data": [65504, 1e-7, -0.0]},
              {"name": "g", "shape": [2], "datatype": "BF16", "data": [0.1, 3.140625]},
              {"name": "d", "shape": [], "datatype": "FP64", "data": 0.1}]),
        # Binary tensor data after the JSON.
        body([{"name": "bin", "shape": [2], "datatype": "INT32",
               "parameters": {"binary_data_size": 8}},
              {"name": "s", "shape": [1], "datatype": "BYTES",
               "parameters": {"binary_data_size": 6}}]) + b"\x01\x00\x00\x00\x02\x00\x00\x00"
        + b"\x02\x00\x00\x00\xff\xfe",
    ]
    return bodies


def _mutations(body: bytes, rng: random.Random) -> list[bytes]:
    out = [body]
    out += [body[:k] for k in sorted(rng.sample(range(len(body)), 8))]
    for _ in range(12):
        b = bytearray(body)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = rng.choice(b'{}[]",:\\0123456789-eE.tfnu \x00\x7f\xff\xc3')
        out.append(bytes(b))
    for _ in range(4):
        k = rng.randrange(len(body))
        out.append(body[:k] + body[k + rng.randint(1, 8):])  # a deleted run
        out.append(body[:k] + body[k:k + 6] + body[k:])      # a repeated run
    return out


def test_fuzz_target_survives_malformed_bodies(fuzz_json_bin: Path, tmp_path: Path) -> None:
    rng = random.Random(20240611)
    cases = [m for b in _valid_bodies() for m in _mutations(b, rng)]
    cases += [
        b"", b"{", b"}", b"[]", b"null", b'{"inputs":[]}', b'{"inputs":[{}]}',
        b'{"inputs":[{"name":"x","shape":[1],"datatype":"INT8","data":[1]}]}trailing',
        b'{"inputs":[{"name":"x","shape":[4611686018427387904],"datatype":"FP64","data":[1]}]}',
        b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":' + b"[" * 5000 + b"1"
        + b"]" * 5000 + b"}]}",
        b'{"a":' + b'{"a":' * 3000 + b"1" + b"}" * 3000 + b"}",
        b'{"inputs":[{"name":"\\ud800","shape":[1]}]}',
    ]
    files = []
    for i, case in enumerate(cases):
        path = tmp_path / f"case{i:03d}.json"
        path.write_bytes(case)
        files.append(str(path))
    assert len(files) >= 36
    r = _run([str(fuzz_json_bin), *files], text=True)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]


def _echo(binary: Path, datatype: str, values: list) -> tuple[str, list]:
    """Sends values through the codec (decode, then encode) and returns the element texts."""
    text = ",".join(values)
    request = ('{"inputs":[{"name":"x","datatype":"%s","shape":[%d],"data":[%s]}]}'
               % (datatype, len(values), text))
    r = _run([str(binary), "--echo"], input=request.encode())
    assert r.returncode == 0, r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")
    out = r.stdout.decode()
    data = re.search(r'"data":\[(.*)\]\}\]\}$', out).group(1)
    return data.split(","), json.loads(out)["outputs"][0]["data"]


def test_fp64_text_is_python_repr(test_json_bin: Path) -> None:
    rng = random.Random(7)
    values = [0.1, 1 / 3, 1e16, 1e15, 123456.789, 1e-5, 1e-4, 5e-324, 1.7976931348623157e308,
              2.0**53, -0.0, 100.0, 0.30000000000000004]
    values += [rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30) for _ in range(2000)]
    values += [float.fromhex("0x1.%013xp%d" % (rng.getrandbits(52), rng.randint(-1074, 1023)))
               for _ in range(2000)]
    texts, parsed = _echo(test_json_bin, "FP64", [repr(v) for v in values])
    assert texts == [repr(v) for v in values]
    assert parsed == values


def test_fp32_and_fp16_text_is_shortest(test_json_bin: Path) -> None:
    np = pytest.importorskip("numpy")

    def digits(text: str) -> int:
        mantissa = text.lstrip("-").split("e")[0].replace(".", "").lstrip("0").rstrip("0")
        return max(len(mantissa), 1)

    rng = np.random.default_rng(11)
    f32 = rng.integers(0, 2**32, 3000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    f16 = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    for dtype, values in (("FP32", f32), ("FP16", f16)):
        values = values[np.isfinite(values)]
        texts, parsed = _echo(test_json_bin, dtype, [repr(float(v)) for v in values])
        back = np.array(parsed, dtype=values.dtype)
        assert np.array_equal(back.view(np.uint16 if dtype == "FP16" else np.uint32),
                              values.view(np.uint16 if dtype == "FP16" else np.uint32))
        longer = [(t, np.format_float_scientific(v, unique=True)) for t, v in zip(texts, values)
                  if digits(t) > digits(np.format_float_scientific(v, unique=True))]
        assert not longer, longer[:10]


def test_integers_of_every_length_round_trip(test_json_bin: Path) -> None:
    """Integer elements of 1 to 20 digits (read eight digits at a time where they fit) come
    back as the same text; one past each type's range is refused."""
    rng = random.Random(5)
    for dtype, lo, hi in (("INT64", -2**63, 2**63 - 1), ("UINT64", 0, 2**64 - 1), ("INT32", -2**31, 2**31 - 1),
                          ("UINT8", 0, 255), ("INT8", -128, 127), ("UINT16", 0, 65535)):
        values = [lo, hi, 0]
        for digits in range(1, 21):
            for _ in range(20):
                v = rng.randrange(10 ** (digits - 1), 10 ** digits) * rng.choice((1, -1))
                if lo <= v <= hi:
                    values.append(v)
        texts, parsed = _echo(test_json_bin, dtype, [str(v) for v in values])
        assert texts == [str(v) for v in values] and parsed == values
        for bad in (lo - 1, hi + 1):
            request = ('{"inputs":[{"name":"x","datatype":"%s","shape":[1],"data":[%d]}]}' % (dtype, bad))
            r = _run([str(test_json_bin), "--echo"], input=request.encode())
            assert r.returncode != 0 and b"out of range" in r.stdout + r.stderr, (dtype, bad, r.stdout)


def test_fractions_of_every_length_parse_like_python(test_json_bin: Path) -> None:
    rng = random.Random(6)
    texts = []
    for int_digits in range(0, 12):
        for frac_digits in range(1, 26):
            ip = str(rng.randrange(10 ** max(int_digits - 1, 0), 10 ** int_digits)) if int_digits else "0"
            fp = "".join(rng.choice("0123456789") for _ in range(frac_digits))
            texts.append(("-" if rng.random() < 0.5 else "") + ip + "." + fp + rng.choice(("", "e-7", "e12", "E+3")))
    _, parsed = _echo(test_json_bin, "FP64", texts)
    assert parsed == [float(t) for t in texts]
