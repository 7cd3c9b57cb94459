"""Every link of the README, CONTRIBUTING, docs/ and the book's pages leads somewhere.

A relative link must name a file of the pack, and its ``#anchor`` a heading of that file (as
GitHub and the book number them); a link to another site is left to the reader's browser.
The README's first screen shows the two commands and links the course map and the glossary.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [p for p in (ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(ROOT.glob("docs/*.md")),
                    *sorted(ROOT.glob("book/*.md"))) if p.exists()]   # a release has fewer
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.S)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


def links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text()))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    broken = []
    for target in links(doc):
        if re.match(r"[a-z]+:", target):
            continue                        # another site: https://, mailto:
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {path.name}")
    assert not broken, broken


def test_the_readme_starts_with_the_two_commands_and_the_map():
    text = (ROOT / "README.md").read_text()
    first_screen = text[:text.index("\n## ")]
    assert "make course" in first_screen and "make test" in first_screen
    assert "(#the-course)" in first_screen and "(book/glossary.md)" in first_screen
    assert len(text.splitlines()) <= 150


def test_the_slug_follows_github():
    assert slug("The capstone at full size (`examples/train_gpt2.py`)") == \
        "the-capstone-at-full-size-examplestrain_gpt2py"
    assert slug("What you need") == "what-you-need"
