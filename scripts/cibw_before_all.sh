#!/usr/bin/env bash
# cibuildwheel's before-all (pyproject.toml [tool.cibuildwheel]): what building openinfer
# needs inside a manylinux_2_28 container (AlmaLinux 8) or on a macOS runner: pkg-config,
# the libuv, nghttp2, protobuf-c, zlib and OpenSSL headers, protoc-c, and llhttp's C sources in
# LLHTTP_DIR (src/ and include/ of an llhttp release: OI_LLHTTP_SRC and OI_LLHTTP_INCLUDE).
# Configured, never run by make or the tests.
set -euo pipefail
LLHTTP_DIR=${1:?usage: cibw_before_all.sh LLHTTP_DIR}
LLHTTP_VERSION=8.1.0   # Debian 12's node-llhttp, which `make wheel` builds with

if command -v dnf >/dev/null; then
  dnf install -y epel-release
  dnf config-manager --set-enabled powertools   # libuv-devel and protobuf-c-compiler
  dnf install -y pkgconf-pkg-config zlib-devel openssl-devel libuv-devel libnghttp2-devel protobuf-c-devel protobuf-c-compiler
elif command -v brew >/dev/null; then
  brew install pkg-config libuv libnghttp2 openssl@3 protobuf-c   # openssl@3 is keg-only: see
  # pyproject.toml's macOS PKG_CONFIG_PATH
else
  echo "cibw_before_all: neither dnf nor brew found" >&2
  exit 1
fi
mkdir -p "$LLHTTP_DIR"
curl -fsSL "https://github.com/nodejs/llhttp/archive/refs/tags/release/v${LLHTTP_VERSION}.tar.gz" \
  | tar -xz --strip-components=1 -C "$LLHTTP_DIR"
test -f "$LLHTTP_DIR/src/llhttp.c" && test -f "$LLHTTP_DIR/include/llhttp.h"
