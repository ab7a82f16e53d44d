"""README.md's accuracy table says the figures bench/README.md measured last, so the two cannot drift: each README
row names the bench rows it summarises, and each of those rows' headline (the first bold figure of its 'measured'
cell, the current one; what follows 'Before:' is history) and its row count must appear in the README row. Before
this test the README said production 10.1%, Bridge 15.3% on 37 rows and classic 5.5% while the bench README said
8.2%, 8.5% on 55 rows and 5.3%."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# README.md row (its 'what' cell's start) -> the bench/README.md rows it states (their 'what' cells' starts)
SUMMARISES = {
    "memory, Ultra-Scale Playbook sweep": ("memory, playbook nanotron sweep, first stage",),
    "memory, fits vs out-of-memory": ("fit vs out-of-memory, playbook sweep",),
    "memory, Megatron-LM functional tests": ("memory, Megatron-LM functional tests",),
    "tokens/s per GPU, playbook sweep": ("tokens/s per GPU, playbook sweep, 1,053",),
    "tokens/s per GPU, classic tables": ("tokens/s per GPU, classic tables",),
    "tokens/s per GPU, Megatron-Bridge's published runs": ("tokens/s per GPU, Megatron-Bridge published runs",),
    "tokens/s per GPU, production configurations": ("production configurations: tokens/s per GPU",),
    "tokens/s per GPU, held out": ("held out: published runs", "KempnerForge MFU scaling runs"),
    "ranking within each sweep group": ("ranking: Spearman", "ranking: our #1"),
    "expert recipes in the decision tables": ("expert recipes",),
}


def table_rows(path: Path) -> dict[str, str]:
    """A markdown file's table rows: 'what' cell -> the rest of the row (the measured cell first)."""
    rows = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if line.startswith("|") and len(cells) > 3 and not set(cells[1]) <= {"-"}:
            rows.setdefault(cells[1], " | ".join(cells[2:]))
    return rows


def row(rows: dict[str, str], start: str) -> tuple[str, str]:
    found = [(what, rest) for what, rest in rows.items() if what.startswith(start)]
    assert len(found) == 1, f"{start!r}: {len(found)} rows"
    return found[0]


def counts(text: str) -> set[str]:
    """The row counts a cell names ('55 rows', '2,013 runs'), as numbers."""
    return set(re.findall(r"(\d[\d,]*) (?:`\w+` )?(?:rows|runs)\b", text))


BENCH = table_rows(ROOT / "bench" / "README.md")
README = table_rows(ROOT / "README.md")


@pytest.mark.parametrize("readme_row", sorted(SUMMARISES))
def test_readme_states_the_bench_readmes_current_figures(readme_row):
    what, measured = row(README, readme_row)
    stated = f"{what} {measured}".replace("**", "")
    for bench_row in SUMMARISES[readme_row]:
        _, bench_measured = row(BENCH, bench_row)
        headline = re.search(r"\*\*([^*]+)\*\*", bench_measured)
        assert headline is not None, bench_row
        assert headline.group(1) in stated, f"{readme_row!r} does not say {bench_row!r}'s {headline.group(1)}"
    first_count = counts(what)
    bench_text = " ".join(" ".join(row(BENCH, b)) for b in SUMMARISES[readme_row])
    assert first_count <= counts(bench_text), f"{readme_row!r} counts {first_count - counts(bench_text)} rows"


def test_every_accuracy_row_of_the_readme_is_checked():
    section = (ROOT / "README.md").read_text().split("## How accurate it is", 1)[1].split("\n## ", 1)[0]
    rows = table_rows_text(section)
    unchecked = [r for r in rows if r.startswith(("memory", "tokens/s", "ranking", "expert recipes"))
                 and not r.startswith(tuple(SUMMARISES))]
    assert not unchecked


def table_rows_text(text: str) -> list[str]:
    return [c[1].strip() for c in (line.split("|") for line in text.splitlines() if line.startswith("|"))
            if len(c) > 3 and not set(c[1].strip()) <= {"-"} and c[1].strip() != "what"]


def test_the_bench_table_gives_todays_figure_short():
    """bench/README.md's table had grown figure cells of up to 8,275 characters, chains of 'Before: ...' in which a
    reader could not find today's figure, and three rows carried a bare '|' inside a layout string that split their
    cells. Each row now gives today's figure, the clause that moved it last and what is still off; the history is
    in bench/HISTORY.md."""
    table = (ROOT / "bench" / "README.md").read_text().split("## Today's figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("|")][2:]
    assert len(rows) > 50  # the table the test reads is the one it means
    for line in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        assert len(cells) == 6, f"{cells[0][:60]!r}: {len(cells)} cells, not 6 (a bare '|' inside a cell?)"
        assert "Before:" not in cells[1], f"{cells[0][:60]!r}: its history belongs in bench/HISTORY.md"
        assert len(cells[1]) <= 700, f"{cells[0][:60]!r}: {len(cells[1])} characters of figure"
