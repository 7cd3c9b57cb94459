"""The grade, in the formats instructors use: a table, JSON, and Gradescope's results.json.

Gradescope's autograder reads ``/autograder/results/results.json``: the total
``score``, and a list of ``tests``, each with ``name``, ``score``,
``max_score``, ``output`` and ``visibility``
(https://gradescope-autograders.readthedocs.io/en/latest/specs/). Each
exercise is one Gradescope test; its output (plain text) lists every pytest test
it ran, with its share of the points where the tests are weighted, and each failing
test's whole message and what its code printed. ``--json`` writes the same
results as a list of exercises, each with its tests and their whole messages.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path


def table(results: list) -> str:
    rows = [("exercise", "tests passed", "points", "first failure")]
    rows += [(r.exercise, f"{r.passed}/{r.total}", f"{r.points:g}/{r.max_points}",
              r.first_failure or "-") for r in results]
    got, best = sum(r.points for r in results), sum(r.max_points for r in results)
    rows.append(("total", "", f"{got:g}/{best}", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + "  " + row[3]
             for row in rows]
    modes = sorted({r.isolation for r in results if r.isolation})
    if modes:
        lines.append("isolation: " + "; ".join(
            m + (f" ({', '.join(r.exercise for r in results if r.isolation == m)})"
                 if len(modes) > 1 else "") for m in modes))
    return "\n".join(lines)


def test_lines(result, indent: str = "      ") -> list[str]:
    """Every test of one exercise: PASS or FAIL, its name, its weight where the exercise's
    tests are not weighted alike, and for a failing test its whole message and what it
    printed."""
    weighted = len({t.get("weight", 1.0) for t in result.tests}) > 1
    total = sum(t.get("weight", 1.0) for t in result.tests) or 1.0
    lines = []
    for t in result.tests:
        message = (t["message"] or "").splitlines() or [""]
        share = (f" [{t.get('weight', 1.0) / total * result.max_points:.2g} of "
                 f"{result.max_points} points]" if weighted else "")
        lines.append(f"{'PASS' if t['passed'] else 'FAIL'}  {t['name']}{share}"
                     + (f": {message[0]}" if message[0] else ""))
        lines += [indent + ln if ln else "" for ln in message[1:]]
        if t.get("output"):
            lines.append(indent + "what your code printed during this test:")
            lines += [indent + "| " + ln for ln in t["output"].splitlines()]
    return lines


def printed_by_failing_tests(results: list) -> str:
    """For the terminal, under the table: each failing test's printed output, if any."""
    blocks = []
    for r in results:
        for t in r.tests:
            if not t["passed"] and t.get("output"):
                body = "\n".join("  | " + ln for ln in t["output"].splitlines())
                blocks.append(f"{r.exercise} {t['name']} printed:\n{body}")
    return "\n\n".join(blocks)


def write_json(results: list, path: str | Path) -> None:
    Path(path).write_text(json.dumps([asdict(r) for r in results], indent=2))


def gradescope(results: list, visibility: str = "visible") -> dict:
    """Gradescope's results.json for ``results`` (one Gradescope test per exercise). Each
    test's ``output`` is plain text: every pytest test it ran, and each failing one's whole
    message."""
    tests = []
    for r in results:
        lines = [f"{r.passed}/{r.total} tests passed", *test_lines(r)]
        if r.first_failure and not r.tests:
            lines.append(r.first_failure)
        if r.isolation:
            lines.append(f"(graded with isolation: {r.isolation})")
        tests.append({"name": f"{r.exercise} ({Path(r.file).name})", "score": r.points,
                      "max_score": r.max_points, "output": "\n".join(lines),
                      "output_format": "text", "visibility": visibility})
    return {"score": round(sum(r.points for r in results), 2),
            "max_score": sum(r.max_points for r in results), "output_format": "text",
            "visibility": visibility, "stdout_visibility": "hidden", "tests": tests}


def nothing_to_grade(why: str, visibility: str = "visible") -> dict:
    """Gradescope's results.json for a submission with no exercise file in it: 0, and why."""
    return {"score": 0.0, "output": why, "output_format": "text", "visibility": visibility,
            "stdout_visibility": "hidden", "tests": []}


def write_gradescope(results: list | dict, path: str | Path, visibility: str = "visible") -> None:
    """Write ``results`` (graded exercises, or a ready results.json dict) to ``path``."""
    doc = results if isinstance(results, dict) else gradescope(results, visibility)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=2))
