"""Hugging Face ZeroGPU support without depending on it.

`gpu(duration=...)` is `spaces.GPU` when the `spaces` package is importable (it is preinstalled on Spaces and
does nothing off ZeroGPU) and a no-op decorator elsewhere. `spaces` is not in requirements.txt: the app never
needs it locally. Functions it wraps must be sync generators or functions whose arguments and results are plain
data (ZeroGPU runs them in a forked worker and pickles what crosses), so they take option dicts and yield trace
dicts, never models or Trace objects with live state.
"""
from __future__ import annotations

from typing import Callable

try:  # pragma: no cover - depends on the host
    import spaces as _spaces
except Exception:  # ImportError, or a spaces build that fails to import off its platform
    _spaces = None


def gpu(duration: int = 120) -> Callable[[Callable], Callable]:
    """Decorator: request a ZeroGPU slot for `duration` seconds; identity when not on ZeroGPU."""
    if _spaces is not None:
        return _spaces.GPU(duration=duration)
    return lambda fn: fn


ON_SPACES = _spaces is not None
