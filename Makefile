# Two commands for a fresh machine (see README.md):
#   make run    the lab's main job: the default scenario, end to end
#   make test   ruff, mypy and the whole pytest suite
# Both create .venv on first use (Python 3.12, pinned by constraints.txt).

PYTHON_BOOT ?= $(shell command -v python3.12 2>/dev/null || echo $$HOME/.pyenv/versions/3.12.1/bin/python3.12)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SCENARIO ?= smoke

.PHONY: run test lint types pytest venv clean-venv

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	@$(PY) -c 'import sys; assert sys.version_info[:2] == (3, 12), "need Python 3.12, got " + sys.version' 
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/lab run $(SCENARIO)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

types: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(VENV)/bin/pytest -q

test: lint types pytest

clean-venv:
	rm -rf $(VENV)
