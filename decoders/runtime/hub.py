"""The Hugging Face Hub as a source of weights: a hub id loads from the local Hugging Face cache, or over the network
when the hub answers; whether it answers is known in seconds (one bounded probe, remembered for a minute), not after
transformers' retries (1+2+4+8+8 s per file; one from_pretrained of a missing id took 64 s on this machine without
a network), which used to hold the decode slot for about a minute.
"""
from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.request
from typing import Callable

from .model_files import ModelError

Progress = Callable[[str], None]


def read_hub(hub_id: str, dtype, say: Progress, fix: str):
    from transformers import AutoModelForCausalLM

    check_hub_id(hub_id, fix)  # seconds where the hub's retries took a minute (offline: 1+2+4+8+8 s, twice)
    say(f"loading {hub_id} from the Hugging Face Hub…")
    try:
        model = AutoModelForCausalLM.from_pretrained(hub_id, dtype=dtype, local_files_only=not hub_usable())
    except Exception as err:  # OSError, HTTP and offline errors all mean "not reachable from here"
        raise _hub_error(hub_id, err, fix) from None
    return model, read_hub_tokenizer(hub_id, fix), f"hub {hub_id}"


def read_hub_tokenizer(hub_id: str, fix: str):
    from transformers import AutoTokenizer

    check_hub_id(hub_id, fix)
    try:
        return AutoTokenizer.from_pretrained(hub_id, local_files_only=not hub_usable())
    except Exception as err:
        raise _hub_error(hub_id, err, fix) from None


def hub_offline() -> bool:
    """Read the variable at call time: huggingface_hub reads it once, at import, which tests cannot undo."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


HUB_PROBE_SECONDS = 3.0  # one probe of the hub's address may take this long, name lookup included
HUB_PROBE_TTL = 60.0  # seconds a probe's answer is reused (a Space whose network comes back loads again after this)
_HUB_PROBES: dict[str, tuple[float, bool]] = {}  # endpoint -> (when, reachable)


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def hub_usable() -> bool:
    """Whether a hub id may be fetched over the network now: not under HF_HUB_OFFLINE, and the hub answered."""
    return not hub_offline() and hub_reachable()


def hub_reachable() -> bool:
    """Whether the hub's endpoint answers at all (any HTTP status counts), from one HEAD request that may take at
    most HUB_PROBE_SECONDS (it runs in a thread: a name lookup has no timeout of its own); remembered for
    HUB_PROBE_TTL seconds."""
    endpoint, now = hub_endpoint(), time.monotonic()
    known = _HUB_PROBES.get(endpoint)
    if known is not None and now - known[0] < HUB_PROBE_TTL:
        return known[1]
    done, answered = threading.Event(), []

    def probe():
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=HUB_PROBE_SECONDS)
            answered.append(True)
        except urllib.error.HTTPError:
            answered.append(True)  # an HTTP status: something answered
        except (OSError, ValueError):
            pass  # no route, no name, refused, timed out, a malformed endpoint
        finally:
            done.set()

    threading.Thread(target=probe, name="hub-probe", daemon=True).start()
    reachable = done.wait(HUB_PROBE_SECONDS) and bool(answered)
    _HUB_PROBES[endpoint] = (time.monotonic(), reachable)
    return reachable


def in_hub_cache(hub_id: str) -> bool:
    """Whether the local Hugging Face cache holds this id's config (a model downloaded before loads offline)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(hub_id, "config.json"), str)
    except Exception:  # a malformed id, an unreadable cache: not cached
        return False


def check_hub_id(hub_id: str, fix: str) -> None:
    """Seconds, before any weights or the decode slot: a hub id can load only from the local Hugging Face cache or
    a hub that answers; otherwise a ModelError that says why and what to do."""
    if in_hub_cache(hub_id) or hub_usable():
        return
    why = ("hub access is off here (HF_HUB_OFFLINE=1)" if hub_offline() else
           f"this server cannot reach the Hugging Face Hub ({hub_endpoint()} did not answer within "
           f"{HUB_PROBE_SECONDS:.0f} s)")
    raise ModelError(f"cannot load {hub_id!r}: {why}, and it is not in the local Hugging Face cache. {fix} Or give "
                     "the path of a local model folder, or run SpecLab where the hub is reachable (a Space is).")


def _hub_error(hub_id: str, err: Exception, fix: str) -> ModelError:
    reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    access = ("hub access is off (HF_HUB_OFFLINE=1)" if hub_offline()
              else "the Hugging Face Hub is not reachable or has no such model")
    return ModelError(f"cannot load {hub_id!r}: {access} ({reason}). {fix}")
