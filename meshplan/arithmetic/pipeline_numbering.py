"""A plain pipeline order's replay program (GPipe, 1F1B, interleaved 1F1B: pipeline_timeline._plain_program) numbered
in closed form rather than found by replaying the ranks in turn (Llama-3.1-70B on 64 H100: 18 shapes of up to 23 K
ops, about 6x cheaper to build).

Each rank runs w warm-up forwards, then one forward and one backward in turn, then the backwards left: forward i
(of the rank's table of (chunk, micro-batch)) at position i below w and 2i - w above, backward i at w + 2i + 1 until
the cool-down and N + i in it (N = m * v). Rank r's op at position q takes row column * p + r, its column q, or
q + p - r in the cool-down (where a backward waits for the same position on the next rank: the shift puts that rank
first); its number is row + p, so an op's previous op on its rank is the number p below (the rows between, shifted
or past the rank's last op, carry the rank's end on: they wait for nothing and take no seconds), and the program
lists no previous ops (pipeline_timeline._ends reads them p back). The program is the rows in order; it is used only
where every op's input has a smaller number
(_inputs_first: proven for the inputs between neighbouring ranks, checked one by one for the rest; a replay's ends
then read the same numbers in the same sums, whatever order the ops are numbered in), else None and the caller
replays the ranks in turn. Its columns are lists, not arrays: a first ask builds each of its shapes once, and
filling arrays from Python ints cost more than building the lists, iterating them costs more than lists too
(pipeline_timeline._program keeps none of them)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from operator import lt
from threading import Lock

_NUMBERS: list[int] = []  # numbers' ints: only ever extended, under _GROWING
_GROWING = Lock()
NUMBERS_KEPT = 1 << 18  # at most (9 MB): a search's programs have up to ~10^5 rows


def numbers(count: int) -> list[int]:
    """A list of the ints 0, 1, ... (at least `count`), kept and extended up to NUMBERS_KEPT (under a lock, so two
    threads cannot both append; a reader reads only the ints it asked for, there before): a numbered program's op
    numbers and a replay's row numbers (pipeline_timeline._numbered_ends) are copied from it, since ints past 256 are
    objects, which making (and freeing) afresh for each program cost more than copying them."""
    if len(_NUMBERS) < count:
        if count > NUMBERS_KEPT:
            return list(range(count))
        with _GROWING:
            _NUMBERS.extend(range(len(_NUMBERS), count))
    return _NUMBERS


def _wraps(m: int, v: int, g: int, last_forwards: list[int],
           first_backwards: list[int]) -> tuple[list[int], list[int], bytearray]:
    """The inputs that wrap around the ranks, per entry of a rank's table (pipeline_timeline._chunk_microbatches:
    groups of G micro-batches, the last the rest, each group's chunks in turn): of rank 0's forward (chunk 0: none;
    else the last rank's forward one chunk back, the group's length of entries before), of the last rank's backward
    (chunk 0 of the backwards, the last stage's: 0, see below; else rank 0's backward one chunk back), and whether
    that input crosses a hop (a chunk past the first). Sliced group by group from the two ranks' numbers. The last
    stage's backward waits for its own forward, which ran before it on the same rank: that forward ends no later
    than the rank's previous op (op seconds are not negative), so it cannot delay the backward and is written 0
    (none), leaving every input of the program either none or one that crosses a hop (_numbered_ends adds the hop
    to every input)."""
    if v == 1:
        return [0] * m, [0] * m, bytearray(m)
    wrap_forward: list[int] = []
    wrap_backward: list[int] = []
    crossing = bytearray()
    for start in range(0, m, g):
        size = (m if start + g >= m else start + g) - start
        first, later = start * v, (v - 1) * size  # the group's first entry (the groups before are whole)
        wrap_forward += [0] * size
        wrap_forward += last_forwards[first:first + later]
        wrap_backward += [0] * size
        wrap_backward += first_backwards[first:first + later]
        crossing += bytes(size)
        crossing += b"\x01" * later
    return wrap_forward, wrap_backward, crossing


def _slices(p: int, n: int, r: int, w: int) -> tuple[slice, ...]:
    """The rows of rank r's warm-up forwards, steady forwards, steady backwards and cool-down backwards (row: the
    op's number - 1 = column * p + r; a cool-down op's column is its position + p - r)."""
    cool = p - r
    return (slice(r, w * p + r, p), slice(w * p + r, (2 * n - w) * p + r, 2 * p),
            slice((w + 1) * p + r, (2 * n - w) * p + r, 2 * p),
            slice((2 * n - w + cool) * p + r, (2 * n + cool) * p + r, p))


def rank_rows(p: int, n: int, r: int, w: int) -> tuple[list[int], list[int]]:
    """The rows of rank r's forwards and of its backwards in plain_numbered's program, each in the rank's order (its
    warm-up then steady forwards; its steady then cool-down backwards)."""
    warm, steady_f, steady_b, cool = (range((2 * n + p) * p)[rows] for rows in _slices(p, n, r, w))
    return [*warm, *steady_f], [*steady_b, *cool]


Runs = tuple[tuple[slice, int, int], ...]  # (rows, index of seconds they take, how many rows)


def plain_numbered(pp: int, vpp: int, microbatches: int, group: int, warmups: Sequence[int],
                   padding: int | None = None) -> tuple[list[int], bytearray, list[int], tuple[int, ...], Runs] | None:
    """(dep, hopped, takes, last, runs) of pipeline_timeline._Program for a plain order of p > 1 ranks whose rank r
    warms up with warmups[r] forwards (all N for GPipe), its previous ops implicit (the number p below); None where
    the numbering does not put every input first. Rows no op takes (p per rank: past its last op and where its
    cool-down is shifted) wait for nothing and take index `padding` (no seconds; 2p, past the ranks' seconds, where
    None): they carry the rank's end to its next op. runs: the slices `takes` was written by, so a replay lays out
    each row's seconds the same way (4p slices) rather than reading takes row by row."""
    n = microbatches * vpp
    forward_numbers, backward_numbers, wraps = _op_numbers(pp, vpp, microbatches, group, warmups)
    if not _inputs_first(warmups, n, (wraps[0], forward_numbers[0]), (wraps[1], backward_numbers[pp - 1])):
        return None
    dep, hopped, takes, runs = _rows_from(0, pp, n, warmups, forward_numbers, backward_numbers, wraps, padding)
    return dep, hopped, takes, tuple(row[n - 1] for row in backward_numbers), runs


