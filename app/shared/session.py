"""One browser tab's runs, as the Stop button needs to know them.

A RunSession lives in a gr.State: Gradio keeps one per browser session on the server (the browser never holds
it), hands the same object to every event of that session, and drops it with the session, so nothing is kept at
module level and nothing outlives its visitor.

Stop has one handler and two ways to reach a run. Gradio's `cancels=[run]` takes an API client's queued or
running job (gradio_client posts /cancel). The page's Stop button does not post /cancel in Gradio 6.31 (checked in
chromium: no request leaves the page), so the session also carries the request: a running run sees it between
rounds and returns, and a queued run that begins after a Stop returns at once. Either way the run's generator
closes, whose `finally` closes the decoder and frees its caches. (An API client that cancels its own queued job
and then also calls /stop makes its next run return at once: the session cannot see that Gradio dropped the job.)
"""
from __future__ import annotations

import threading

from decoders import SuffixStore
from decoders.trace import Trace


class EarlierOutputs:
    """This visitor's finished Generate outputs, one bounded store per target model (token ids mean nothing to
    another tokenizer), which suffix decoding drafts from (decoders/drafters/suffix.py). It lives in the session, so
    one visitor's outputs never reach another's runs, and goes with the session; Clear empties it."""

    def __init__(self) -> None:
        self.stores: dict[str, SuffixStore] = {}

    def store(self, model: str) -> SuffixStore:
        return self.stores.setdefault(model, SuffixStore())

    def remember(self, trace: Trace) -> None:
        """A finished run's output (any method: repeated work is what suffix decoding copies)."""
        model = (trace.options or {}).get("model")
        if model and trace.output_ids and trace.stop_reason != "cancelled":
            self.store(model).add(trace.output_ids, trace.output_text)

    def clear(self) -> None:
        self.stores.clear()


def stop_runs_of_page(demo, session_hash: str | None) -> int:
    """A page was closed (Gradio's unload, app/page.py): every run of its tabs stops as Stop would stop it, a model
    load at its next step included (app/shared/loading.py). Gradio keeps each tab's RunSession in the page's server
    state, so that is where they are found. Returns how many were running or queued."""
    holder = getattr(getattr(demo, "server_app", None), "state_holder", None)
    page = getattr(holder, "session_data", {}).get(session_hash) if holder is not None and session_hash else None
    if page is None:
        return 0
    stopped = 0
    # state_data: every gr.State value the page has used (state_components lists only those an event wrote)
    for session in [value for value in dict(getattr(page, "state_data", {})).values() if isinstance(value, RunSession)]:
        if session.running or session.queued:
            session.request_stop()
            stopped += 1
    return stopped


class RunSession:
    """The counters change from two threads (the Run event's worker and the Stop event's), so every change of
    queued / skip / running happens under one lock: a Stop between a run's `admit` and its `begin` must neither
    lose the queued run nor let it decode."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.queued = 0  # runs this tab asked for that have not begun (counted when Gradio accepts the request)
        self.running = False
        self.latest: Trace | None = None  # the running (or last) run's latest round, for Stop to show
        self.idle = threading.Event()  # set whenever no run of this tab is executing
        self.idle.set()
        self.stop_requested = threading.Event()  # Stop pressed while a run executes: it returns at the next round
        self.skip = 0  # runs queued before a Stop: each returns without decoding when it begins
        self.earlier = EarlierOutputs()  # what suffix decoding may copy from this visitor's earlier runs

    def __deepcopy__(self, memo) -> "RunSession":  # Gradio copies the initial value once per new session
        return RunSession()

    def admit(self) -> None:
        """A run was accepted into the queue (it may wait there behind other visitors' runs)."""
        with self._lock:
            self.queued += 1

    def begin(self) -> bool:
        """A run starts executing; False when a Stop came while it waited in the queue (it should not decode)."""
        with self._lock:
            self.queued = max(self.queued - 1, 0)
            if self.skip:
                self.skip -= 1
                return False
            self.running, self.latest = True, None
            self.stop_requested.clear()
            self.idle.clear()
            return True

    def end(self) -> None:
        with self._lock:
            self.running = False
            self.idle.set()

    def request_stop(self) -> int:
        """Stop: the running run returns at its next round; queued ones will not decode. Returns how many queued."""
        with self._lock:
            count, self.queued = self.queued, 0
            self.skip += count
            if self.running:
                self.stop_requested.set()
            return count
