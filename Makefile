# Two entry points: `make demo` and `make test`. Both create .venv on first use.
# The default environment is Python 3.12 (MaxText 0.2.5, the `--maxtext` input, needs >= 3.12; jax
# then resolves to 0.12): `python3.12` on PATH, else a pyenv 3.12. `make PYTHON=...` picks
# another interpreter (>= 3.12 for the MaxText extra).
# (A pyenv shim of python3.12 exists even where 3.12 is not selected, and then fails: every candidate
# is run once.)
PY312_CANDIDATES := python3.12 $(sort $(wildcard $(shell pyenv root 2>/dev/null || echo $(HOME)/.pyenv)/versions/3.12*/bin/python3.12))
ifeq ($(origin PYTHON),undefined)
PYTHON := $(or $(firstword $(foreach c,$(PY312_CANDIDATES),$(shell $(c) -c 'import sys; assert sys.version_info[:2] == (3, 12); print("$(c)")' 2>/dev/null))),python3.12)
endif
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tierax-installed-py312
DEMO_PLANS := save-all,remat-full,minimal,qkv-offload,deepseek-offload

.PHONY: demo test results docs venv clean

# Extras: test tools, MaxText 0.2.5 (its model files and train step as tierax's `--maxtext` input, and its
# own ahead-of-time compile), the deviceless compilers for GPU (CUDA 13 PJRT plugin, ptxas) and TPU (libtpu, a
# 213 MB download, 0.7 GB installed, ~1 min here) so that `make test` runs the XLA:GPU and XLA:TPU compile tests,
# the data extra (tokenizers, sentencepiece, tiktoken, pyarrow) for `tierax data prepare`'s tests, and the docs
# extra (mkdocs, Material, mkdocstrings) so that `make test` builds the documentation strictly too.
venv: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "make: no Python 3.12 found (tried python3.12 on PATH and pyenv's versions/3.12*): install it (e.g. 'pyenv install 3.12') or run 'make PYTHON=/path/to/python3.12'" >&2; exit 2; }
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else "make: $(PYTHON) is Python %d.%d; the default environment needs Python >= 3.12 (MaxText 0.2.5): run make PYTHON=/path/to/python3.12" % sys.version_info[:2])'
	@# A .venv made by another Python (the earlier 3.11 one) is rebuilt, not patched over.
	@if [ -x $(BIN)/python ] && ! $(BIN)/python -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then \
		echo "make: .venv holds Python < 3.12; rebuilding it"; rm -rf $(VENV); fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,gpu-aot,tpu-aot,data,docs,maxtext]'
	touch $(STAMP)

# The demo writes only under runs/demo/ (ignored by git): a fresh clone stays clean.
demo: $(STAMP)
	rm -rf runs/demo
	$(BIN)/tierax bench --model tiny-deepseek --plans $(DEMO_PLANS) --steps 10 --out runs/demo/bench.json
	$(BIN)/tierax report runs/demo/bench.json --out runs/demo/report
	$(BIN)/tierax compile --model tiny-deepseek --plan deepseek-offload --target h200
	$(BIN)/tierax data prepare data/sample.txt --out runs/demo/data && $(BIN)/tierax train configs/demo-train.yaml

# Refresh the recorded demo benchmark and the performance table of README.md and of the docs' demo-result
# page from it (tracked files).
results: $(STAMP)
	$(BIN)/tierax bench --model tiny-deepseek --plans $(DEMO_PLANS) --steps 10 \
		--out bench/results/demo-bench-tiny-deepseek.json
	rm -rf runs/results-report
	$(BIN)/tierax report bench/results/demo-bench-tiny-deepseek.json --out runs/results-report --readme README.md
	rm -rf runs/results-report
	$(BIN)/tierax report bench/results/demo-bench-tiny-deepseek.json --out runs/results-report \
		--readme docs/results/index.md

# The documentation, built strictly (a warning, a broken link or an unknown reference fails) into site/.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# ruff first (rules and line length in pyproject.toml): a lint failure fails the suite.  The MaxText tests
# must run here, not skip (TIERAX_REQUIRE_MAXTEXT: the suite stops at once where MaxText is missing).
# The tests run in TEST_WORKERS processes (pytest-xdist), a test file to a process so that a file's
# shared fixtures are built once; XLA's compiles are mostly single-threaded, so two processes use
# both cores of a 2-core machine.  `make test TEST_WORKERS=0` runs them in this one process.
# XLA:CPU compiles the suite's programs with LLVM's optimisation off (--xla_backend_optimization_level=0):
# the HLO, its schedule and XLA's memory figures are what the default compiles (those passes come before
# LLVM), only the CPU machine code is less optimised; the suite's steps are small, so their compiles,
# not their runs, take the time.  A value the environment's XLA_FLAGS already sets is kept
# (`make test TEST_XLA_FLAGS=` runs the suite without it).
TEST_WORKERS ?= 2
TEST_XLA_FLAGS := $(if $(findstring xla_backend_optimization_level,$(XLA_FLAGS)),,--xla_backend_optimization_level=0)
test: $(STAMP)
	$(BIN)/ruff check src tests bench examples docs
	XLA_FLAGS="$(TEST_XLA_FLAGS) $(XLA_FLAGS)" TIERAX_REQUIRE_MAXTEXT=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
