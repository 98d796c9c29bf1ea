# Two commands for a fresh machine (see README.md):
#   make run    the lab's main job: the default scenario, end to end
#   make test   ruff, mypy and the whole pytest suite
# Both create .venv on first use (Python 3.12, pinned by constraints.txt).

PYTHON_BOOT ?= $(shell command -v python3.12 2>/dev/null || echo $$HOME/.pyenv/versions/3.12.1/bin/python3.12)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SCENARIO ?= smoke
IS_312 := import sys; sys.exit(sys.version_info[:2] != (3, 12))

.PHONY: run test lint types pytest venv clean-venv bytecode

# A .venv whose Python is not 3.12, or no longer runs (its base interpreter was removed),
# is rebuilt, whatever its stamp says: checked on every make, before anything uses it.
ifneq ($(shell $(PY) -c '$(IS_312)' >/dev/null 2>&1 && echo ok),ok)
$(shell rm -f $(STAMP))
endif

$(STAMP): pyproject.toml setup.py constraints.txt
	@$(PYTHON_BOOT) -c '$(IS_312)' >/dev/null 2>&1 || { \
	  echo "make: .venv needs Python 3.12, and '$(PYTHON_BOOT)' is not one that runs."; \
	  echo "      Install it (pyenv install 3.12) or name it: make PYTHON_BOOT=/path/to/python3.12"; \
	  exit 3; }
	@if ! $(PY) -c '$(IS_312)' >/dev/null 2>&1; then \
	  if [ -e $(VENV) ]; then echo "make: .venv was built by another Python or is broken: rebuilding it"; fi; \
	  rm -rf $(VENV) && $(PYTHON_BOOT) -m venv $(VENV); fi
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# Every part of a run is a Python process of its own (lab run, mitmdump with the addon,
# the nemesis, the Locust master and workers, lab report): compiled once here, they start
# without compiling the lab's modules again each time, also where PYTHONDONTWRITEBYTECODE
# is set (about 0.7 s of a short run; stale files are recompiled, by their mtime).
bytecode: $(STAMP)
	@$(PY) -m compileall -q -j 0 lab addons >/dev/null

run: bytecode
	$(VENV)/bin/lab run $(SCENARIO)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

types: $(STAMP)
	$(VENV)/bin/mypy

# Four test processes on two cores: the live tests mostly wait on the processes they start.
# One test at a time to each worker (--maxschedchunk 1), in the order tests/conftest.py
# gives: the long poles first, each on its own worker.
PYTEST_PROCS ?= 4
pytest: bytecode
	$(VENV)/bin/pytest -q -n $(PYTEST_PROCS) --maxschedchunk 1 --durations=15

test: lint types pytest

clean-venv:
	rm -rf $(VENV)

# The TypeScript SDK client under test (`--client typescript-sdk`, lab/sut/typescript/):
# the versions pinned by its package-lock.json, from the npm registry, into .node/
# (git-ignored; LAB_NODE_DIR points elsewhere). Needs Node.js >= 18 and npm on PATH.
NODE_DIR ?= .node
.PHONY: node-adapter
node-adapter: $(NODE_DIR)/.installed

$(NODE_DIR)/.installed: lab/sut/typescript/package.json lab/sut/typescript/package-lock.json
	@command -v npm >/dev/null || { echo "make node-adapter: needs Node.js and npm on PATH" >&2; exit 3; }
	mkdir -p $(NODE_DIR)
	cp lab/sut/typescript/package.json lab/sut/typescript/package-lock.json $(NODE_DIR)/
	cd $(NODE_DIR) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@
