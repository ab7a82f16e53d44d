"""Which of a card's release lines a framework release belongs to: a card states a per-release fact for a line ('0.2'
holds 0.2, 0.2.0 and 0.2.1, not 0.20), and every reader of such a fact (the memory convention, the attention kernel,
op-level SAC's save list, chunked attention, selective recompute, torch's CP ring, torchtitan's sequence-parallel
layout copies) matches the release here."""

from __future__ import annotations

from collections.abc import Iterable


def in_line(release: str | None, line: str) -> bool:
    """Whether `release` is the line `line` itself or one of its dotted sub-releases; False without a release."""
    if not release:
        return False
    return release == line or release.startswith(line + ".")


def in_any_line(release: str | None, lines: Iterable[str]) -> bool:
    """Whether `release` belongs to any of `lines` (in_line)."""
    return any(in_line(release, line) for line in lines)


def longest_line(release: str | None, lines: Iterable[str]) -> str | None:
    """The most specific of `lines` that `release` belongs to (the longest, '0.2.1' over '0.2'), None where none."""
    return next((line for line in sorted(lines, key=len, reverse=True) if in_line(release, line)), None)
