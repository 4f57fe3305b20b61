"""Whole numbers from the page's boxes, refused with a fix-it message instead of quietly changed.

A number box with precision 0 rounds on the server before any handler sees the value (Gradio's Number: 2.5 ran as
2, a seed of 1.5 as 2), and an emptied box (or one holding only letters, which the browser reports as empty) used to
run the default. The boxes therefore keep what was typed (precision=None) and every handler reads them here.
"""
from __future__ import annotations

from decoders.options import OptionsError


def whole_number(value, label: str, example: int | None = None) -> int:
    """`value` as an int, or OptionsError naming the box (`label`) and, for an empty box, a value to type."""
    if value is None or (isinstance(value, str) and not value.strip()):
        hint = f" (for example {example})" if example is not None else ""
        raise OptionsError(f"{label} is empty: type a whole number{hint}")
    if isinstance(value, bool):
        raise OptionsError(f"{label} must be a whole number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise OptionsError(f"{label} must be a whole number, got {value!r}") from None
    if number != number or number in (float("inf"), float("-inf")) or number != int(number):
        raise OptionsError(f"{label} must be a whole number, got {value!r}")
    return int(number)


def whole_field(values: dict, key: str, label: str, default: int) -> int:
    """A box's whole number from a handler's values: absent (an API call that leaves it out) is `default`; present,
    it must be a whole number (whole_number)."""
    return whole_number(values[key], label, default) if key in values else default
