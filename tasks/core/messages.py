"""Bounded one-line text for error messages: however large the input, a message stays short."""

from __future__ import annotations

from collections.abc import Sequence

PREVIEW_ITEMS = 8
ITEM_CHARS = 60
LINE_CHARS = 300


def shorten(text: str, limit: int = ITEM_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def preview(items: Sequence[object], limit: int = PREVIEW_ITEMS) -> str:
    """'a, b, c', or 'a, b, ... and 1,992 more' when there are more than `limit` items."""
    shown = ", ".join(shorten(str(item)) for item in items[:limit])
    rest = len(items) - limit
    return f"{shown}, ... and {rest:,} more" if rest > 0 else shown


def one_line(error: BaseException, limit: int = LINE_CHARS) -> str:
    """An exception as 'Type: message' on one bounded line."""
    text = " ".join(str(error).split())
    name = type(error).__name__
    return shorten(f"{name}: {text}" if text else name, limit)


class InputError(ValueError):
    """A workflow input that cannot work; the message names the input, the value and the fix."""


def raise_for(found: list[str]) -> None:
    """Raise one InputError listing every bad input, so a user fixes them all at once."""
    if found:
        raise InputError("invalid workflow inputs:\n  " + "\n  ".join(found))