OpNumbers = tuple[list[list[int]], list[list[int]], tuple[list[int], list[int], bytearray]]


def _op_numbers(p: int, v: int, m: int, group: int, warmups: Sequence[int]) -> OpNumbers:
    """Each rank's forwards' and backwards' numbers in its order (an op's number: its row + p; rank_rows), and the
    inputs that wrap around the ranks (_wraps), all sliced from the kept ints."""
    n = m * v
    kept = numbers((2 * n + p) * p + p)
    forward_numbers: list[list[int]] = []
    backward_numbers: list[list[int]] = []
    for r, w in enumerate(warmups):
        warm, steady_f, steady_b, cool = (kept[rows.start + p:rows.stop + p:rows.step] for rows in _slices(p, n, r, w))
        forward_numbers.append(warm + steady_f)
        backward_numbers.append(steady_b + cool)
    return forward_numbers, backward_numbers, _wraps(m, v, group, forward_numbers[p - 1], backward_numbers[0])


def _rows_from(first: int, p: int, n: int, warmups: Sequence[int], forward_numbers: list[list[int]],
               backward_numbers: list[list[int]], wraps: tuple[list[int], list[int], bytearray],
               padding: int | None) -> tuple[list[int], bytearray, list[int], Runs]:
    """plain_numbered's dep, hopped, takes and runs from row `first` on (row `first` at index 0), each rank's four
    parts (_slices) written as slices: the part's rows before `first` left out (none where first is 0)."""
    wrap_forward, wrap_backward, crossing = wraps
    count = (2 * n + p) * p - first
    dep, takes = [0] * count, [2 * p if padding is None else padding] * count
    hopped = bytearray(count)
    runs: list[tuple[slice, int, int]] = []
    every = b"\x01" * n
    for r, w in enumerate(warmups):
        f_dep, f_hop = (forward_numbers[r - 1], every) if r else (wrap_forward, crossing)
        b_dep, b_hop = (backward_numbers[r + 1], every) if r < p - 1 else (wrap_backward, crossing)
        steady = n - w
        for part, (lo, hi, backward, values, hops) in zip(_slices(p, n, r, w), (
                (0, w, 0, f_dep, f_hop), (w, n, 0, f_dep, f_hop),
                (0, steady, 1, b_dep, b_hop), (steady, n, 1, b_dep, b_hop)), strict=True):
            if first:  # leave out the part's rows before `first` (-(-a // b): a / b rounded up)
                skip = max(0, -((part.start - first) // part.step))
                if lo + skip >= hi:
                    continue
                part = slice(part.start + skip * part.step - first, part.stop - first, part.step)
                lo += skip
            dep[part] = values[lo:hi]
            hopped[part] = hops[lo:hi]
            takes[part] = [2 * r + backward] * (hi - lo)
            runs.append((part, 2 * r + backward, hi - lo))
    return dep, hopped, takes, tuple(runs)


def _inputs_first(warmups: Sequence[int], n: int, *wraps: tuple[list[int], list[int]]) -> bool:
    """Whether every op's input has a smaller number. Along a rank: its positions rise, and so do their columns.
    Between neighbouring ranks r - 1 and r on one chunk: a forward (entry i at i below the warm-up w, 2i - w above)
    sits no earlier on rank r than on r - 1 where w does not rise with r, in a column no earlier (forwards are never
    shifted), and in a tie rank r - 1's row comes first; a backward (w + 2i + 1 in the steady phase, N + i in the
    cool-down) sits on rank r + 1 no later than on r, strictly earlier in the steady phase where w falls strictly
    (it does wherever both ranks have one: below N), and rank r + 1's cool-down shift p - r - 1 is smaller than r's.
    What is left: the inputs that cross from the last rank to the first and back (and the last stage's backward's
    own forward), checked one by one."""
    if any(a < b or (a == b and a < n) for a, b in pairwise(warmups)):
        return False
    return all(all(map(lt, inputs, numbers)) for inputs, numbers in wraps)


def shared_rows(pp: int, vpp: int, group: int, fewer: int, more: int, warmups_fewer: Sequence[int],
                warmups_more: Sequence[int]) -> int:
    """How many first rows the programs of one plain order at `fewer` and `more` micro-batches hold alike, the
    longer's numbered (0: none proven): the rows before column 2N - w0 (N = fewer * v, w0 the largest warm-up), where
    the warm-ups are the same and `fewer` fills its last group. There every rank's op sits at a position before its
    cool-down (2N - w_r >= 2N - w0; a cool-down op or a shifted row comes later), which holds the same table entry in
    both (the tables agree on their first N entries where `fewer` ends a whole group), so the same op; each row's
    fields follow from its op and the rows of its rank's previous op and its input, which come first (the longer's
    inputs come first: it is numbered), so they are the same rows too. The shorter's rows after them: plain_tail."""
    if fewer >= more or fewer % group or list(warmups_fewer) != list(warmups_more):
        return 0
    return (2 * fewer * vpp - max(warmups_fewer)) * pp


def plain_tail(pp: int, vpp: int, microbatches: int, group: int, warmups: Sequence[int], column: int,
               padding: int | None = None) -> tuple[list[int], bytearray, list[int], tuple[int, ...]] | None:
    """plain_numbered's rows from `column` on (row column * p and after; the ops before keep their numbers), for a
    count that fills its last group, written by the same slices (_rows_from), and each rank's last op: the rows
    between and after a rank's ops wait for nothing and take no seconds (index `padding`, as plain_numbered's). None
    where an input of those rows does not come first (the caller runs plain_numbered's program), or the last group
    is short."""
    if microbatches % group:
        return None
    p, n = pp, microbatches * vpp
    forward_numbers, backward_numbers, wraps = _op_numbers(p, vpp, microbatches, group, warmups)
    first = column * p
    dep, hopped, takes, _ = _rows_from(first, p, n, warmups, forward_numbers, backward_numbers, wraps, padding)
    if not all(map(lt, dep, numbers(first + p + len(dep))[first + p:first + p + len(dep)])):
        return None  # an input not before the op's own number (row + p)
    return dep, hopped, takes, tuple(row[n - 1] for row in backward_numbers)
