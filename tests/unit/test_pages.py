"""The README is the front door: what the project is, the quick start, the commands and where to read
on. Reference belongs in docs/, which it links."""

from __future__ import annotations

import re

from tests.dependencies import REPO

README = REPO / "README.md"
README_MAX_BYTES = 15_000


def test_the_readme_stays_short():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size:,} bytes; move reference into docs/ and link it"


def test_every_page_the_readme_links_exists():
    linked = set(re.findall(r"\]\(((?:docs|deploy|examples)/[^)#]+)", README.read_text()))
    assert linked and not [path for path in sorted(linked) if not (REPO / path).exists()]
