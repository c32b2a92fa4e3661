# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint clean gpu-artifacts kernels

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,dist,cuda]'
	touch $@

demo: $(VENV)/.installed
	MPLBACKEND=Agg $(PY) examples/moons.py

# ruff, and import-linter's contracts on the stages' layering (pyproject.toml).
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check mlir_nn tests examples benchmarks
	$(VENV)/bin/lint-imports

test: $(VENV)/.installed lint
	MPLBACKEND=Agg $(PY) -m pytest -q --durations=20

# CUDA artifacts + NumPy references for benchmarks/gpu_check.py (compiled here, no GPU needed).
gpu-artifacts: $(VENV)/.installed
	$(PY) benchmarks/make_gpu_artifacts.py benchmarks/artifacts --arch sm_90

# The hand-written CUDA reference kernels (needs nvcc and cmake, not a GPU).
kernels:
	cmake -S . -B build/kernels -DCMAKE_BUILD_TYPE=Release && cmake --build build/kernels && ctest --test-dir build/kernels

clean:
	rm -rf $(VENV) output .pytest_cache .hypothesis
