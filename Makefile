# The two commands of the course (see README.md):
#   make course   set everything up and open the course in JupyterLab
#   make test     set everything up and run the whole test suite (what CI runs)
# and the headless variant of the first:
#   make render   execute every notebook and write it, with its plots, to build/notebooks/
# and the check of the first in a real browser (needs Chromium; see README, not in `make test`):
#   make test-browser

PYTHON ?= python3
VENV   ?= .venv
# CI and the CPU-only default; on a GPU machine: make course TORCH="torch"
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
JOBS   ?= 2
# make render: seconds one notebook may run before it is reported as too slow
NOTEBOOK_TIMEOUT ?= 600

.PHONY: setup course render test test-browser clean-notebooks exercises

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

# JupyterLab on notebooks/ (a free port, a token); prints the URL to open.
course: setup
	$(PY) tools/course.py notebooks

# Each notebook with a time limit; the slowest cells of each are named; widgets are stored.
render: setup
	$(PY) tools/render_notebooks.py --output-dir build/notebooks \
		--notebook-timeout $(NOTEBOOK_TIMEOUT) notebooks/*.ipynb

# The linter (rules in pyproject.toml); library and exercise tests in parallel; then the notebooks one at a time, so that what they
# measure (and assert) is not disturbed by another job on the same cores.
test: setup
	$(VENV)/bin/ruff check lecture_lib tests solutions exercises examples tools
	OMP_NUM_THREADS=1 $(PY) -m pytest -n $(JOBS) --durations=10 --ignore=tests/browser tests
	@# a CPU with native bf16 (AVX512-BF16, AMX) runs other oneDNN kernels: the 16-bit tests again on the older ones
	@if grep -q -E 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then \
		echo "16-bit tests again with ONEDNN_MAX_CPU_ISA=AVX2 (this CPU has native bf16)"; \
		ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1 $(PY) -m pytest -n $(JOBS) -q -m sixteen_bit --ignore=tests/browser tests; \
	else echo "16-bit tests ran on the AVX2 kernels only: this CPU has no native bf16 (no avx512_bf16/amx_bf16)"; fi
	OMP_NUM_THREADS=1 LECTURE_LIB_PROGRESS=lines $(PY) -m pytest --nbval-lax --durations=10 notebooks

# JupyterLab in headless Chromium (Debian's `chromium` package; Playwright from pip): notebooks
# 00 and 03 run from the UI; screenshots in build/browser/. Skips, saying so, without Chromium.
test-browser: $(VENV)/.browser
	OMP_NUM_THREADS=1 $(PY) -m pytest -v -s -rs tests/browser

$(VENV)/.browser: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[dev,browser]"
	touch $@

exercises: setup
	$(PY) -m lecture_lib.exercises

clean-notebooks: setup
	$(VENV)/bin/jupyter nbconvert --clear-output --inplace notebooks/*.ipynb
