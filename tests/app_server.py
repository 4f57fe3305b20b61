"""Launch the demo on a free loopback port for API and browser tests (one helper, shared)."""
from __future__ import annotations

import socket
from contextlib import contextmanager

RUNNING = 0  # demos launched and not yet closed (tests/conftest.py leaves their decode lock alone)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def launched_demo():
    """Yields the local URL of a queued demo; closes it afterwards."""
    from app.ui import build_demo, launch_kwargs

    demo = build_demo()
    demo.queue()
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                            **launch_kwargs())
    global RUNNING
    RUNNING += 1
    try:
        yield url
    finally:
        RUNNING -= 1
        demo.close()
