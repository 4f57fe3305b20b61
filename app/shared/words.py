"""Counted nouns for every line the app builds: "1 token", "2 tokens", "0 rounds", "1 batched round"."""
from __future__ import annotations


def plural(n: float, noun: str, many: str | None = None) -> str:
    """The noun for n of it: singular for exactly 1, else `many` (default: the noun + "s")."""
    return noun if n == 1 else (many or noun + "s")


def counted(n: float, noun: str, many: str | None = None) -> str:
    """'1 token', '3 tokens', '0 tokens' (`many` for a plural that is not the noun + 's')."""
    return f"{n} {plural(n, noun, many)}"
