"""Answers to the notebooks' self-study questions, computed by the library (issue 17).

Every notebook ends with a markdown cell headed ``## Check your understanding``: 3-5
questions, each opened by ``**Q1.**``, ``**Q2.**``, ... and followed by its answer folded
away in ``<details><summary>Answer</summary> ... </details>``. At least one question is a
hand calculation. Its numbers are not typed from a calculator: one module per notebook,
named by the notebook's topic (its file name without the number: ``03_memory.ipynb`` ->
``lecture_lib.study.memory``, so renumbering a notebook changes nothing here), defines
``ANSWERS = {"Q2": fn}``, where ``fn()`` computes the answer with the library's own models
(memory, bubble, ring cost, ...) and returns the strings the folded answer must contain,
e.g. ``["1.96 TB", "30.6 GB"]``. ``tests/test_self_study.py`` checks that each string appears in
its question's answer and that every figure (number with a unit) typed in an answer is one
of them, so an answer stays right when a model changes.
"""
from __future__ import annotations

import importlib
import re
from typing import Callable

_NUMBER = re.compile(r"^(?:\d+[a-z]?|A\d+)_")   # the notebook's place in the course: 03_, A1_


def module_name(notebook: str) -> str:
    """'03_memory.ipynb' -> 'lecture_lib.study.memory': the topic, without the number."""
    stem = notebook.split("/")[-1].removesuffix(".ipynb")
    return f"{__name__}.{_NUMBER.sub('', stem)}"


def answers(notebook: str) -> dict[str, Callable[[], list[str]]]:
    """The computed answers of a notebook's questions, by label ('Q1'); {} if it has none."""
    try:
        module = importlib.import_module(module_name(notebook))
    except ModuleNotFoundError as err:
        if err.name != module_name(notebook):
            raise
        return {}
    return dict(module.ANSWERS)


def fmt(value: float, unit: str, digits: int = 3) -> str:
    """A number as the answers write it: `digits` significant figures and its unit."""
    return f"{value:.{digits}g} {unit}"
