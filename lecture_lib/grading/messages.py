"""A test's message and output, as the grader reports them.

Each test's message is the whole exception its test raised (the ``E`` lines of pytest's
report, without pytest's own prefixes, locations or notes); an exercise's *first failure* is
one line of its first failing test's message, cut only between values (never inside a tensor,
list or word) with a note of what it left out. What a failing test printed is kept too: its
last :data:`OUTPUT_CHARS` characters.
"""
from __future__ import annotations

import itertools
import re

#: The width of a first-failure line (its message part), and the most a test's whole message
#: keeps (a submission can raise an exception of any size).
LINE_CHARS = 300
MESSAGE_CHARS = 20_000
#: The most of a failing test's printed output kept (its end: the last prints before it failed).
OUTPUT_CHARS = 4_000


def first_line(text: str) -> str:
    """One line of ``text`` (a process's output): its first ``E`` line, else its first line."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    pick = next((ln[1:].strip() for ln in lines if ln.startswith("E ")), lines[0] if lines else "")
    return one_line(drop_module_path(pick), whole=None)


def drop_module_path(text: str) -> str:
    return re.sub(r"^(?:[A-Za-z_]\w*\.)+(\w+: )", r"\1", text)   # a.b.Error: -> Error:


def _boundaries(text: str) -> list[int]:
    """Where ``text`` may be cut: at a space outside every bracket, so a tensor, a list, a
    call or a word is shown whole or not at all."""
    depth, cuts = 0, []
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch.isspace() and depth == 0:
            cuts.append(i)
    return cuts + [len(text)]


def one_line(message: str, width: int = LINE_CHARS,
             whole: str | None = "--json, Gradescope's output") -> str:
    """``message`` as one line of at most about ``width`` characters, cut only between values,
    with a note of what it leaves out (and where the ``whole`` message is). Its lines are
    joined with `` | `` up to a traceback (the submission's own) or, after a test's own
    words, pytest's explanation of the assertion (``assert ...``): the message keeps both."""
    lines = [ln.strip() for ln in (message or "").splitlines() if ln.strip()]
    head = lines[:1] + list(itertools.takewhile(
        lambda ln: not ln.startswith(("---", "Traceback (", "assert ")), lines[1:]))
    text = " | ".join(head)
    cuts = _boundaries(text)
    fit = [c for c in cuts if c <= width]
    ends = [c for c in fit if text.startswith(" | ", c) or c == len(text)]
    longer = next((c for c in cuts if c > width), len(text))
    if len(text) <= width:
        cut = len(text)
    elif ends and ends[-1] >= width // 2:   # rather a whole line than a line's first words
        cut = ends[-1]
    elif fit and fit[-1] >= width // 2:
        cut = fit[-1]
    elif longer <= 4 * width:             # the next value is long: shown whole all the same
        cut = longer
    else:                                 # a value longer still: not shown at all
        cut = fit[-1] if fit else 0
    shown = text[:cut].rstrip()
    rest = len(text) - len(shown) + sum(len(ln) + 1 for ln in lines[len(head):])
    if rest <= 0:
        return shown
    more = len(lines) - len(head) + (text[cut:].count(" | ") if cut < len(text) else 0)
    lines_note = f" ({more} more line{'s' if more != 1 else ''})" if more else ""
    where = f"; the whole message: {whole}" if whole else ""
    return f"{shown} ... [+{rest} characters{lines_note} not shown{where}]"


def message(bad) -> str:
    """The whole message of a failed test: the exception pytest reports (its last block of
    ``E`` lines), without pytest's prefixes, file locations or notes of its own."""
    lines = (bad.text or "").splitlines()
    ends = [i for i, ln in enumerate(lines) if re.match(r"E( |$)", ln)]
    if ends:
        last = ends[-1]
        first = last
        while first > 0 and re.match(r"E( |$)", lines[first - 1]):
            first -= 1
        filled = next((ln for ln in lines[first:last + 1] if ln.strip() != "E"), "E")
        prefix = re.match(r"E *", filled).group(0)
        block = [ln[len(prefix):] if ln.startswith(prefix) else ln[1:].strip()
                 for ln in lines[first:last + 1]]
    else:                                 # no report text: the attribute, less pytest's note
        attr = bad.get("message", "") or ""
        block = re.sub(r"(\.\.\.)?\n\[(\+\d+ more lines?|truncated); full report in element "
                       r"text\]$", "", attr).splitlines()
    block = [ln.rstrip() for ln in block
             if not re.match(r"\s*(Use -v to get (more|the full) diff|\.\.\.Full output "
                             r"truncated)", ln)]
    text = "\n".join(block).strip("\n")
    text = drop_module_path(text)
    if len(text) > MESSAGE_CHARS:
        cut = text.rfind("\n", 0, MESSAGE_CHARS)
        cut = cut if cut > MESSAGE_CHARS // 2 else MESSAGE_CHARS
        text = f"{text[:cut]}\n[+{len(text) - cut} more characters of this message not kept]"
    return text


def output(case) -> str:
    """What a test printed (its ``system-out``): the last :data:`OUTPUT_CHARS` characters,
    from a line's start, with a note of what was cut."""
    text = "".join(el.text or "" for el in case.iter("system-out"))
    text = re.sub(r"(?m)^-+ Captured [\w ]+ -+\n?", "", text).strip("\n")   # pytest's headers
    if len(text) <= OUTPUT_CHARS:
        return text
    cut = text.find("\n", len(text) - OUTPUT_CHARS)
    cut = cut + 1 if 0 <= cut < len(text) - OUTPUT_CHARS // 2 else len(text) - OUTPUT_CHARS
    return f"[... {cut} earlier characters of output not kept ...]\n{text[cut:]}"
