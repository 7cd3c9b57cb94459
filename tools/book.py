"""Build the course as a web book: ``make book`` (build/book/index.html), offline.

Sphinx with MyST-NB and the book theme (sphinx-book-theme): a sidebar with the lecture in
order and the appendices after it, previous/next links, full-text search from Sphinx's own
index (no external service), the exercises' statements and how to grade them, the glossary
as its own page. Every figure and output is the one the tests executed: nbval runs each
notebook once in `make test`, and conftest.py keeps the executed copy in build/executed
(with the SHA-256 of the source it ran). A notebook with no fresh executed copy is executed
here, the same way; a notebook that failed stops the build, naming the cell. Each page
starts with a short box saying how to run that notebook yourself; a live widget is shown as
the static snapshot it drew, with a note on running it live. Nothing is loaded from another
host, at build time or when a page is read (checked after the build).

    python tools/book.py [--executed build/executed] [--out build/book] [--jobs 2]
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: The pages after the appendix notebooks: book/<name>.md, or generated (exercises).
PAGES = ("gpus", "exercises", "glossary")
#: A tag that would load a script, style, image or frame from another host.
EXTERNAL = re.compile(r"<(?:script|link|img|iframe|source)\b[^>]*?\b(?:src|href)="
                      r"[\"'](?:https?:)?//", re.I)


def lecture_and_appendix(folder: Path) -> tuple[list[Path], list[Path]]:
    """The lecture's notebooks in order (names that start with a digit), then the appendices
    (names that start with ``A``)."""
    notebooks = sorted(folder.glob("*.ipynb"))
    return ([p for p in notebooks if p.name[0].isdigit()],
            [p for p in notebooks if p.name.startswith("A")])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stale(notebooks: list[Path], executed: Path) -> list[Path]:
    """The notebooks without an executed copy of their current source."""
    out = []
    for nb in notebooks:
        copy = executed / nb.name
        meta = nbformat.read(copy, 4).metadata.get("lecture_lib", {}) if copy.exists() else {}
        if meta.get("source_sha256") != _sha256(nb):
            out.append(nb)
    return out


def execute(notebooks: list[Path], executed: Path, jobs: int) -> None:
    """Run ``notebooks`` under nbval as `make test` does; conftest.py keeps the copies."""
    env = dict(os.environ, LECTURE_EXECUTED_DIR=str(executed), OMP_NUM_THREADS="1",
               LECTURE_LIB_PROGRESS="off")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
           *(["-n", str(jobs), "--dist", "loadfile"] if jobs > 1 and len(notebooks) > 1 else []),
           *map(str, notebooks)]
    print("executing", len(notebooks), "notebook(s) without a fresh executed copy:",
          ", ".join(p.name for p in notebooks), flush=True)
    subprocess.run(cmd, cwd=ROOT, env=env)


def check_executed(nb: Path, executed: Path) -> nbformat.NotebookNode:
    copy = executed / nb.name
    if not copy.exists():
        raise SystemExit(f"book: {nb.name} has no executed copy in {executed} (did it run?)")
    node = nbformat.read(copy, 4)
    failed = node.metadata.get("lecture_lib", {}).get("failed_cell")
    if failed is not None:
        first = "".join(node.cells[failed].source).splitlines()[:1]
        raise SystemExit(f"book: {nb.name} failed at cell {failed} ({first[0] if first else ''}"
                         "): fix it, then build again")
    return node


def run_box(name: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(
        ":::{admonition} Run this notebook yourself\n:class: tip\n"
        "On a machine with Python 3.10+ and `make` (no GPU needed), in the course's folder: "
        "`make course` sets everything up and opens JupyterLab; open "
        f"`notebooks/{name}` and run all cells. `make test` runs every test.\n:::")


def for_the_book(node: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """The executed notebook as the book shows it: the run box after the title; each live
    widget's view replaced by a note (its static snapshot, drawn by the widget, stays); links
    to the book's own pages (``../book/glossary.md``) pointed at them."""
    for cell in node.cells:
        if cell.cell_type == "code":
            cell.outputs = [shown for out in cell.get("outputs", []) for shown in _static(out)]
        else:                           # ../book/glossary.md in JupyterLab is ../glossary here
            cell.source = cell.source.replace("](../book/", "](../")
    title = next((i for i, c in enumerate(node.cells) if c.cell_type == "markdown"), 0)
    node.cells.insert(title + 1, run_box(name))
    return node


