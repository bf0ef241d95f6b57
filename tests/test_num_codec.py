"""The JSON codec's number module (csrc/codec/num.c), through tests/c/test_num.c: shortest
round-trip printing of FP16 (every value), BF16 (every value), FP32 and FP64 (large random
samples and bit-pattern edge cases) against numpy's and Python's shortest repr, and parsing
of random decimal text against Python's float() and exact rational rounding. The exhaustive
FP32 round trip is `make test-floats-exhaustive`."""

from __future__ import annotations

import random
import re
import struct
from fractions import Fraction
from pathlib import Path

import pytest

from test_json_codec import CC, _build, _run

np = pytest.importorskip("numpy")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) on PATH")

NUM_SOURCES = ["csrc/codec/num.c"]


@pytest.fixture(scope="module")
def num_bin(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("num") / "test_num", "tests/c/test_num.c", "-D_GNU_SOURCE",
                  "-pthread", sources=NUM_SOURCES)


def _lines(binary: Path, mode: str, lines: list[str]) -> list[str]:
    r = _run([str(binary), mode], input="".join(x + "\n" for x in lines), text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.splitlines()
    assert len(out) == len(lines)
    return out


def _print(binary: Path, kind: str, bits) -> list[str]:
    return _lines(binary, "--print", [f"{kind} {int(b):x}" for b in bits])


def _parse(binary: Path, kind: str, texts: list[str], paths: list | None = None) -> list[int]:
    """The encodings the decoder stores; `paths` (when given) gets (fast, total): how many took
    the Eisel-Lemire path."""
    r = _run([str(binary), "--parse"], input="".join(f"{kind} {t}\n" for t in texts), text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    if paths is not None:
        m = re.search(r"fast path: (\d+) of (\d+)", r.stderr)
        paths.append((int(m.group(1)), int(m.group(2))))
    return [int(x, 16) for x in r.stdout.splitlines()]


def repr_layout(sci: str) -> str:
    """numpy's shortest scientific text ("-1.25e+03") laid out like Python's repr."""
    neg = sci.startswith("-")
    mant, ex = sci.lstrip("-").split("e")
    ex = int(ex)
    digits = mant.replace(".", "").rstrip("0") or "0"
    n = len(digits)
    if ex < -4 or ex >= 16:
        s = digits[0] + ("." + digits[1:] if n > 1 else "") + "e" + ("-" if ex < 0 else "+") + "%02d" % abs(ex)
    elif ex < 0:
        s = "0." + "0" * (-ex - 1) + digits
    elif ex >= n - 1:
        s = digits + "0" * (ex - n + 1) + ".0"
    else:
        s = digits[:ex + 1] + "." + digits[ex + 1:]
    return ("-" if neg else "") + s


def numpy_text(v) -> str:
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "-Infinity" if v < 0 else "Infinity"
    if v == 0:
        return "-0.0" if np.signbit(v) else "0.0"
    return repr_layout(np.format_float_scientific(v, unique=True))


def test_every_fp16_is_numpy_shortest_and_reads_back(num_bin: Path) -> None:
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    values = bits.view(np.float16)
    texts = _print(num_bin, "h", bits)
    want = [numpy_text(v) for v in values]
    wrong = [(hex(b), t, w) for b, t, w in zip(bits, texts, want) if t != w]
    assert not wrong, wrong[:10]
    finite = np.isfinite(values)
    back = _parse(num_bin, "h", [t for t, f in zip(texts, finite) if f])
    assert back == [int(b) for b in bits[finite]]
    # What a client reads: numpy's float16 of Python's float of the text.
    assert np.array_equal(np.array([float(t) for t, f in zip(texts, finite) if f]).astype(np.float16).view(np.uint16),
                          bits[finite])


def _bf16_fraction(b: int) -> Fraction:
    return Fraction(struct.unpack("<f", struct.pack("<I", b << 16))[0])


def _bf16_interval(b: int) -> tuple[Fraction, Fraction, bool]:
    """The decimals that read back to positive finite BF16 b: (low, high, closed)."""
    v = _bf16_fraction(b)
    up = _bf16_fraction(b + 1) if b + 1 < 0x7F80 else v + (v - _bf16_fraction(b - 1))
    down = _bf16_fraction(b - 1) if b > 0 else -_bf16_fraction(1)
    return (v + down) / 2, (v + up) / 2, b % 2 == 0


def _digits(text: str) -> tuple[int, int]:
    """(significant digits, decimal exponent of the last one) of a positive decimal text."""
    d = Fraction(text)
    s = text.split("e")[0].replace(".", "").lstrip("0").rstrip("0")
    n = len(s)
    k = 0
    while d.denominator != 1 or d.numerator % 10 == 0:
        if d.denominator != 1:
            d *= 10
            k -= 1
        else:
            d /= 10
            k += 1
    return n, k


def test_every_bf16_is_shortest_closest_and_reads_back(num_bin: Path) -> None:
    bits = list(range(0x10000))
    texts = _print(num_bin, "b", bits)
    finite = [b for b in bits if (b & 0x7FFF) < 0x7F80]
    back = _parse(num_bin, "b", [texts[b] for b in finite])
    assert back == finite
    assert texts[0x7FC0] == "NaN" and texts[0x7F80] == "Infinity" and texts[0xFF80] == "-Infinity"
    assert texts[0] == "0.0" and texts[0x8000] == "-0.0"
    problems = []
    for b in range(1, 0x7F80):
        t = texts[b]
        assert texts[b | 0x8000] == "-" + t
        lo, hi, closed = _bf16_interval(b)
        v = _bf16_fraction(b)
        n, k = _digits(t)
        # Shortest: no decimal with n - 1 significant digits lies in the interval. Those
        # nearest v are the multiples of 10^(k+1) around it (and of 10^k one decade down).
        for step in (Fraction(10) ** (k + 1),) if n > 1 else ():
            below = (v // step) * step
            for c in (below, below + step):
                if c > 0 and (lo < c < hi or (closed and c in (lo, hi))):
                    problems.append((hex(b), t, "shorter", c))
        # Closest among the n-digit ones: the neighbours one unit of 10^k away are not closer.
        d = Fraction(t)
        for c in (d - Fraction(10) ** k, d + Fraction(10) ** k):
            if (lo < c < hi or (closed and c in (lo, hi))) and abs(c - v) < abs(d - v):
                problems.append((hex(b), t, "closer", c))
    assert not problems, problems[:10]


def _fp32_edge_bits() -> list[int]:
    out = list(range(0, 2000)) + [0x7F7FFFFF, 0x7F7FFFFE, 0x00800000, 0x00800001, 0x007FFFFF, 0x7F800000,
                                  0x7FC00000, 0x3F800000, 0x3DCCCCCD, 0x4B800000, 0x4B7FFFFF, 0x5A0E1BCA]
    for e in range(1, 255):  # every power of two and its neighbours
        for m in (0, 1, 2, 0x7FFFFF, 0x7FFFFE, 0x400000):
            out.append((e << 23) | m)
    return out + [b | 0x80000000 for b in out]


def test_fp32_sample_is_numpy_shortest_and_reads_back(num_bin: Path) -> None:
    rng = np.random.default_rng(20261123)
    bits = np.concatenate([rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32),
                           np.array(_fp32_edge_bits(), dtype=np.uint32),
                           rng.standard_normal(50_000).astype(np.float32).view(np.uint32),
                           rng.integers(-10**6, 10**6, 20_000).astype(np.float32).view(np.uint32)])
    values = bits.view(np.float32)
    texts = _print(num_bin, "f", bits)
    wrong = [(hex(b), t, numpy_text(v)) for b, t, v in zip(bits, texts, values) if t != numpy_text(v)]
    assert not wrong, wrong[:10]
    finite = np.isfinite(values)
    back = _parse(num_bin, "f", [t for t, f in zip(texts, finite) if f])
    assert back == [int(b) for b in bits[finite]]


def _f64(b: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", b))[0]


def _f64_bits(v: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", v))[0]


def test_fp64_sample_is_python_repr_and_reads_back(num_bin: Path) -> None:
    rng = random.Random(20261123)
    bits = [rng.getrandbits(64) for _ in range(150_000)]
    bits += list(range(0, 1000)) + [0x7FEFFFFFFFFFFFFF, 0x0010000000000000, 0x000FFFFFFFFFFFFF,
                                    0x3FF0000000000000, 0x4340000000000000, 0x433FFFFFFFFFFFFF]
    bits += [(e << 52) | m for e in range(1, 2047) for m in (0, 1, 0xFFFFFFFFFFFFF)]
    bits += [_f64_bits(rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30)) for _ in range(20_000)]
    bits += [_f64_bits(float(rng.randint(-2**53, 2**53))) for _ in range(5_000)]
    bits += [b | (1 << 63) for b in bits[-3000:]]
    texts = _print(num_bin, "d", bits)

    def want(v: float) -> str:
        if v != v:
            return "NaN"
        if v in (float("inf"), float("-inf")):
            return "Infinity" if v > 0 else "-Infinity"
        return repr(v)

    wrong = [(hex(b), t, want(_f64(b))) for b, t in zip(bits, texts) if t != want(_f64(b))]
    assert not wrong, wrong[:10]
    finite = [(b, t) for b, t in zip(bits, texts) if (b >> 52) & 0x7FF != 0x7FF]
    assert _parse(num_bin, "d", [t for _, t in finite]) == [b for b, _ in finite]


def _random_decimal(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.15:  # halfway between two doubles, or just off it, written out exactly
        b = rng.getrandbits(62)
        lo, hi = Fraction(_f64(b)), Fraction(_f64(b + 1))
        mid = (lo + hi) / 2
        mid += rng.choice((0, 0, Fraction(1, 10**400), -Fraction(1, 10**400)))
        sign = ""
        d = mid
        exp = 0
        while d.denominator != 1:
            d *= 10
            exp -= 1
        digits = str(d.numerator) if d.denominator == 1 else str(int(d))
        return f"{sign}{digits}e{exp}"
    if kind < 0.25:  # halfway between two floats
        b = rng.getrandbits(31) % 0x7F7FFFFF
        lo = Fraction(struct.unpack("<f", struct.pack("<I", b))[0])
        hi = Fraction(struct.unpack("<f", struct.pack("<I", b + 1))[0])
        mid = (lo + hi) / 2
        k = 0
        while mid.denominator != 1:
            mid *= 10
            k -= 1
        return f"{mid.numerator}e{k}"
    n = rng.randint(1, 25)
    digits = "".join(rng.choice("0123456789") for _ in range(n)).lstrip("0") or "0"
    point = rng.randint(0, len(digits))
    text = digits[:point] + ("." + digits[point:] if point < len(digits) else "")
    if text.startswith("."):
        text = "0" + text
    exp = rng.choice((0, rng.randint(-30, 30), rng.randint(-360, 330)))
    return ("-" if rng.random() < 0.3 else "") + text + (f"e{exp}" if exp else "")


def _fraction_to_f32_bits(x: Fraction) -> int:
    """Correctly rounded binary32 of x (ties to even), from the exact rational."""
    sign = 0x80000000 if x < 0 else 0
    x = abs(x)
    if x == 0:
        return sign
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    e = max(e, -126)  # subnormals share the smallest exponent
    scaled = x / Fraction(2) ** (e - 23)  # the significand in units of the last place
    m = int(scaled)
    rest = scaled - m
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and m % 2 == 1):
        m += 1
    if m >= 1 << 24:
        m >>= 1
        e += 1
    if e > 127:
        return sign | 0x7F800000
    if m < 1 << 23:
        return sign | m
    return sign | ((e + 127) << 23) | (m - (1 << 23))


def test_parse_random_decimals(num_bin: Path) -> None:
    rng = random.Random(1123)
    texts = [_random_decimal(rng) for _ in range(30_000)]
    texts += ["0", "-0", "1e400", "-1e400", "1e-400", "4.9406564584124654e-324", "2.4703282292062327e-324",
              "2.4703282292062328e-324", "1.7976931348623158e308", "1.7976931348623159e308",
              "9007199254740993", "123456789012345678901234567890", "0.1", "3.4028235677973366e38",
              "3.4028235677973367e38", "1.401298464324817e-45", "7.006492321624085e-46", "7.006492321624086e-46"]
    paths: list = []
    got = _parse(num_bin, "d", texts, paths)
    want = [_f64_bits(float(t)) for t in texts]
    wrong = [(t, hex(g), hex(w)) for t, g, w in zip(texts, got, want) if g != w]
    assert not wrong, wrong[:10]
    got = _parse(num_bin, "f", texts, paths)
    want = [_fraction_to_f32_bits(Fraction(t)) | (0x80000000 if t.startswith("-") else 0) for t in texts]
    wrong = [(t, hex(g), hex(w)) for t, g, w in zip(texts, got, want) if g != w]
    assert not wrong, wrong[:10]
    # FP16 and BF16 go through the nearest double, as numpy.float16(float(text)) does.
    got = _parse(num_bin, "h", texts)
    with np.errstate(over="ignore"):
        want = np.array([float(t) for t in texts]).astype(np.float16).view(np.uint16)
    wrong = [(t, hex(g), hex(w)) for t, g, w in zip(texts, got, want) if g != w]
    assert not wrong, wrong[:10]
    # Both paths were taken: the halfway cases need the exact one, the rest mostly not.
    for fast, total in paths:
        assert total // 2 < fast < total, paths


def test_pow5_table_is_what_the_script_generates() -> None:
    """csrc/codec/pow5_table.h is reproducible: the generator (which also checks num.c's
    log estimates exactly) writes it byte for byte."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "scripts" / "gen_pow5_table.py")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (root / "csrc" / "codec" / "pow5_table.h").read_text()
