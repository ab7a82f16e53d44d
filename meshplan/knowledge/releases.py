"""Which known release's facts apply to a framework version a request names: the one version resolver that
`request.resolve` (the estimate's facts) and the adapters (the keys a render writes) share.

A framework card knows a few releases (its own `version`, its adapter's versions, its `estimated_versions`); its
version-keyed facts (`memory_convention_by_version`, the attention section's `by_version`) mark a release series
whose behaviour differs from the card's current facts. So every version maps onto one known release, whose range it
falls in:
- a release series meshplan knows (torchtitan 0.2.0, 0.2.5 -> 0.2.2, the 0.2.x facts);
- a version between the series of two known releases -> the next known release, whose facts are the card's current
  ones from the series after the previous known release on (verl 0.7 -> 0.9.1: flash attention since 0.6);
- a version newer than every known release -> the newest one, said as such;
- a version older than the card's `oldest_release` (default: the oldest known release's series), or not a version
  at all -> an error listing the known releases and the versions each stands for.
A local or pre-release suffix does not change the release ('0.2.0+cu128', '0.16.0rc1', 'v0.3.0').

A development-branch snapshot, main@YYYY-MM-DD (a published run of the main branch on that day), is estimated with
the card's facts less the dated changes made after that day (the card's `release_changes`, knowledge/release_card.py);
a card without `oldest_snapshot`, or a day before it, is refused. `predates` says whether a job's release (a known one
or such a snapshot) runs without a change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING

from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import FrameworkCard
from meshplan.knowledge.release_card import ReleaseChange

if TYPE_CHECKING:
    from meshplan.schema.plan import Job

# PEP 440's shape, ASCII digits only: an optional 'v', the release numbers, pre/post/dev tags, a local '+...' suffix.
_VERSION = re.compile(
    r"^v?(?P<numbers>[0-9]+(?:\.[0-9]+)*)"
    r"(?:[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview|post|dev)[-_.]?[0-9]*)*(?:\+[0-9a-z.]+)?$",
    re.ASCII | re.IGNORECASE,
)
DEVELOPMENT = "main"  # a framework's development branch: the newest release meshplan knows stands for it
SNAPSHOT = re.compile(r"^main@(\d{4}-\d{2}-\d{2})$")  # the development branch as it was on a day

Numbers = tuple[int, ...]


@dataclass(frozen=True)
class Release:
    """A version as the known release whose facts apply to it."""

    asked: str
    release: str  # the known release (card.known_versions())
    covers: str  # the versions that release stands for: '0.2.x', '0.6 to 0.9.x', '0.3 and later'
    exact: bool  # the version is the release itself, or a prefix of it ('0.2')
    newer: bool = False  # newer than every release meshplan knows
    changes: tuple[str, ...] = ()  # a main snapshot: the card's dated changes it runs without

    def note(self, display_name: str) -> str:
        """What the job is estimated with, for Job.notes ('' when the version is a known release)."""
        if self.exact:
            return ""
        if snapshot_day(self.asked) is not None:
            without = (f", without the changes made since ({', '.join(self.changes)}: the card's release_changes)"
                       if self.changes else " (none of the card's release_changes came after that day)")
            return (f"framework_version {self.asked}: {display_name}'s main branch on that day, estimated with the "
                    f"facts of {self.covers}{without}.")
        newer = " (newer than every release meshplan knows: their facts are assumed to hold)" if self.newer else ""
        return (f"framework_version {self.asked}: estimated with the facts of {display_name} {self.release}, which "
                f"stands for {self.covers}{newer}.")


def numbers(version: str) -> Numbers | None:
    """The release numbers of a version ('0.2.0+cu128' -> (0, 2, 0)); None when it is not a version."""
    match = _VERSION.match(version.strip())
    return tuple(int(n) for n in match["numbers"].split(".")) if match else None


def _series(n: Numbers) -> Numbers:
    return (*n, 0)[:2]


def _dotted(n: Numbers) -> str:
    return ".".join(map(str, n))


class _Known:
    """A card's known releases with release numbers, oldest first, and the oldest version its facts stand for."""

    def __init__(self, card: FrameworkCard):
        self.card = card
        self.names = card.known_versions()
        found = sorted((n, v) for v in self.names if (n := numbers(v)) is not None)
        self.releases = [v for _, v in found]
        self.nums = [n for n, _ in found]
        floor = numbers(card.oldest_release) if card.oldest_release else None
        self.floor = floor or (_series(self.nums[0]) if self.nums else None)

    def covers(self, k: int) -> str:
        """The versions release k stands for: from the series after the previous release (the floor for the first)
        to its own series, open-ended for the newest."""
        start = _series(self.nums[k - 1]) if k else self.floor
        if k:
            start = (start[0], start[1] + 1)
        own = _series(self.nums[k])
        if k == len(self.nums) - 1:
            return f"{_dotted(start)} and later"
        return f"{_dotted(own)}.x" if start == own else f"{_dotted(start)} to {_dotted(own)}.x"

    def release(self, asked: str, k: int, *, exact: bool = False, newer: bool = False) -> Release:
        return Release(asked=asked, release=self.releases[k], covers=self.covers(k), exact=exact, newer=newer)

    def error(self, asked: str, why: str) -> MeshplanError:
        listed = [f"{v} ({self.covers(k)})" for k, v in enumerate(self.releases)]
        listed += [v for v in self.names if v not in self.releases]
        default = self.card.adapter.default_version if self.card.adapter else self.card.version
        snapshot = (f"; a main-branch snapshot main@YYYY-MM-DD from {self.card.oldest_snapshot} on"
                    if self.card.oldest_snapshot else "")
        return MeshplanError(
            f"framework_version {asked!r}: {why}.",
            fix=f"{self.card.display_name} releases meshplan knows, with the versions each stands for: "
                f"{', '.join(listed)}{snapshot}; or leave framework_version out ({default}).",
        )

    def snapshot(self, asked: str, day: str) -> Release:
        """The main branch on `day`: the card's facts (its newest release's) less the changes dated after it."""
        try:
            date.fromisoformat(day)
        except ValueError:
            raise self.error(asked, f"{day} is not a calendar day (main@YYYY-MM-DD)") from None
        oldest = self.card.oldest_snapshot
        if oldest is None:
            raise self.error(asked, f"meshplan estimates no {self.card.display_name} main-branch snapshot (its card "
                                    "dates none of the changes its estimate reads)")
        if day < oldest:
            raise self.error(asked, f"before {oldest}, the oldest {self.card.display_name} main-branch day meshplan's "
                                    f"facts stand for ({self.card.oldest_snapshot_why or 'the card'})")
        newest = max(self.names, key=lambda v: numbers(v) or ())
        changes = tuple(f"{c.change} {c.commit} {c.date}" for c in self.card.release_changes if day < c.date)
        return Release(asked=asked, release=asked, covers=f"{self.card.display_name} {newest}", exact=False,
                       changes=changes)


