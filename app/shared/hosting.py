"""Hugging Face ZeroGPU support without depending on it.

`gpu(duration=...)` is `spaces.GPU` when the `spaces` package is importable (it is preinstalled on Spaces and
does nothing off ZeroGPU) and a no-op decorator elsewhere. `spaces` is not in requirements.txt: the app never
needs it locally. Functions it wraps must be sync generators or functions whose arguments and results are plain
data (ZeroGPU runs them in a forked worker and pickles what crosses), so they take option dicts and yield trace
dicts, never models or Trace objects with live state.

`registry_only()` says whether visitors may name any model or only the registry's (on by default on a Space).
`max_prompt_tokens()` is the longest prompt a visitor may send (SPECLAB_MAX_PROMPT_TOKENS; unset: no cap locally,
SPACE_MAX_PROMPT_TOKENS on a Space): one visitor's 50,000-character prompt held a shared server for minutes.
"""
from __future__ import annotations

import os
from typing import Callable

from decoders.options import OptionsError

from app.shared.words import counted

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
    from decoders.runtime.models import REGISTRY

    if name.strip().lower() not in {n.lower() for n in REGISTRY}:
        raise OptionsError(f"this server only runs the listed models, so {role} {name!r} is not available here; "
                           f"choose one of: {', '.join(REGISTRY)}")


# ---- how long a prompt a visitor may send -----------------------------------------------------------------------

MAX_PROMPT_SETTING = "SPECLAB_MAX_PROMPT_TOKENS"
# On a Space: reading 1,024 prompt tokens takes the Qwen2.5-Coder-1.5B target about 40 s on 2 CPU cores (about 8 s
# per 128-token chunk there under load, less on a quiet one) and SmolLM2 a few seconds; every example prompt is
# shorter.
SPACE_MAX_PROMPT_TOKENS = 1024


def max_prompt_tokens() -> int | None:
    """The most prompt tokens (the target's tokenizer, chat template included) one run may read; None: no cap.

    SPECLAB_MAX_PROMPT_TOKENS=N caps at N (0 or "none": no cap); unset, a Space (SPACE_ID is set there) caps at
    SPACE_MAX_PROMPT_TOKENS and anywhere else nothing is capped. A value that is not a whole number is a
    configuration error: the server's log says so and the Space default applies."""
    setting = os.environ.get(MAX_PROMPT_SETTING, "").strip().lower()
    if not setting:
        return SPACE_MAX_PROMPT_TOKENS if os.environ.get("SPACE_ID") else None
    if setting in ("0", "none"):
        return None
    try:
        cap = int(setting)
    except ValueError:
        cap = -1
    if cap < 1:
        from app.shared.errors import LOG

        LOG.error("%s=%r is not a whole number of tokens; capping prompts at %d", MAX_PROMPT_SETTING,
                  os.environ[MAX_PROMPT_SETTING], SPACE_MAX_PROMPT_TOKENS)
        return SPACE_MAX_PROMPT_TOKENS
    return cap


def check_prompt_length(n_tokens: int) -> None:
    """Raise OptionsError (one line, with the fix) for a prompt over max_prompt_tokens()."""
    cap = max_prompt_tokens()
    if cap is not None and n_tokens > cap:
        raise OptionsError(f"the prompt is {n_tokens} tokens, and this server reads at most {cap} prompt tokens per "
                           f"run ({MAX_PROMPT_SETTING}) so that one run cannot hold it for minutes; cut at least "
                           f"{counted(n_tokens - cap, 'token')} (about {4 * (n_tokens - cap)} characters of English) "
                           "from the "
                           "prompt, or run SpecLab on your own machine (no cap there by default)")
