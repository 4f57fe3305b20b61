"""Loading the models a run needs, for every tab: progress messages placed on a bar, errors the page can show."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from decoders.api import draft_for, load_draft as api_load_draft
from decoders.options import DecodeOptions
from decoders.trace import Trace

from app.shared.decode_slot import DECODE_SLOT, Turn
from app.shared.hosting import check_prompt_length, max_prompt_tokens

# Where each loading step sits on the progress bar, for loaders that report messages without a fraction. The
# one-time conversion dominates a first load; a cached load is the "loading from cache" step alone.
LOAD_PHASES = (("joining", 0.05), ("casting", 0.2), ("converting", 0.2), ("loading from cache", 0.3),
               ("saving", 0.8), ("moving to", 0.9), ("float32 matmuls packed", 0.95), ("ready", 1.0))

class LoadCancelled(RuntimeError):
    """A load stopped at its next step: Stop was pressed, or the page that asked for it was closed."""


def _models_module():
    try:
        from decoders.runtime import models
    except ImportError as err:  # the registry module is missing from this checkout
        raise RuntimeError(f"the model registry (decoders/runtime/models.py) is not available: {err}") from None
    return models


def model_error_types() -> tuple[type[BaseException], ...]:
    try:
        return (_models_module().ModelError,)
    except RuntimeError:
        return ()


def draft_name(options: DecodeOptions) -> str | None:
    """The draft model this run needs (None when it needs none); no pairing raises OptionsError."""
    return draft_for(options)


def load(name: str, options: DecodeOptions, report: Callable[[float, str], None] | None = None):
    """decoders.runtime.models.load_model with its progress callback forwarded to `report(fraction, message)`."""
    return _models_module().load_model(name, dtype=options.dtype, device=options.device,
                                       progress=_progress(name, report))


def _progress(name: str, report: Callable[[float, str], None] | None):
    """decoders.runtime.models' progress callback, placed on the page's bar as `report(fraction, message)`."""
    def progress(*args, **kwargs):
        fraction = next((a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)), None)
        message = next((a for a in args if isinstance(a, str)), kwargs.get("message", ""))
        if report is not None:
            report(fraction if fraction is not None else load_fraction(message),
                   f"{name}: {message}" if message else f"loading {name}")

    return progress


def load_fraction(message: str) -> float | None:
    """Where a loader message sits on the progress bar (LOAD_PHASES); None (a spinner) for unknown steps."""
    text = message.lower()
    return next((fraction for phase, fraction in LOAD_PHASES if text.startswith(phase)), None)


def load_draft(name: str, options: DecodeOptions, report: Callable[[float, str], None] | None = None):
    """The draft as the API loads it for these options (decoders.api.load_draft: int8 where draft_quant and this
    machine say so), so a tab runs the very draft the API, the CLI and bench would run."""
    return api_load_draft(name, options, _progress(name, report))


def load_models(options: DecodeOptions, report=None, stop: Callable[[], bool] | None = None
                ) -> tuple[object, object | None]:
    """The run's target and draft (None when it needs none). With `stop`, every step of the loads first asks whether
    the run is still wanted and ends the load with LoadCancelled when not: a closed page's load (app/page.py) used to
    run to its end, a first conversion included, while the next visitor waited behind it."""
    report = _stoppable(report, stop)
    if report is not None:
        report(0.0, f"loading {options.model}")
    target = load(options.model, options, report)
    name = draft_name(options)
    draft = load_draft(name, options, report) if name else None
    return target, draft


def _stoppable(report, stop: Callable[[], bool] | None):
    if stop is None:
        return report

    def checked(fraction, message: str) -> None:
        if stop():
            raise LoadCancelled("Stopped while loading the model (at its next step); nothing ran.")
        if report is not None:
            report(fraction, message)

    return checked


@contextlib.contextmanager
def loaded(*runs: DecodeOptions, report=None, turn: Turn | None = None, stop: Callable[[], bool] | None = None):
    """Load every model these runs need inside the decode slot (after `turn`'s wait in line, when given), then keep
    them held until the block ends. `stop` (the run's Stop, which a closed page also sets: app/page.py) ends the load
    at its next step with LoadCancelled.

    Inside the slot: a load is a minute of CPU work on a first conversion, and it must not run while another tab's
    race is being timed. Held afterwards: nothing can evict them (decoders/runtime/residency.py) between this load and the
    decode that uses them, which takes the slot again for itself (and loads them there again: cache hits)."""
    with DECODE_SLOT.hold(what="a model load", turn=turn):
        pairs = [load_models(options, report, stop) for options in runs]
    with contextlib.ExitStack() as holding:
        for target, draft in pairs:
            holding.enter_context(_models_module().hold(target, draft))
        yield pairs


def loaded_run(options: DecodeOptions, decode: Callable[[object, object | None], Iterator]) -> Iterator:
    """A run's decoder that loads its models first, so that the slot iterating it covers the load too (after
    `loaded`, cache hits): `decode(target, draft)` is the decoder proper."""
    target, draft = load_models(options)
    yield from decode(target, draft)


def check_loadable(name: str) -> None:
    """decoders.runtime.models.check_loadable: seconds, no weights (tests that load tiny models by other names skip it)."""
    _models_module().check_loadable(name)


def check_before_waiting(prompts: str | list[str], *runs: DecodeOptions) -> None:
    """What can fail in seconds, before a run waits for the decode slot: a model that cannot load from here (a hub id
    with no hub to send it) and a prompt longer than this server reads (hosting.max_prompt_tokens)."""
    models = _models_module()
    for name in dict.fromkeys(name for options in runs for name in (options.model, draft_name(options)) if name):
        check_loadable(name)
    if max_prompt_tokens() is None:
        return
    for options in runs[:1]:  # every run of a race reads the prompt with the same target's tokenizer
        tokenizer = models.load_tokenizer(options.model).tokenizer
        for prompt in [prompts] if isinstance(prompts, str) else prompts:
            check_prompt_length(len(models.encode_prompt(tokenizer, prompt, options.chat)))


def dtype_line(trace: Trace, why: bool = False) -> str:
    """The dtype a run used; with `why` and dtype="auto", the loader's one-line reason for it."""
    target = trace.models.get("target") or {}
    dtype = target.get("dtype", "?")
    if not why or (trace.options or {}).get("dtype") != "auto":
        return dtype
    try:
        decision = _models_module().dtype_decision(target.get("device", "cpu"))
    except Exception:  # a loader without dtype_decision, or a device this process cannot see
        return dtype
    return f"{dtype}: auto chose it because {decision.why}" if decision.name == dtype else dtype