def resolve_release(card: FrameworkCard, version: str) -> Release:
    """The known release of `card` whose facts apply to `version` (the module docstring says which)."""
    known = _Known(card)
    if version in known.names:
        k = known.releases.index(version) if version in known.releases else None
        return known.release(version, k, exact=True) if k is not None else Release(version, version, version, True)
    prefix = version.removesuffix(".x").removesuffix(".*")
    hits = [k for k, v in enumerate(known.releases) if v.startswith(prefix + ".")]
    if hits:  # a prefix of known releases ('0.2', '0.2.x'): the newest of them
        return known.release(version, hits[-1], exact=True)
    if not known.nums:
        raise known.error(version, f"{card.display_name} is known only as the release(s) listed")
    if (day := snapshot_day(version)) is not None:
        return known.snapshot(version, day)
    if version == DEVELOPMENT:
        return known.release(version, len(known.nums) - 1, newer=True)
    asked = numbers(version)
    if asked is None:
        raise known.error(version, "not a version (release numbers such as 0.2.0, optionally with a suffix such as "
                                   "rc1 or +cu128)")
    same = [k for k, n in enumerate(known.nums) if _series(n) == _series(asked)]
    if same:
        return known.release(version, same[-1])
    if asked > known.nums[-1]:
        return known.release(version, len(known.nums) - 1, newer=True)
    if known.floor is not None and asked < known.floor:
        raise known.error(version, f"older than {_dotted(known.floor)}, the oldest {card.display_name} release "
                                   "meshplan's facts stand for")
    return known.release(version, next(k for k, n in enumerate(known.nums) if n > asked))


def snapshot_day(version: str | None) -> str | None:
    """The day of a main-branch snapshot (main@YYYY-MM-DD -> YYYY-MM-DD); None for any other version."""
    found = SNAPSHOT.match(version or "")
    return found[1] if found else None


def predates(version: str | None, change: ReleaseChange) -> bool:
    """Whether a job's release (Job.framework_version: a known release or a main snapshot, resolve_release's) runs
    without `change`: a snapshot dated before the change's commit, a release older than the first one that has it.
    None (the card's own release, which has every change its card lists) never does."""
    day = snapshot_day(version)
    if day is not None:
        return day < change.date
    asked, first = numbers(version or ""), numbers(change.release)
    return asked is not None and first is not None and asked < first


def kernel_before_change(card: FrameworkCard, version: str | None, model_type: str) -> str | None:
    """The attention kernel a `model_type` model's own code built whatever the backend on a release that predates the
    card's model_te_attention change (its kernel_before: NeMo AutoModel's gpt-oss on FlexAttention until 2b7c02cfc),
    else None."""
    change = card.release_change("model_te_attention")
    if change is None or not change.acts_on(model_type) or not predates(version, change):
        return None
    return change.kernel_before


def job_attention_kernel(job: Job, backend: str = "auto", zero_stage: int | None = None) -> str | None:
    """The flash kernel the job's framework runs (estimate/attention_time.attention_efficiency's choice, rule AT003's
    kernel; None: the card names none): the model's own (attention.model_kernels, kernel_before_change), else auto's
    on the GPU's arch for the engine of `zero_stage`, else the named backend's, each read through attention.on_arch."""
    fw = job.card
    card = fw.attention
    if card is None:
        return None
    engine = fw.engine_at(zero_stage) if zero_stage is not None else None
    own = card.model_kernels.get(job.model.model_type) or kernel_before_change(
        fw, job.framework_version, job.model.model_type)
    if own is not None:
        return own
    if backend == "auto":
        return card.kernel_for(job.framework_version, job.gpu.arch, engine=engine, mla=job.model.mla is not None)
    return card.backend_kernel(backend, job.gpu.arch)
