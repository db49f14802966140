# dk: two set-up commands on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test bench lint vectors clean pg aot

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch is pinned and installed first so that no looser range pulls a CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# dk's CPU kernels compiled ahead of time (one-thread steps start without importing Numba:
# dk.pol.exact.aot). Checked every time (0.1 s) and rebuilt when the module is missing, older
# than a kernel's source or built on another CPU; without it dk uses the JIT kernels.
aot: $(STAMP)
	@$(BIN)/python -m dk.pol.exact.aot check >/dev/null || $(BIN)/python -m dk.pol.exact.aot build

demo: aot
	$(BIN)/python -m dk.demo

# PostgreSQL 15 for the market's PostgreSQL tests: on the machine image already; else Debian's.
pg:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null \
	  || (apt-get update -q && apt-get install -y -q postgresql) \
	  || echo "make: PostgreSQL not installed; its tests will be skipped"

test: lint pg aot
	NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadgroup -q

bench: aot
	$(BIN)/python -m bench

# ruff, then mypy as configured in pyproject.toml ([tool.mypy]: strict for crypto, pol, verifier).
lint: $(STAMP)
	$(BIN)/ruff check src tests bench vectors
	$(BIN)/ruff format --check src tests bench vectors
	$(BIN)/mypy

vectors: $(STAMP)
	$(BIN)/python -m vectors.gen
	$(BIN)/dk vectors check vectors

clean:
	rm -rf $(VENV) build dist *.egg-info src/*.egg-info
