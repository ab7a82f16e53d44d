"""Results of a pure function of objects that are never changed once made (a model's Architecture, a job's LoraSpec,
a card's LoraEngine), kept per the objects' identity: pydantic models of that kind are not hashable, and hashing their
fields would cost more than the function. Each entry holds its objects, so an id is never another object's while its
entry lives; a hit is taken only where the very same objects are asked again."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class IdentityMemo(Generic[T]):
    """compute()'s value per (the objects' identities, the other hashable arguments), bounded: cleared when full."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._entries: dict[tuple, tuple[tuple[Any, ...], T]] = {}

    def get(self, objects: tuple[Any, ...], rest: Hashable, compute: Callable[[], T]) -> T:
        key = (*map(id, objects), rest)
        hit = self._entries.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], objects, strict=True)):
            return hit[1]
        value = compute()
        if len(self._entries) >= self.limit:
            self._entries.clear()
        self._entries[key] = (objects, value)
        return value
