# `make run` and `make test` are all a fresh machine needs: both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test typecheck pytest wheel-check coverage mutation hunt bench prove prove-deep docs engines test-engines test-engine-vllm test-engine-sglang bench-engines clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev,paddle,ray]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/kvoracle check

test: typecheck pytest wheel-check

typecheck: $(STAMP)
	$(BIN)/mypy kvoracle tests bench docs/examples

# One pytest process per test file, as many at once as there are cores (tests/parallel.py;
# JOBS=1 for one at a time, or `$(BIN)/pytest` for a single process).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
pytest: $(STAMP)
	$(BIN)/python tests/parallel.py --jobs $(JOBS)

# The wheel as users install it: non-editable, in a fresh venv next to PyPI's `scheduler`,
# run from outside the tree (kvoracle check, a quick prove, an engine-style test file).
wheel-check: $(STAMP)
	.ci/wheel_check

# The branches of kvcache/ and scheduler/ that make run's reference rows never take.
coverage: $(STAMP)
	$(BIN)/kvoracle check --coverage-report out/coverage.txt
	cat out/coverage.txt

# mutmut over kvcache/ and scheduler/ (MUTATE="kvcache/lru.py" for one file); survivors: docs/mutation.md.
mutation: $(STAMP)
	.ci/mutation

# The known-bugs benchmark: real bugs of released engines, each caught, each fix passing.
hunt: $(STAMP)
	$(BIN)/kvoracle hunt

# Every speed figure in one table (the engines where their environments exist).
bench: $(STAMP)
	$(BIN)/python bench/summary.py

prove: $(STAMP)
	$(BIN)/kvoracle prove

# The larger scope: 8 GPU, 3 CPU blocks, 4 requests; its searches compiled by mypyc, on 2 partitions
# (the deep search alone: 2 min 36 s on 2 cores, 2026-12-04; needs a C compiler).
prove-deep: $(STAMP)
	$(BIN)/kvoracle prove --deep --compiled --partitions 2

docs: $(STAMP)
	PYTHONHASHSEED=0 $(BIN)/python -m kvoracle.oracle.mutant_docs

# Engine environments: torch 2.13.0+cpu (the CPU wheel: on disk here; elsewhere add PyTorch's
# CPU index, PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu; the constraint keeps CUDA wheels out),
# the engine with --no-deps, exactly the pins in engines/<engine>.txt, and kvoracle itself.
ENGINE_PIN_vllm := vllm==0.34.0
ENGINE_PIN_sglang := sglang==0.5.23
ENGINE_PIP = .venv-$*/bin/pip install -q --disable-pip-version-check -c engines/torch.txt
SOURCES := $(shell find kvoracle/ spec/ kvcache/ scheduler/ oracle/ proofs/ -name '*.py') pyproject.toml
WHEEL := out/dist/.built

# kvoracle goes into the engine environments as users install it: the wheel, not -e.
$(WHEEL): $(SOURCES) $(STAMP)
	rm -rf out/dist && $(BIN)/pip wheel -q --disable-pip-version-check --no-deps -w out/dist .
	touch $@

.venv-%/.installed: engines/%.txt engines/torch.txt
	rm -rf .venv-$*
	$(PYTHON) -m venv .venv-$*
	$(ENGINE_PIP) torch==2.13.0+cpu
	$(ENGINE_PIP) --no-deps $(ENGINE_PIN_$*)
	$(ENGINE_PIP) --no-deps -r engines/$*.txt
	touch $@

.venv-%/.kvoracle: .venv-%/.installed $(WHEEL)
	$(ENGINE_PIP) --no-deps --force-reinstall out/dist/kvoracle-*.whl
	touch $@

# the stamps are intermediate files of a pattern chain: without this make deletes them
.PRECIOUS: .venv-%/.installed .venv-%/.kvoracle

engines: .venv-vllm/.kvoracle .venv-sglang/.kvoracle

# Each engine's campaigns and its findings' reproductions, in its own environment; then one
# campaign of each deep adapter under storage faults, which prints how its transfers ended
# (vLLM's known finding: a store that never answers keeps its blocks, LIVE-TRANSFER).
DEEP_CHECK = check --seeds 3 --examples 150
# The two engines are independent: `make -j2 -Otarget test-engines` runs them side by side.
test-engines: test-engine-vllm test-engine-sglang

test-engine-vllm: .venv-vllm/.kvoracle
	.venv-vllm/bin/pytest -q tests/test_engine_vllm.py tests/test_engine_vllm_connector.py tests/test_shadow_vllm.py tests/test_shadow_vllm_deadlock.py tests/test_shadow_docs.py
	.venv-vllm/bin/kvoracle $(DEEP_CHECK) --adapter kvoracle.oracle.engines.vllm_connector:VllmConnector --expect LIVE-TRANSFER

test-engine-sglang: .venv-sglang/.kvoracle
	.venv-sglang/bin/pytest -q tests/test_engine_sglang.py tests/test_engine_sglang_hicache.py tests/test_shadow_sglang.py
	.venv-sglang/bin/kvoracle $(DEEP_CHECK) --adapter kvoracle.oracle.engines.sglang_hicache:SglangHiCache

# One table: the reference here, each engine in its environment (bench/engine_speed.py runs them).
bench-engines: engines $(STAMP)
	$(BIN)/python bench/engine_speed.py

clean:
	rm -rf .venv-vllm .venv-sglang
	rm -rf $(VENV) out .hypothesis .mypy_cache .pytest_cache *.egg-info
