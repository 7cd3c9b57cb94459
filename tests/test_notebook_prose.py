"""No measured figure typed into a notebook's prose (issue 17).

Measured numbers reach markdown only through outputs. This scans every markdown cell of
notebooks/*.ipynb for a number next to a measured unit (``12 ms``, ``0.8 MB/s``, ``35-40%``,
``2.5x``, ``~0.73``) after removing LaTeX math and inline code. A hit passes if

* its sentence cites a source (CITATION: "et al.", "Table 2", "arXiv", "datasheet", ...), or
* it sits in a hardware spec phrase (SPEC: "989 TFLOP/s on an H100", "80 GB GPU", "on NVLink"), or
* it is in ALLOWED: an explicit (notebook, snippet, reason) list for the remaining cited
  constants, configurations the notebook sets itself and tolerances its code asserts.

An ALLOWED entry that matches nothing any more fails too, so the list cannot go stale.
Pure text: no notebook is run.
"""
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))

NUMBER = r"(?<![\w.])[~≈]?\s?\d+(?:[.,]\d+)*(?:\s*[-–]\s*\d+(?:[.,]\d+)*)?"
UNIT = (r"\s?(?:%|pp\b|[KMGT]i?B/s|[KMGT]i?B\b|B/s|[TGP]?FLOP/s|tokens/s|ms\b|us\b|µs|ns\b|s\b)"
        r"|\sB\b(?!\s*parameters)"      # "4 B" are bytes; "175B" / "1.3 B parameters" a model size
        r"|[x×](?!\w)")                   # "2.5x" is a ratio; "8 x 8" a product of sizes
