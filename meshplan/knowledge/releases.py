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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import FrameworkCard

# PEP 440's shape, ASCII digits only: an optional 'v', the release numbers, pre/post/dev tags, a local '+...' suffix.
_VERSION = re.compile(
    r"^v?(?P<numbers>[0-9]+(?:\.[0-9]+)*)"
    r"(?:[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview|post|dev)[-_.]?[0-9]*)*(?:\+[0-9a-z.]+)?$",
    re.ASCII | re.IGNORECASE,
)
DEVELOPMENT = "main"  # a framework's development branch: the newest release meshplan knows stands for it

Numbers = tuple[int, ...]


@dataclass(frozen=True)
class Release:
    """A version as the known release whose facts apply to it."""

    asked: str
    release: str  # the known release (card.known_versions())
    covers: str  # the versions that release stands for: '0.2.x', '0.6 to 0.9.x', '0.3 and later'
    exact: bool  # the version is the release itself, or a prefix of it ('0.2')
    newer: bool = False  # newer than every release meshplan knows

    def note(self, display_name: str) -> str:
        """What the job is estimated with, for Job.notes ('' when the version is a known release)."""
        if self.exact:
            return ""
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
        return MeshplanError(
            f"framework_version {asked!r}: {why}.",
            fix=f"{self.card.display_name} releases meshplan knows, with the versions each stands for: "
                f"{', '.join(listed)}; or leave framework_version out ({default}).",
        )


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
