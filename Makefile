# Two entry points for a newcomer: `make demo` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip -q --disable-pip-version-check

.PHONY: demo demo-llm-kit test lint typecheck unit bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# Stamps re-run the install when pyproject.toml changes. llama-cpp-python is installed by
# scripts/install-local.sh, which builds it portably and checks that it runs on this CPU.
$(VENV)/.local-installed: pyproject.toml scripts/install-local.sh | $(PY)
	scripts/install-local.sh $(PY) local
	touch $@

$(VENV)/.dev-installed: pyproject.toml scripts/install-local.sh | $(PY)
	scripts/install-local.sh $(PY) dev,local
	touch $@ $(VENV)/.local-installed

# The main job: the YAML pipeline quickstart on the embedded CPU model (no key, no GPU).
demo: $(VENV)/.local-installed
	$(VENV)/bin/mmirage run examples/quickstart/config.yaml
	$(PY) examples/quickstart/show.py

# The llm_kit live pipeline on its own, over a dozen prompts.
demo-llm-kit: $(VENV)/.local-installed
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
