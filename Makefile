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

.PHONY: setup setup-serve build serve test test-plain test-asan wheel bench clean

setup:
	@scripts/setup.sh test

setup-serve:
	@scripts/setup.sh serve

# The extension, in place, with warnings as errors; rebuilt when a C source changes.
$(EXT): $(CSRC) $(wildcard proto/*.proto) setup.py python/openinfer/__init__.py
	OI_WERROR=1 $(PY) setup.py -q build_ext --inplace --force

build: setup $(EXT)

serve: setup-serve $(EXT)
	$(PY) -m openinfer serve $(REPO)

test: build test-plain test-asan

test-plain:
	rm -rf $(TEST_CACHE)/plain
	OPENINFER_CACHE_DIR=$(TEST_CACHE)/plain $(PY) -m pytest -q $(PYTEST_ARGS)

# The same suite against an AddressSanitizer + UndefinedBehaviorSanitizer build of the
# extension, loaded from a copy of the package in $(ASAN_DIR). LeakSanitizer checks at exit
# (CPython's own allocations are suppressed); --capture=sys lets a report reach the log.
test-asan: setup
	OI_WERROR=1 OI_SANITIZE=1 $(PY) setup.py -q build_ext --build-lib $(ASAN_DIR)/lib --build-temp $(ASAN_DIR)/tmp
	rm -rf $(ASAN_DIR)/pkg && mkdir -p $(ASAN_DIR)/pkg/openinfer
	cp python/openinfer/*.py python/openinfer/py.typed $(ASAN_DIR)/pkg/openinfer/
	cp $(ASAN_DIR)/lib/openinfer/_core*.so $(ASAN_DIR)/pkg/openinfer/
	mkdir -p $(ASAN_DIR)/pkg/openinfer/examples && cp -r examples/models $(ASAN_DIR)/pkg/openinfer/examples/
	mkdir -p $(ASAN_DIR)/pkg/openinfer/_csrc && cd csrc && cp --parents $(TORCH_SHIM_SRC) $(CURDIR)/$(ASAN_DIR)/pkg/openinfer/_csrc/
	# The libtorch shim beside the extension, as in the plain package (it is not sanitized:
	# the same keyed build serves both); compiled here when the plain build has none.
	cp -f python/openinfer/libopeninfer_torch-*.so $(ASAN_DIR)/pkg/openinfer/ 2>/dev/null || true
	OI_WERROR=1 $(PY) -m openinfer._torch_build $(ASAN_DIR)/pkg/openinfer
	rm -rf $(TEST_CACHE)/asan
	OPENINFER_CACHE_DIR=$(TEST_CACHE)/asan OI_PACKAGE_DIR=$(ASAN_DIR)/pkg PYTHONPATH=$(ASAN_DIR)/pkg \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	PYTHONMALLOC=malloc LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizers/lsan.supp:print_suppressions=0 \
	ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	$(PY) -m pytest -q -p no:cacheprovider --capture=sys $(PYTEST_ARGS)

# Self-contained manylinux wheels for every CPython 3.10+ found here, and the sdist, in
# dist/ (scripts/build_wheels.py says how; WHEEL_ARGS="--python EXE" picks interpreters).
wheel: setup
	$(PY) scripts/build_wheels.py $(WHEEL_ARGS)

bench: build
	$(PY) benchmarks/run.py $(BENCH_ARGS)

clean:
	rm -rf build dist $(ASAN_DIR) python/openinfer/_core*.so python/openinfer/libopeninfer_torch-*.so
