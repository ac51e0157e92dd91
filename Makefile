# `make run` and `make test` are all a fresh machine needs: both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test typecheck pytest bench prove prove-deep docs clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev,paddle]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/kvoracle check

test: typecheck pytest

typecheck: $(STAMP)
	$(BIN)/mypy spec kvcache scheduler oracle proofs tests bench

pytest: $(STAMP)
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/workload.py

prove: $(STAMP)
	$(BIN)/kvoracle prove

# The larger scope: 8 GPU, 3 CPU blocks, 4 requests (about 12 minutes on 2 cores).
prove-deep: $(STAMP)
	$(BIN)/kvoracle prove --deep

docs: $(STAMP)
	PYTHONHASHSEED=0 $(BIN)/python -m oracle.mutant_docs

clean:
	rm -rf $(VENV) .hypothesis .mypy_cache .pytest_cache *.egg-info
