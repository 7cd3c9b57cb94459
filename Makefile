# The two commands of the course (see README.md, "The two commands"):
#   make course        set everything up (.venv) and open the course in JupyterLab
#   make test          set everything up and run every test (what CI runs)
# and
#   make render        the headless variant of `make course`: every notebook executed and written,
#                      with its plots, to build/notebooks/ (one: NOTEBOOKS=notebooks/00_welcome.ipynb)
#   make book          the course as a web book, build/book/index.html (offline; from the notebooks
#                      `make test` executed, kept in build/executed; the others are executed first)
#   make help          this list
# In the instructor's checkout (the folder with solutions/) only:
#   make test          = ruff, the tests only the checkout can run (INSTRUCTOR_TESTS), then
#                        `make release-test`
#   make release-test  write the student release into build/release and run its own `make test`
#                      there, with this .venv (nothing reinstalled) and the release's lecture_lib
#   make test-browser  the course and the book in a real browser (needs Chromium; builds the book)
#   make exercises     regenerate exercises/ from solutions/
#   make test-extended every exercise's wrong-but-plausible submissions graded (minutes)

PYTHON ?= python3
VENV   ?= .venv
# CI and the CPU-only default; on a GPU machine: make course TORCH="torch"
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
JOBS   ?= 2
# make render: seconds one notebook may run before it is reported as too slow; which notebooks
NOTEBOOK_TIMEOUT ?= 600
NOTEBOOKS ?= notebooks/*.ipynb
# What course, render and test set up first; empty: use $(VENV) as it is (release-test does so).
SETUP  ?= setup
RELEASE_DIR ?= build/release
# The tests only the instructor's checkout can run: the exercises' tests against solutions/ (the
# release runs them against the stubs), and the tests the release leaves out (SKIP_TESTS in
# lecture_lib/grading/release.py; tests/test_release.py checks that the two lists agree). In
# this order: pytest-xdist hands out the grader's long tests (30-60 s each) first, and the
# exercises' shorter ones fill both workers to the end.
INSTRUCTOR_TESTS := $(wildcard tests/test_grading*.py tests/test_gradescope.py tests/test_release.py) \
	tests/exercises
# In a release, an exercise's tests are skipped (saying so) while its file is the unwritten stub.
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -p lecture_lib.grading.release

.PHONY: help setup course render book test test-extended release-test test-browser clean-notebooks \
	exercises

help:
	@sed -n '1,/^$$/s/^# \{0,1\}//p' $(firstword $(MAKEFILE_LIST))

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

# JupyterLab on notebooks/ (a free port, a token); prints the URL to open.
course: $(SETUP)
	$(PY) tools/course.py notebooks

# Each notebook with a time limit; the slowest cells of each are named; widgets are stored.
render: $(SETUP)
	$(PY) tools/render_notebooks.py --output-dir build/notebooks \
		--notebook-timeout $(NOTEBOOK_TIMEOUT) $(NOTEBOOKS)

# Sphinx with MyST-NB and the book theme (pip install -e ".[book]"): tools/book.py.
book: $(VENV)/.book
	$(PY) tools/book.py --jobs $(JOBS)

$(VENV)/.book: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[dev,book]"
	touch $@

# pytest -n JOBS on $(1); on a CPU with native bf16 (AVX512-BF16, AMX), which runs other oneDNN
# kernels, the 16-bit tests among them again on the older ones.
define run_tests
$(PYTEST) -n $(JOBS) --durations=10 $(1)
@if grep -q -E 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then \
	echo "16-bit tests again with ONEDNN_MAX_CPU_ISA=AVX2 (this CPU has native bf16)"; \
	ONEDNN_MAX_CPU_ISA=AVX2 $(PYTEST) -n $(JOBS) -q $(1) -m sixteen_bit; \
else echo "16-bit tests ran on the AVX2 kernels only: this CPU has no native bf16 (no avx512_bf16/amx_bf16)"; fi
endef

ifneq ($(wildcard solutions/.),)
# The instructor's checkout: the linter (rules in pyproject.toml) on everything; the tests that
# need solutions/; then the release, tested as students run it. The library's tests and the
# notebooks run once, in the release.
test: $(SETUP)
	$(VENV)/bin/ruff check $(wildcard lecture_lib tests solutions exercises examples tools)
	$(call run_tests,-m "not extended" $(INSTRUCTOR_TESTS))
	@$(MAKE) --no-print-directory release-test

# The wrong-but-plausible submissions of every exercise, graded by the real command (about 7
# minutes on 2 cores, so not in `make test`; the refusal itself is tested there).
test-extended: $(SETUP)
	$(PYTEST) -n $(JOBS) -v -m extended tests/test_grading_answers.py

# The release written afresh, then its own `make test` in it: this .venv (SETUP= installs
# nothing), the release's lecture_lib (its Makefile sets PYTHONPATH to the release).
release-test:
	rm -rf $(RELEASE_DIR)
	$(PY) -m lecture_lib.grading release $(RELEASE_DIR)
	cd $(RELEASE_DIR) && LECTURE_EXECUTED_DIR=$(abspath build/executed) \
		$(MAKE) --no-print-directory test VENV=$(abspath $(VENV)) SETUP=

# JupyterLab in headless Chromium (Debian's `chromium` package; Playwright from pip): notebooks
# 00 and 03 run from the UI; screenshots in build/browser/. Skips, saying so, without Chromium.
test-browser: $(VENV)/.browser book
	OMP_NUM_THREADS=1 $(PY) -m pytest -v -s -rs tests/browser

$(VENV)/.browser: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[dev,browser]"
	touch $@

exercises: $(SETUP)
	$(PY) -m lecture_lib.grading stubs
else
# A student's copy (no solutions/). Every command here, and every process it starts (ranks, the
# grader's sandbox, notebook kernels, torchrun's workers), imports this folder's lecture_lib,
# whatever the venv's install points at: release-test runs the release with the checkout's .venv,
# whose editable install points at the checkout (`make test` checks it first).
export PYTHONPATH := $(CURDIR)

# The linter; the library's and the exercises' tests in parallel; then the notebooks, JOBS at a
# time, each notebook's cells in order on one worker (--dist loadfile). A notebook asserts only
# what holds when another job shares the cores (ratios within one run, emulated time), so two
# notebooks at once on 2 cores keep their claims and use the core one kernel leaves idle.
test: $(SETUP)
	@$(PY) -c 'import lecture_lib, pathlib, sys; here = pathlib.Path(lecture_lib.__file__).parents[1]; sys.exit(None if here.samefile(".") else f"lecture_lib is imported from {here}, not from this folder")'
	$(VENV)/bin/ruff check $(wildcard lecture_lib tests exercises examples tools)
	$(call run_tests,tests)
	OMP_NUM_THREADS=1 LECTURE_LIB_PROGRESS=off $(PY) -m pytest -n $(JOBS) --dist loadfile \
		--nbval-lax --durations=10 notebooks

release-test test-extended test-browser exercises:
	@echo "make $@: only in the instructor's checkout (the folder with solutions/)"; exit 1
endif

clean-notebooks: $(SETUP)
	$(VENV)/bin/jupyter nbconvert --clear-output --inplace notebooks/*.ipynb
