# Two entry points for a newcomer: `make demo` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip -q --disable-pip-version-check

.PHONY: demo test lint typecheck unit bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# Stamps re-run the install when pyproject.toml changes.
$(VENV)/.local-installed: pyproject.toml | $(PY)
	$(PIP) install -e '.[local]'
	touch $@

$(VENV)/.dev-installed: pyproject.toml | $(PY)
	$(PIP) install -e '.[dev,local]'
	touch $@ $(VENV)/.local-installed

demo: $(VENV)/.local-installed
	$(PY) examples/live_local/run.py

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check src tests benchmarks examples

typecheck: $(VENV)/.dev-installed
	$(VENV)/bin/mypy

unit: $(VENV)/.dev-installed
	$(VENV)/bin/pytest -q

test: lint typecheck unit

bench: $(VENV)/.dev-installed
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
