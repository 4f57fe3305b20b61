"""bench/memory_switch.py: the table and its input check (the real switching needs the embedded models: run it)."""
from __future__ import annotations

import pytest

from bench import memory_switch


def test_rss_is_read_from_the_kernel():
    assert 0.01 < memory_switch.rss_gb() < 1000


def test_the_table_has_one_row_per_step():
    rows = [{"step": "load smollm2-135m float32", "rss_gb": 1.5, "resident": "smollm2-135m float32 0.651 GB",
             "said": "", "seconds": 4.4},
            {"step": "unload_all()", "rss_gb": 0.49, "resident": "(none)", "said": "", "seconds": 0.0}]
    table = memory_switch.markdown(rows, 1.2)
    assert "budget 1.2 GB" in table
    assert "| load smollm2-135m float32 | 1.50 | smollm2-135m float32 0.651 GB | 4.4 |  |" in table
    assert "| unload_all() | 0.49 | (none) | 0.0 |  |" in table


def test_a_budget_that_is_not_positive_is_refused(capsys):
    with pytest.raises(SystemExit):
        memory_switch.main(["--budget-gb", "0"])
    assert "--budget-gb must be a positive number of gigabytes" in capsys.readouterr().err
