"""Hugging Face ZeroGPU support without depending on it.

`gpu(duration=...)` is `spaces.GPU` when the `spaces` package is importable (it is preinstalled on Spaces and
does nothing off ZeroGPU) and a no-op decorator elsewhere. `spaces` is not in requirements.txt: the app never
needs it locally. Functions it wraps must be sync generators or functions whose arguments and results are plain
data (ZeroGPU runs them in a forked worker and pickles what crosses), so they take option dicts and yield trace
dicts, never models or Trace objects with live state.

`registry_only()` says whether visitors may name any model or only the registry's (on by default on a Space).
"""
from __future__ import annotations

import os
from typing import Callable

from decoders.options import OptionsError

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


# ---- which models a visitor may load ---------------------------------------------------------------------------

REGISTRY_ONLY_SETTING = "SPECLAB_REGISTRY_ONLY"


def registry_only() -> bool:
    """Whether the target and draft boxes accept only the registry's names.

    On a public Space a free hub id or path would let any visitor make the Space download (and keep in memory) any
    model, so a Space (SPACE_ID is set there) is registry-only unless SPECLAB_REGISTRY_ONLY=0; anywhere else free
    ids stay available for local use unless SPECLAB_REGISTRY_ONLY=1.
    """
    setting = os.environ.get(REGISTRY_ONLY_SETTING, "").strip()
    if setting in ("0", "1"):
        return setting == "1"
    return bool(os.environ.get("SPACE_ID"))


def check_model_allowed(name: str | None, role: str = "target model") -> None:
    """Raise OptionsError (one line) for a name outside the registry when registry_only(); None passes."""
    if name is None or not registry_only():
        return
    from decoders.models import REGISTRY

    if name.strip().lower() not in {n.lower() for n in REGISTRY}:
        raise OptionsError(f"this server only runs the listed models, so {role} {name!r} is not available here; "
                           f"choose one of: {', '.join(REGISTRY)}")