def _static(out) -> list:
    """An output as a page shows it: a live widget becomes a note and the snapshot it offers
    (its text and figure: lecture_lib.figures.widgets.Explorer); anything else as it is."""
    data = out.get("data", {})
    if WIDGET_VIEW not in data:
        return [out]
    note = ("*A live widget stands here: run this notebook (the box at the top) to use its "
            "controls. Below, its text and figure as executed.*")
    shown = [nbformat.v4.new_output("display_data", data={"text/markdown": note})]
    for mime in ("text/html", "image/png"):
        if mime in data:
            shown.append(nbformat.v4.new_output("display_data", data={mime: data[mime]}))
    return shown


def exercises_page(folder: Path) -> str:
    """Every exercise's statement (its module docstring) and how to grade it."""
    parts = ["# Exercises\n",
             "Each exercise is a file in `exercises/` with its statement on top and "
             "`NotImplementedError` where you write code. Grade one with\n\n"
             "```bash\npython -m lecture_lib.grading grade exercises/ex00_ring_sum.py\n```\n\n"
             "or all of them with `python -m lecture_lib.grading grade exercises/`; from a "
             "notebook, `lecture_lib.grading.check(\"ex00\")`. The grader prints each "
             "exercise's tests passed, points and first failure, and what your code printed in "
             "a failing test.\n"]
    for path in sorted(folder.glob("ex*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        head, _, body = doc.partition("\n")
        body = re.sub(r"``([^`]+)``", r"`\1`", body).strip()
        parts.append(f"## {head.strip()}\n\nFile: `exercises/{path.name}`\n\n{body}\n")
    return "\n".join(parts)


def index_page(lecture: list[str], appendix: list[str]) -> str:
    def toc(caption: str, docs: list[str]) -> str:
        return (f":::{{toctree}}\n:caption: {caption}\n:maxdepth: 1\n\n" + "\n".join(docs)
                + "\n:::\n")
    intro = (ROOT / "book" / "index.md").read_text()
    return "\n".join([intro, toc("The lecture", lecture),
                      toc("Appendix", appendix + list(PAGES))])


def assemble(src: Path, executed: Path) -> list[str]:
    lecture, appendix = lecture_and_appendix(ROOT / "notebooks")
    shutil.rmtree(src, ignore_errors=True)
    (src / "notebooks").mkdir(parents=True)
    for nb in lecture + appendix:
        nbformat.write(for_the_book(check_executed(nb, executed), nb.name),
                       str(src / "notebooks" / nb.name))
    shutil.copy(ROOT / "book" / "conf.py", src / "conf.py")
    for page in PAGES:
        if (ROOT / "book" / f"{page}.md").exists():
            shutil.copy(ROOT / "book" / f"{page}.md", src / f"{page}.md")
    (src / "exercises.md").write_text(exercises_page(ROOT / "exercises"))
    docs = [f"notebooks/{p.stem}" for p in lecture], [f"notebooks/{p.stem}" for p in appendix]
    (src / "index.md").write_text(index_page(*docs))
    return ["index", *docs[0], *docs[1], *PAGES]


def external_assets(out: Path) -> list[str]:
    """Pages that would load something from another host (a script, style, image, frame)."""
    return [f"{p.relative_to(out)}: {m.group(0)[:80]}" for p in out.rglob("*.html")
            for m in EXTERNAL.finditer(p.read_text(errors="replace"))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executed", default=str(ROOT / "build" / "executed"))
    parser.add_argument("--out", default=str(ROOT / "build" / "book"))
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    executed, out, src = Path(args.executed).resolve(), Path(args.out), ROOT / "build" / "book-src"
    lecture, appendix = lecture_and_appendix(ROOT / "notebooks")
    missing = stale(lecture + appendix, executed)
    if missing:
        execute(missing, executed, args.jobs)
    pages = assemble(src, executed)
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W",
                           "--keep-going", str(src), str(out)], cwd=ROOT)
    if done.returncode:
        return done.returncode
    bad = external_assets(out)
    if bad:
        print("book: pages load from another host:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    print(f"book: {len(pages)} pages in {out}/index.html: " + ", ".join(pages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
