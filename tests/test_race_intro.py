"""The Race's load measurement and its intro: "busy" comes from a number, and the intro quotes what was measured."""
from __future__ import annotations

import json

from app.tabs.race import intro, load


def snap(wall: float, busy: float | None, own: float, average: float | None = 0.5) -> load.Snapshot:
    return load.Snapshot(wall=wall, load=average, busy=busy, own=own)


def test_other_processes_are_the_machine_s_busy_time_minus_the_race_s_own():
    """10 s of wall time: the machine's cores were busy 30 CPU-seconds, 19 of them the race's own threads."""
    record = load.between(snap(0.0, 100.0, 5.0, 0.4), snap(10.0, 130.0, 24.0, 1.6))
    assert abs(record["others_cores"] - 1.1) < 1e-9
    assert record["load_per_core_before"] == 0.4 and record["load_per_core_after"] == 1.6
    assert load.is_busy({**record, "cores": 2})  # 1.1 of 2 cores: busy
    assert not load.is_busy({**record, "cores": 2, "others_cores": 0.2})  # the race's own load is not "busy"
    assert "other processes used 1.1 of" in load.load_words(record)


def test_without_proc_stat_the_load_average_before_decides_and_nothing_measured_says_nothing():
    record = load.between(snap(0.0, None, 5.0, 1.8), snap(10.0, None, 24.0, 2.5))
    assert record["others_cores"] is None and load.is_busy(record)
    assert load.is_busy(None) is None and load.load_words(None) == ""


def test_a_real_snapshot_reads_this_machine():
    before = load.snapshot()
    sum(i * i for i in range(200_000))  # some CPU time of our own
    record = load.between(before, load.snapshot())
    assert record["cores"] >= 1 and record["seconds"] > 0
    assert record["others_cores"] is None or record["others_cores"] >= 0


def results(tmp_path, rows, **meta):
    path = tmp_path / "race-defaults.json"
    path.write_text(json.dumps({"machine": "x86_64, 2 threads", **meta, "prompts": {intro.DEFAULT_CASE: rows}}))
    return path


BASE = {"label": "autoregressive baseline", "speedup": 1.0}


def test_the_intro_quotes_the_last_measured_race_with_its_date_and_load(tmp_path):
    quiet = {"cores": 2, "others_cores": 0.1, "load_per_core_before": 0.3, "load_per_core_after": 0.9}
    path = results(tmp_path, [BASE, {"label": "speculative · prompt lookup · static γ=4", "speedup": 2.55,
                                     "load": quiet}], date="2026-11-27T10:00:00")
    text = intro.race_intro(path)
    assert "on 2026-11-27 on x86_64, 2 threads (a quiet machine; at most other processes used 0.1 of 2 cores" in text
    assert "prompt lookup · static γ=4 2.55× the baseline" in text and "Yours may differ" in text
    assert "about 2.5× measured on this CPU" not in text  # issue 35.4: no promise the machine may not keep


def test_a_busy_measurement_is_called_busy_and_no_file_names_no_figure(tmp_path):
    busy = {"cores": 2, "others_cores": 1.4, "load_per_core_before": 2.0, "load_per_core_after": 2.6}
    text = intro.race_intro(results(tmp_path, [BASE, {"label": "speculative · prompt lookup · cost-aware length",
                                                      "speedup": 0.4, "load": busy}]))
    assert "(a busy machine; at most other processes used 1.4 of 2 cores" in text and "0.40×" in text
    missing = intro.race_intro(tmp_path / "none.json")
    assert "×" not in missing and "depends on the machine and its load" in missing


def test_the_shipped_results_give_a_figure():
    assert "× the baseline" in intro.race_intro()


def test_a_run_from_before_load_was_measured_says_so(tmp_path):
    path = results(tmp_path, [BASE, {"label": "speculative · prompt lookup · static γ=4", "speedup": 2.55}],
                   date="2026-11-25", load_note="shared with other jobs; the load was not measured then")
    assert "on 2026-11-25 on x86_64, 2 threads (shared with other jobs; the load was not measured then): " \
           "prompt lookup · static γ=4 2.55×" in intro.race_intro(path)