FIGURE = re.compile(rf"{NUMBER}(?:{UNIT})")
APPROX = re.compile(r"(?<![\w.])[~≈]\s?\d[\d.,eE+-]*")   # "~0.73": an approximate reading
MATH_AND_CODE = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$|`[^`\n]*`", re.S)
# self-study answers are checked against the library by tests/test_self_study.py
FOLDED = re.compile(r"<details>.*?</details>", re.S)
CITATION = re.compile(r"et al\.|\b(?:Table|Figure|Fig\.|eq\.)\s?\d|arXiv|datasheet|documentation"
                      r"|user guide|nccl-tests|\(\w[\w ]* \d{4}\)")
SPEC = re.compile(r"\b(?:H100|A100|NVLink|InfiniBand|NDR|HDR)\b")
SPEC_NOUN = re.compile(r"\s*(?:GPUs?|devices?)\b")   # "80 GB GPU": a device's capacity
SPEC_REACH = 30                                       # characters either side for SPEC words

# (notebook, snippet in the cell's prose after math/code are removed and whitespace is
# collapsed, reason). The snippet must contain the figure.
ALLOWED = [
    ("00_welcome.ipynb", "state alone is 2.8 TB",
     "formula: 175e9 parameters x 16 bytes (Brown et al. 2020, same cell)"),
    ("01_collectives.ipynb", "at three sizes: 1 KiB, 64 KiB and 16 MiB",
     "configuration: the message sizes the notebook times"),
    ("01_collectives.ipynb", "Timed on this one machine at 16 MiB",
     "configuration: the largest message size the notebook times"),
    ("01_collectives.ipynb", "more than 3 on 4 H100s at 16 MiB",
     "tolerance asserted in section 5 (3 < model[-1] < 4, the modelled naive / ring at 16 MiB)"),
    ("01_collectives.ipynb", "At 1 KiB and at 64 KiB the naive all-reduce is faster",
     "configuration: the sizes compared (ratio_med[:2] < 1 and naive_wins[:2] > PAIRS / 2,"
     " asserted)"),
    ("01_collectives.ipynb", "orders of magnitude higher at 16 MiB than at 1 KiB",
     "configuration and tolerance asserted after the sweep (busbw[-1] > 100 x busbw[0])"),
    ("02_data_parallel.ipynb", "within 1% of the best at eight",
     "tolerance asserted after the bucket sweep (< 1.01 x the best step at 8 sequences per rank)"),
    ("02_data_parallel.ipynb", "Per-parameter comes within 1% of the best",
     "tolerance asserted in the cell above (< 1.01 x the best step at 8 sequences per rank)"),
    ("02_data_parallel.ipynb", "buckets of 1 to 100 MiB",
     "configuration: the bucket sizes the dry run sweeps"),
    ("02_data_parallel.ipynb", "the all-reduces of 25 MiB buckets",
     "configuration: the bucket size the dry run sets (torch's default bucket_cap_mb=25)"),
    ("02_data_parallel.ipynb", "largest bucket, 100 MiB, lie within 2% of each other",
     "emulated, asserted in the cell above (abs(100 MiB / 25 MiB step - 1) < 0.02)"),
    ("01_collectives.ipynb", "At 64 KiB it carries 64 times the bytes, yet takes less than 8",
     "configuration: SIZES, the sizes swept; asserted ring at 64 KiB < 8 x ring at 1 KiB"),
    ("02_data_parallel.ipynb", "the 300 GB/s ring of notebook",
     "cited constant: costmodel.NVLINK_H100.beta; flat's all-reduce < the ring's, asserted"),
    ("02_data_parallel.ipynb", "at least 15% slower",
     "emulated, asserted in the cell above (every other run > 1.15 x the best step)"),
    ("02_data_parallel.ipynb", "buckets of 25 and 100 MiB let backward hide",
     "configuration: the bucket sizes swept; hidden at 25 and 100 MiB in the hiding printout"),
    ("02_data_parallel.ipynb", "only flat is more than 1% slower",
     "emulated, asserted after the bucket sweep (others < 1.01 x the best step at 8 sequences)"),
    ("05_context_parallel.ipynb", "still wait, under 2% of the step at 128K",
     "emulated, a bound asserted after the zig-zag timing (every rank's exposed < 0.02 x step)"),
    ("08_hybrid_parallelism.ipynb", "gradients in 25 MiB buckets",
     "the hybrid trainer's constant, lecture_lib.hybrid.gpt.BUCKET_MB (torch DDP's bucket_cap_mb)"),
    ("10_capstone.ipynb", "the gradients go out in 25 MiB buckets",
     "the hybrid trainer's constant, lecture_lib.hybrid.gpt.BUCKET_MB (torch DDP's bucket_cap_mb)"),
    ("02_data_parallel.ipynb", "with 25 MiB buckets, under a tenth",
     "emulated, asserted after the overlap table (25 MiB: exposed < 0.1 x t_last, both batches)"),
    ("02_data_parallel.ipynb", "default of 25 MiB",
     "cited constant: DistributedDataParallel's bucket_cap_mb=25 (PyTorch docs)"),
    ("05_context_parallel.ipynb", "steps are within 3%, closer",
     "dry run, asserted in section 7 (0 < uly / ring - 1 < 0.03; deterministic)"),
    ("05_context_parallel.ipynb", "steps come within 3% of each other",
     "dry run, asserted in section 7 (0 < uly / ring - 1 < 0.03; deterministic)"),
    ("05_context_parallel.ipynb", "each waits under 1% of its step",
     "dry run, asserted in section 7 (each rank 0's waits < 1% of its step; deterministic)"),
    ("A2_the_emulated_cluster.ipynb", "the median error is 4.5% and the worst 11.6%",
     "deterministic: printed by the first code cell, bracketed in section 3's asserts"),
    ("A2_the_emulated_cluster.ipynb",
     "every fitted row within 3%; the median check is 4.5% off and the worst 11.6%",
     "asserted after the table (0.03; 0.0445 < median < 0.0455, 0.1155 < worst < 0.1165)"),
    ("A2_the_emulated_cluster.ipynb",
     "ring reaches about 360 GB/s bus bandwidth, and NVLS about 480",
     "emulated, printed by the all-reduce cell, asserted after it "
     "(355e9 < ring < 370e9, 470e9 < NVLS < 490e9)"),
    ("A2_the_emulated_cluster.ipynb", "more than the link's 450 GB/s",
     "cited constant: NVLink 4's 450 GB/s each way (NVIDIA H100 datasheet), "
     "printed by the all-reduce cell"),
    ("A2_the_emulated_cluster.ipynb", "shorten this step by only about 3%",
     "emulated, asserted after the ladder (1.03 < eager / CUDA-graph step < 1.04; deterministic)"),
    ("A2_the_emulated_cluster.ipynb", "from 4 to 64 MiB, up to about 1.6 times as much",
     "emulated, asserted after the all-reduce cell (dearer without NVLS at exactly 4-64 MiB; "
     "1.55 < worst ratio < 1.65)"),
    ("A2_the_emulated_cluster.ipynb", "From 128 MiB on, both curves cost less",
     "emulated, asserted after the all-reduce cell (the sizes dearer than the roofline ring "
     "end at 64 MiB)"),
    ("A2_the_emulated_cluster.ipynb", "at 4 and 8 MiB and less from 16 MiB on",
     "emulated, asserted after the all-reduce cell (with NVLS dearer at exactly 4 and 8 MiB, "
     "by < 2%)"),
    ("08_hybrid_parallelism.ipynb", "lie within 2% of the fastest",
     "modelled, asserted after the planner's bars (several layouts within 1.02 x the fastest)"),
    ("08_hybrid_parallelism.ipynb", "once it recomputes selectively (within 0.3%)",
     "modelled, asserted after the planner's ranking (isclose(selective, fastest, rel_tol=3e-3))"),
    ("08_hybrid_parallelism.ipynb", "run at 50% of the bf16 peak",
     "configuration: costmodel's A100_CLUSTER.efficiency, asserted after the memory printout"),
    ("A2_the_emulated_cluster.ipynb", "or a pessimistic 5%",
     "configuration: the selective_extra the sensitivity table sets (Assumptions(0.05))"),
    ("A2_the_emulated_cluster.ipynb", "The run's 140 TFLOP/s per GPU",
     "cited: Narayanan et al. 2021, section 5.1 (the GPT-3 175B run's HFU per GPU)"),
    ("A2_the_emulated_cluster.ipynb", "under a tenth too slow at 50%",
     "configuration: A100_CLUSTER.efficiency; asserted in the test (t.total / ran - 1 < 0.1)"),
    ("08_hybrid_parallelism.ipynb", "140/312 × 3/4 = 33.7%",
     "formula: 140 TFLOP/s / 312 / (4/3), asserted after the MFU cell (0.336 < paper_mfu < 0.338)"),
    ("08_hybrid_parallelism.ipynb", "the 21.9 GB per GPU that",
     "formula: 175e9 x 16 bytes / 128 GPUs (notebook 00, Q2), asserted after the memory printout"),
    ("06_pipeline_parallel.ipynb", "micro-batches for 20 %, **m ≥ 9(pp-1)** for 10 %",
     "formula: the bubble targets of the lecture's rule"),
    ("06_pipeline_parallel.ipynb", "about m ≥ 4(pp-1) for ≤ 20 %",
     "formula: the bubble target of the lecture's rule"),
    ("09_profiling_and_debugging.ipynb", "with buckets of 25 MiB",
     "configuration: the bucket size the real-size cell sets (bucket_size_mb=25)"),
    ("09_profiling_and_debugging.ipynb", "(exposed) **over 30 %** of the step",
     "configuration: profiling.diagnose's threshold (COMM_SHARE_LIMIT)"),
    ("09_profiling_and_debugging.ipynb", "**busy under 70 %** of the step",
     "configuration: profiling.diagnose's threshold (BUSY_SHARE_LIMIT)"),
    ("09_profiling_and_debugging.ipynb", "exposed communication > 30 %",
     "configuration: profiling.diagnose's threshold (summary table)"),
    ("09_profiling_and_debugging.ipynb", "busy < 70 %",
     "configuration: profiling.diagnose's threshold (summary table)"),
    ("09_profiling_and_debugging.ipynb", "sit idle for over 30% of the",
     "configuration: both rules' thresholds (COMM_SHARE_LIMIT, BUSY_SHARE_LIMIT)"),
    ("09_profiling_and_debugging.ipynb", "ends the call after 3 s",
     "configuration: the timeout=3 the cell passes"),
    ("09_profiling_and_debugging.ipynb",
     "computes for 120 ms; its gradient all-reduce takes 60 ms, 40 ms",
     "configuration: the given times of self-study Q1 "
     "(lecture_lib.study.profiling_and_debugging answers it)"),
    ("03b_zero_and_fsdp.ipynb", "bucketed DDP with 25 MiB buckets",
     "configuration: the case ddp_bucketed, zero.experiments.BUCKET_MB = 25"),
    ("01_collectives.ipynb", "At 1 KiB the ring takes over 100 times as long as that line",
     "measured, a bound: asserted two cells below (ring at 1 KiB > 100 x its bytes alone; "
     "the printed factor is in the thousands)"),
    ("01_collectives.ipynb", "At 16 MiB a link per rank would let the ring win",
     "configuration: 16 MiB is the largest size the cell times (SIZES); the ratio is printed "
     "below and asserted (0.5 < naive / ring < 2)"),
    ("03b_zero_and_fsdp.ipynb", "DDP needs 146 GB per GPU",
     "modelled memory, deterministic: asserted in the cell below "
     "(round(ZeRO-0 total / 1e9) == 146)"),
    ("03b_zero_and_fsdp.ipynb", "and fits, with 62 GB",
     "modelled memory, deterministic: asserted in the cell below "
     "(round(ZeRO-1 total / 1e9) == 62)"),
    ("10_capstone.ipynb", "strategies come within 5% of each other",
     "emulated time, deterministic: asserted in section 4 (max / min of the three "
     "data-parallel steps < 1.05)"),
    ("10_capstone.ipynb", "They come within 5% of each other",
     "emulated time, deterministic: asserted in section 4 (max / min of the three "
     "data-parallel steps < 1.05)"),
    ("10_capstone.ipynb", "3 to 5% ahead of",
     "emulated time, deterministic: asserted in section 4 (1.03 < ddp / the slower of zero1 "
     "and fsdp; max / min of the three < 1.05)"),
    ("10_capstone.ipynb", "holds 14% less than",
     "modelled memory, deterministic: asserted in the cell above "
     "(0.85 < fsdp / zero1 memory per GPU < 0.87)"),
    ("10_capstone.ipynb", "waits about 59 ms of its step",
     "emulated time, deterministic: asserted in the cell above "
     "(58.5e-3 < pp's step - compute < 60e-3)"),
    ("10_capstone.ipynb", "of its step, 62% of it",
     "emulated time, deterministic: asserted in the cell above (0.61 < pp's wait / step < 0.63)"),
    ("10_capstone.ipynb", "is only 27% at",
     "formula: (pp - 1) / (m + pp - 1) at pp 4, m 8; asserted in the cell above "
     "(0.27 < bubble < 0.28)"),
    ("10_capstone.ipynb", "a GPU waits about 27 ms for its all-reduces",
     "emulated time, deterministic: asserted in the cell above "
     "(26.5e-3 < tp's step - compute < 27.5e-3)"),
    ("10_capstone.ipynb",
     "is 4.5% at the median and 11.6% at worst",
     "cited: appendix A2's checks, printed and asserted there (0.0445 < median < 0.0455, "
     "0.1155 < worst < 0.1165)"),
]


def prose(markdown: str) -> str:
    """The markdown without folded answers, LaTeX math and inline code, whitespace collapsed."""
    return " ".join(MATH_AND_CODE.sub(" ", FOLDED.sub(" ", markdown)).split())


def sentence(text: str, start: int, end: int) -> str:
    """The sentence around text[start:end] ('. ' followed by a capital ends one)."""
    ends = [m.end() for m in re.finditer(r"(?<!al)[.!?:;](?=\s+[A-Z*#(])", text)]
    left = max([e for e in ends if e <= start], default=0)
    right = min([e for e in ends if e >= end], default=len(text))
    return text[left:right]


def figures(text: str) -> list[tuple[int, int]]:
    """Spans of number+unit figures and of approximate readings, in order."""
    spans = [m.span() for m in FIGURE.finditer(text)]
    spans += [m.span() for m in APPROX.finditer(text)
              if not any(s <= m.start() < e for s, e in spans)]
    return sorted(spans)


def cited_or_spec(text: str, start: int, end: int) -> bool:
    if CITATION.search(sentence(text, start, end)):
        return True
    near = text[max(0, start - SPEC_REACH):end + SPEC_REACH]
    return bool(SPEC.search(near) or SPEC_NOUN.match(text, end))


def offending(text: str, allowed: list[str]) -> list[str]:
    """Figures in `text` (already prose()) that no rule and no allowed snippet covers."""
    covered = [(m.start(), m.end()) for snip in allowed for m in re.finditer(re.escape(snip), text)]
    bad = []
    for start, end in figures(text):
        if cited_or_spec(text, start, end):
            continue
        if any(s <= start and end <= e for s, e in covered):
            continue
        bad.append(text[max(0, start - 40):end + 20])
    return bad


def markdown_cells(path: Path) -> list[tuple[int, str]]:
    cells = json.loads(path.read_text())["cells"]
    return [(i, prose("".join(c["source"]))) for i, c in enumerate(cells)
            if c["cell_type"] == "markdown"]


def test_scanner_flags_a_typed_measurement():
    assert offending("The step takes 12 ms and the link reaches about 0.8 MB/s.", [])
    assert offending("Bucketing is 2.5x faster here.", [])
    assert offending("The median error is about 35-40% on this machine.", [])
    assert offending("The printed ratio is ~0.73.", [])
    assert len(offending("We save 60 MB and 250 us.", [])) == 2


def test_scanner_lets_cited_constants_math_and_code_through():
    assert not offending(prose("The H100 peaks at 989 TFLOP/s in bf16."), [])
    assert not offending(prose("An 80 GB GPU holds 1/35 of it."), [])
    assert not offending(prose("They reach 140 TFLOP/s per GPU (Narayanan et al. 2021)."), [])
    assert not offending(prose("The time is $t = 12\\,\\mathrm{ms}$ and `sleep(0.04 s)`."), [])
    assert not offending(prose("GPT-3 175B on 8 x 8 x 16 GPUs; GPT-3 XL has 1.3 B parameters."), [])
    assert not offending(prose("Sizes go from 1 KiB to 64 MiB."), ["Sizes go from 1 KiB to 64 MiB"])
    assert offending(prose("Sizes go from 1 KiB to 64 MiB."), ["Sizes go from"])


def test_allowed_entries_name_real_notebooks_and_reasons():
    names = {p.name for p in NOTEBOOKS}
    for notebook, snippet, reason in ALLOWED:
        assert notebook in names and FIGURE.search(snippet) and reason, (notebook, snippet)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_measured_figure_in_prose(path):
    allowed = [snip for nb, snip, _ in ALLOWED if nb == path.name]
    cells = markdown_cells(path)
    hits = [f"{path.name} cell {i}: ...{bad}..." for i, text in cells
            for bad in offending(text, allowed)]
    assert not hits, ("measured figures typed into markdown (print them from a code cell, or "
                      "add a cited constant to ALLOWED with its source):\n" + "\n".join(hits))
    stale = [snip for snip in allowed if not any(snip in text for _, text in cells)]
    assert not stale, f"ALLOWED entries for {path.name} match no prose any more: {stale}"
