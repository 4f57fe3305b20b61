"""Launch the demo on a free loopback port for API and browser tests (one helper, shared)."""
from __future__ import annotations

import socket
from contextlib import ExitStack, contextmanager

RUNNING = 0  # demos launched and not yet closed (tests/conftest.py leaves their decode lock alone)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def launched_demo():
    """Yields the local URL of a queued demo; closes it afterwards."""
    from app.page import build_demo, launch_kwargs

    demo = build_demo()
    demo.queue()
    for attempt in range(3):
        try:
            _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True,
                                    quiet=True, **launch_kwargs())
            break
        except ValueError as err:
            # gradio probes its own URL with a 3-second HEAD and gives up on the first timeout: on a loaded machine
            # the new server can be slower than that, which is not what any test is about
            demo.close()
            if "localhost is not accessible" not in str(err) or attempt == 2:
                raise
    global RUNNING
    RUNNING += 1
    try:
        yield url
    finally:
        RUNNING -= 1
        demo.close()


class SharedDemo:
    """One demo for every browser module in a row (tests/conftest.py's `demo_url`): started on the first `url()`,
    closed by conftest once the next test no longer needs it, started again if a later one does."""

    def __init__(self):
        self._stack: ExitStack | None = None
        self._url: str | None = None

    def url(self) -> str:
        if self._url is None:
            self._stack = ExitStack()
            self._url = self._stack.enter_context(launched_demo())
        return self._url

    @property
    def started(self) -> bool:
        return self._url is not None

    def close(self) -> None:
        if self._stack is not None:
            stack, self._stack, self._url = self._stack, None, None
            stack.close()


def wait_for_opening_controls(page, timeout_ms: int = 120_000) -> None:
    """Wait until the page-load event has narrowed the Generate radios to the opening run's choices.

    The radios are built with every choice and narrowed on load (app/page.py); on a busy machine that reply can come
    after the page is drawn, and a click before it races it (the late reply would narrow the choices again)."""
    from app.tabs.generate.controls import OPENING, control_states

    states = control_states(OPENING.model, OPENING.method, OPENING.drafter, OPENING.rule, OPENING.temperature, None)
    # a hidden radio (the rule, under a tree drafter) renders no inputs: only the shown ones can be compared
    expected = {name: list(states[name]["choices"]) for name in ("drafter", "rule") if states[name]["visible"]}
    page.wait_for_function(
        "(e) => Object.keys(e).every(n => JSON.stringify([...document.querySelectorAll(`#sl-${n} input`)]"
        ".map(i => i.value)) === JSON.stringify(e[n]))", arg=expected, timeout=timeout_ms)
