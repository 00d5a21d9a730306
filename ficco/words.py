"""The base of ficco's closed vocabularies written into plans, records and tables.

A :class:`Word` is a ``StrEnum`` that prints as its value, ``repr`` too: a plan's op, a
transport's traits or a record that holds a member reads, compares, hashes and serializes
exactly as the string it stands for (the golden plan digests hash ``repr``), while code
compares members (``op.direction is Direction.RECV``) and a misspelt value fails where it is
made, naming the choices (:meth:`Word.parse`).
"""

from __future__ import annotations

import enum


class Word(enum.StrEnum):
    """A closed set of words; a member prints as its value."""

    def __repr__(self) -> str:
        return repr(self.value)

    @classmethod
    def parse(cls, field: str, value: object):
        """``value`` as a member; ValueError naming ``field`` and the choices otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"{field}: {value!r}; expected one of {', '.join(m.value for m in cls)}"
            ) from None
