# The two commands of the course (see README.md):
#   make course   set everything up and open the course in JupyterLab
#   make test     set everything up and run the whole test suite (what CI runs)
# and the headless variant of the first:
#   make render   execute every notebook and write it, with its plots, to build/notebooks/

PYTHON ?= python3
VENV   ?= .venv
# CI and the CPU-only default; on a GPU machine: make course TORCH="torch"
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
JOBS   ?= 2

.PHONY: setup course render test clean-notebooks exercises

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

course: setup
	$(VENV)/bin/jupyter lab notebooks/

render: setup
	$(VENV)/bin/jupyter nbconvert --to html --execute --ExecutePreprocessor.timeout=900 \
		--output-dir build/notebooks notebooks/*.ipynb
	@echo "rendered notebooks: build/notebooks/"

# Library and exercise tests in parallel; then the notebooks one at a time, so that what they
# measure (and assert) is not disturbed by another job on the same cores.
test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -n $(JOBS) --durations=10 tests
	OMP_NUM_THREADS=1 $(PY) -m pytest --nbval-lax --durations=10 notebooks

exercises: setup
	$(PY) -m lecture_lib.exercises

clean-notebooks: setup
	$(VENV)/bin/jupyter nbconvert --clear-output --inplace notebooks/*.ipynb
