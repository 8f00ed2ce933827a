"""The error the frontends raise for a model they cannot translate, and its one-line cause."""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """The model uses something the importer cannot translate (named in the message)."""


def first_line(err: BaseException) -> str:
    """The first line of an error's message (its type's name when it has none)."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


__all__ = ["UnsupportedModelError", "first_line"]
