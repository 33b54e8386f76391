"""What `specrun bench` prints, on hand-made results: it fits 80 columns, the acceptance chart
stays short however long the drafts, and output that differs from plain decoding is explained."""

import io
import re
from pathlib import Path

from rich.console import Console

from specrun.bench import view
from specrun.bench.export import build_document
from specrun.bench.methods import Variant
from specrun.bench.results import Results
from specrun.bench.runner import Run
from specrun.core.events import Stats

ROOT = Path(__file__).resolve().parent.parent
KS = (4, 8, "auto", "llama.cpp")


def document(matches=True, longest=45, methods=("lookup", "draft", "hybrid"), ks=KS, speed=1234.5):
    """Three prompts; drafts of up to `longest` tokens under auto and llama.cpp, each position drafted
    by fewer drafts than the one before; `matches`: whether every greedy run matched plain's."""
    variants = [Variant("plain"), *(Variant(method, k) for method in methods for k in ks)]
    results = Results(variants, 3)
    for prompt in range(3):
        for variant in variants:
            n = 0 if variant.method == "plain" else variant.k if isinstance(variant.k, int) else longest
            drafted = [200 - 4 * i for i in range(n)]
            accepted = [d // (1 + i % 3) for i, d in enumerate(drafted)]
            stats = Stats(
                tokens=96,
                prefills=1,
                steps=40,
                drafts=drafted[0] if n else 0,
                drafted=sum(drafted),
                accepted=sum(accepted),
                drafted_by_position=drafted,
                accepted_by_position=accepted,
                generate_s=96 / speed,
                prompt_tokens=1500,
                prefilled_tokens=1500,
                prefill_s=0.1,
            )
            match = None if variant.method == "plain" else matches or prompt != 1
            results.add(Run(prompt, 0, variant, stats, match, 100.0))
    sources = [{"source": f"extraction:{i + 10}", "group": "extraction", "prompt_tokens": 1500} for i in range(3)]
    return build_document(results, {}, sources)


def printed(doc, width=80) -> list[str]:
    out = io.StringIO()
    view.show(doc, Console(file=out, width=width, color_system=None))
    return out.getvalue().splitlines()


def chart(lines: list[str]) -> dict[str, list[str]]:
    """The acceptance chart's lines, by the method-and-k line that heads them."""
    start = lines.index("Acceptance by draft position (each method at its largest k)")
    methods: dict[str, list[str]] = {}
    for line in lines[start + 1 :]:
        if line.startswith("of N drafts"):
            return methods
        if line.startswith("  pos "):
            methods[list(methods)[-1]].append(line)
        else:
            methods[line] = []
    raise AssertionError("the chart has no closing line")


def test_at_80_columns_every_line_fits_and_no_header_is_cut():
    lines = printed(document())
    assert max(map(len, lines)) <= 80
    assert not [line for line in lines if "…" in line]
    text = "\n".join(lines)
    for header in ("same as", "plain", "draft /", "verify", "speed-up", "tok/step", "k=llama.cpp"):
        assert header in text, header
    # Twelve speculative columns cannot share one 80-column table: each method gets its own (or more).
    assert per_prompt_tables(lines) >= 3
    assert sum(line.strip().startswith("Per prompt:") for line in lines) == 1


def per_prompt_tables(lines: list[str]) -> int:
    return sum(line.startswith("┏") for line in lines[: lines.index(next(line for line in lines if line.strip() == "Summary"))])


def test_the_per_prompt_table_is_one_table_where_it_fits():
    lines = printed(document(methods=("lookup",), ks=(4, 8, "auto")))
    assert per_prompt_tables(lines) == 1
    assert max(map(len, lines)) <= 80 and not [line for line in lines if "…" in line]
    assert per_prompt_tables(printed(document(), width=250)) == 1


def test_the_acceptance_chart_keeps_to_twelve_lines_a_method_however_long_the_drafts():
    for longest, last in ((9, "9"), (45, "33-45"), (64, "33-64"), (511, "33-511")):
        methods = chart(printed(document(longest=longest)))
        assert list(methods) == ["lookup k=llama.cpp", "draft k=llama.cpp", "hybrid k=llama.cpp"]
        for rows in methods.values():
            assert 1 + len(rows) <= 12  # with the method's own line
            assert rows[0].startswith("  pos 1 ") and rows[-1].startswith(f"  pos {last} ")


def test_a_range_of_positions_shows_its_acceptance_and_the_drafts_that_reached_it():
    rows = chart(printed(document(longest=20)))["lookup k=llama.cpp"]
    # Per prompt, positions 9-16 were drafted 168, 164, ..., 140 times, and a third, all, half, ... of that accepted.
    drafted = [200 - 4 * i for i in range(8, 16)]
    accepted = [d // (1 + i % 3) for i, d in zip(range(8, 16), drafted)]
    share = round(100 * sum(accepted) / sum(drafted))
    assert re.match(rf"  pos 9-16 +█+ {share}% of {3 * 168} drafts$", rows[8])  # three prompts' drafts
    assert re.match(rf"  pos 17-20 +█+ \d+% of {3 * 136} drafts$", rows[9])


def test_position_groups():
    assert view.position_groups(0) == []
    assert view.position_groups(3) == [(1, 1), (2, 2), (3, 3)]
    assert view.position_groups(12)[8:] == [(9, 12)]
    assert view.position_groups(40)[8:] == [(9, 16), (17, 32), (33, 40)]
    assert view.position_groups(511)[8:] == [(9, 16), (17, 32), (33, 511)]


def test_output_that_differs_from_plain_decoding_is_explained_under_the_summary():
    assert not [line for line in printed(document(matches=True)) if "same as plain below" in line]
    lines = printed(document(matches=False))
    start = next(i for i, line in enumerate(lines) if line.startswith("same as plain below 100%"))
    note = " ".join(" ".join(lines[start : start + 5]).split())
    for words in ("round differently", "near-tie", "not a change of distribution", "--ubatch-size 6", view.EXACTNESS_DOC):
        assert words in note, words
    assert lines.index(next(line for line in lines if line.startswith("same as plain below"))) > lines.index(
        next(line for line in lines if line.strip() == "Summary")
    )


def test_the_exactness_note_points_at_a_heading_of_the_troubleshooting_page():
    file, anchor = view.EXACTNESS_DOC.split("#")
    headings = re.findall(r"^#+ (.+)$", (ROOT / file).read_text(), flags=re.M)
    assert anchor in {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
