# llmbook: `make book` builds the book, `make test` checks it. Both set up .venv first.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.py))
export PYTHONHASHSEED := 0
# tqdm.auto (imported by transformers) warns inside Jupyter when ipywidgets is absent;
# the text fallback is what the book wants, and the warning would print a local path.
export PYTHONWARNINGS := ignore:IProgress not found

.PHONY: setup book lab test lint check-notebooks unit nbval sync bench clean

## setup: create .venv (idempotent): torch==2.13.0 first, then llmbook with its dev extras
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

## book: execute every notebook (copies under build/book) and render them to HTML
book: setup
	$(PY) tools/build_book.py

## lab: open the book in JupyterLab
lab: setup
	$(VENV)/bin/jupyter lab notebooks/

## test: lint, notebook-pair checks, unit tests, strict nbval over every notebook
test: setup lint check-notebooks unit nbval

lint: setup
	$(VENV)/bin/ruff check llmbook tests benchmarks tools notebooks data

check-notebooks: setup
	$(PY) tools/check_notebooks.py

unit: setup
	$(PY) -m pytest tests -q -n 2

nbval: setup
	$(PY) -m pytest -q -n 2 --dist loadfile --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg \
		--nbval-current-env notebooks/[0-9][0-9]_*.ipynb

## sync: pair every notebooks/*.py with its .ipynb and re-execute it in place (the committed outputs)
sync: setup
	$(PY) tools/sync_notebooks.py $(NB)

## bench: run the benchmarks; results go to benchmarks/results/*.json
bench: setup
	@for f in benchmarks/[a-z]*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf build .pytest_cache .ruff_cache
