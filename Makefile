# Two entry points for a newcomer: `make demo` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip -q --disable-pip-version-check

.PHONY: demo demo-llm-kit test lint typecheck unit docs docs-serve bench clean

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
	touch $@ $(VENV)/.local-installed $(VENV)/.docs-installed

# The site alone needs no model: MkDocs, Material and mkdocstrings (the docs extra).
$(VENV)/.docs-installed: pyproject.toml | $(PY)
	$(PIP) install -e ".[docs]"
	touch $@

# The main job: the YAML pipeline quickstart on the embedded CPU model (no key, no GPU).
demo: $(VENV)/.local-installed
	$(VENV)/bin/mmirage run examples/quickstart/config.yaml
	$(PY) examples/quickstart/show.py

# The llm_kit live pipeline on its own, over a dozen prompts.
demo-llm-kit: $(VENV)/.local-installed
	$(PY) examples/live_local/run.py

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check src tests benchmarks examples docs/_hooks

typecheck: $(VENV)/.dev-installed
	$(VENV)/bin/mypy

unit: $(VENV)/.dev-installed
	$(VENV)/bin/pytest -q

# The site, built strictly into site/: a warning, a broken link or an undocumented field fails.
# (Material's banner about its successor is not a warning about our docs.)
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs-serve: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

test: lint typecheck unit docs

bench: $(VENV)/.dev-installed
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) site .mypy_cache .ruff_cache .pytest_cache
