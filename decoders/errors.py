"""The error every layer raises for a bad or incompatible choice; its message says how to fix it.

It lives alone so that the drafters, the registry and options.py can all raise it without importing each other.
"""


class OptionsError(ValueError):
    """Invalid or incompatible options; the message says how to fix them."""
