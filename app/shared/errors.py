"""Handled errors go to the server log as well as the page: the page gets one readable sentence, the log gets the
sentence, the tab and (for an unexpected error) the traceback, so whoever runs the server can find what went wrong."""
from __future__ import annotations

import logging

# Warnings and errors reach stderr even when nobody configured logging (Python's last-resort handler), which is where
# `python app.py` and a hosted Space keep the server log.
LOG = logging.getLogger("speclab.app")


def log_handled(where: str, message: str, err: BaseException | None = None, unexpected: bool = False) -> None:
    """Log a message the page showed. `unexpected`: an error no handler anticipated, logged with its traceback."""
    if unexpected:
        LOG.error("%s: %s", where, message, exc_info=(type(err), err, err.__traceback__) if err else None)
    else:
        LOG.warning("%s: %s", where, message)
