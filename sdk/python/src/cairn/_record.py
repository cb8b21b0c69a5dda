"""Value classes: fields named by __slots__, compared and shown by value.

Written out rather than made with dataclasses: `import dataclasses` brings
`inspect` (and with it ast, dis and tokenize), ~8 ms of every Python
agent's start on a small machine, where an agent starts at every attempt."""

from typing import Any


class Record:
    """Equal to a record of the same class with equal fields; shown as
    Name(field=value, ...). A subclass lists its fields in __slots__ and sets
    them in __init__."""

    __slots__: tuple[str, ...] = ()

    def _fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Record)
        return self._fields() == other._fields()

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__slots__)
        return f"{type(self).__name__}({shown})"


class FrozenRecord(Record):
    """A Record whose fields cannot change once __init__ set them (with
    _set), and which may be hashed."""

    __slots__ = ()

    def _set(self, field: str, value: Any) -> None:
        object.__setattr__(self, field, value)

    def __setattr__(self, field: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot set {field!r}")

    def __delattr__(self, field: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot delete {field!r}")

    def __hash__(self) -> int:
        return hash((type(self), self._fields()))
