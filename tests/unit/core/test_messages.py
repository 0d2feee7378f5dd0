"""messages.py: the bounded pieces of a message: a preview of many values, an exception on one line."""

from __future__ import annotations

from tasks.core.messages import one_line, preview


def test_preview():
    assert preview(["a", "b"]) == "a, b"
    assert preview([]) == ""
    assert (
        preview([i / 10 for i in range(2_000)])
        == "0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, ... and 1,992 more"
    )
    assert preview(["x" * 500], limit=1) == "x" * 57 + "..."


def test_one_line():
    assert one_line(ValueError("first\n  second")) == "ValueError: first second"
    assert one_line(KeyError()) == "KeyError"
    assert len(one_line(ValueError("y" * 10_000))) == 300
