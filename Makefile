# Two entry points: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tierax-installed
DEMO_PLANS := save-all,remat-full,minimal,qkv-offload,deepseek-offload

.PHONY: demo test results docs venv clean

# Extras: test tools, the deviceless compilers for GPU (CUDA 13 PJRT plugin, ptxas) and TPU (libtpu, a
# 213 MB download, 0.7 GB installed, ~1 min here) so that `make test` runs the XLA:GPU and XLA:TPU compile tests,
# the data extra (tokenizers, sentencepiece, tiktoken, pyarrow) for `tierax data prepare`'s tests, and the docs
# extra (mkdocs, Material, mkdocstrings) so that `make test` builds the documentation strictly too.
venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "tierax needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,gpu-aot,tpu-aot,data,docs]'
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

# ruff first (rules and line length in pyproject.toml): a lint failure fails the suite.
test: $(STAMP)
	$(BIN)/ruff check src tests bench examples docs
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
