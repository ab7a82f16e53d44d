"""A value an object works out on its first read and keeps (functools.cached_property without its lock)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class once:  # read as a decorator, like functools.cached_property
    """A value worked out on the first read and kept in the instance's dict, where later reads find it first (a
    non-data descriptor): functools.cached_property without the lock Python 3.11's takes on every first read (3.12
    dropped it; about 4,000 instructions each, and a search's first ask makes a rules Context per plan its kept
    verdicts do not answer, each reading a few such values). For objects made and read by one thread."""

    def __init__(self, func: Callable[[Any], Any]):
        self.func, self.name = func, func.__name__
        self.__doc__ = func.__doc__

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.func(instance)
        return value
