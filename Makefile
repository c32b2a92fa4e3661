# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	MPLBACKEND=Agg $(PY) examples/moons.py

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check mlir_nn tests examples benchmarks

test: $(VENV)/.installed lint
	MPLBACKEND=Agg $(PY) -m pytest -q

clean:
	rm -rf $(VENV) output .pytest_cache .hypothesis
