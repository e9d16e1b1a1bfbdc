# Two entry points for a newcomer: `make demo` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip -q --disable-pip-version-check

.PHONY: demo demo-llm-kit test test-slow lint typecheck unit docs docs-serve bench test-engines test-ray dist clean

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

# The suite runs in parallel (pytest-xdist). Most tests wait on subprocesses, HTTP and SLURM rather
# than compute, so a few more workers than cores pays; work stealing evens out the long tests.
# The long end-to-end cases (marked slow) run in `make test-slow`, which CI runs too.
TEST_WORKERS ?= 4
PYTEST := $(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist worksteal

unit: $(VENV)/.dev-installed
	$(PYTEST) -m "not slow"

test-slow: $(VENV)/.dev-installed
	$(PYTEST) -m slow

# The site, built strictly into site/: a warning, a broken link or an undocumented field fails.
# (Material's banner about its successor is not a warning about our docs.)
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs-serve: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

test: lint typecheck unit docs

bench: $(VENV)/.dev-installed
	$(PY) benchmarks/run_all.py

# mmirage against real engines here (not part of `make test`): vLLM's CPU build in its own venv
# under ~/.cache/mmirage-engines (installed once: 3.5 GB) started by the launcher, and llama.cpp's
# llama-server (built once); prints a table of rows valid, dialect and seconds per server.
test-engines: $(VENV)/.dev-installed
	scripts/test-engines.sh $(PY)

# mode: ray against a real two-node Ray cluster (not part of `make test`: a cluster per test, in
# a loopback-only network namespace, as root); CI runs it after `make test`.
$(VENV)/.ray-installed: pyproject.toml | $(VENV)/.dev-installed
	$(PIP) install -c scripts/dev-constraints.txt -e ".[ray]"
	touch $@

test-ray: $(VENV)/.ray-installed
	MMIRAGE_RAY_TESTS=1 $(VENV)/bin/pytest -q -m ray tests/test_ray_mode.py tests/test_ray_object_storage.py

# A wheel of this project, dist/mmirage-<version>-py3-none-any.whl, stamped with the commit it
# was built from (mmirage --version says it): `pip install 'dist/mmirage-0.1.0-py3-none-any.whl[local]'`
# installs it anywhere (never `pip install mmirage`: on PyPI that name is another project).
dist: | $(PY)
	rm -rf build
	git describe --always --dirty=+changes --abbrev=12 > src/mmirage/BUILD_COMMIT 2>/dev/null \
		|| rm -f src/mmirage/BUILD_COMMIT
	$(PIP) wheel --no-deps -w dist . ; status=$$?; rm -f src/mmirage/BUILD_COMMIT; exit $$status

clean:
	rm -rf $(VENV) site build dist .mypy_cache .ruff_cache .pytest_cache
