"""Load test: several gradio_client users against the app on loopback for a few minutes (bounded).

    HF_HUB_OFFLINE=1 flock /tmp/speclab-heavy.lock .venv/bin/python -m bench.load            # 8 users, ~3 min
    .venv/bin/python -m bench.load --users 2 --minutes 0.5 --stem load-tiny                   # a quick check

Starts the app as app.py does (queue of 32) in a child process bound to 127.0.0.1, then each user (its own Client,
so its own session) loops over Generate (/run), Race (/race), Beams (/beams_run) and Whisper (/whisper_transcribe),
starting at a different one, until the time is up; requests in flight then get a grace period to finish. Each
request ends as one of: ok, busy (a clear "busy"/"queue is full" message), message (another clear message in the
tab's error box), traceback (traceback text reached the client: a bug), error (any other exception: a bug),
timeout (no answer within the bound). An endpoint missing from the server's API is reported, not fatal (the tabs
change under other work). The server's RSS (with its children) is sampled every second and compared with the
memory budget that decoders/runtime/residency.py applies (the same environment, the same machine).

Writes bench/results/<stem>.json (every request, the RSS samples) and <stem>.md (the table).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SERVER_LOG = Path(tempfile.gettempdir()) / "speclab-load-server.log"  # the app server's stderr, for a failed start
CLIP = ROOT / "assets" / "audio" / "librivox-0880.wav"  # 3 s of LibriVox speech (assets/audio/clips.json)
BUSY = re.compile(r"busy|queue is full|too many|already running|wait", re.I)
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|File \"[^\"]+\", line \d+")
PROMPTS = ("Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape.",
           "Write a Python function that reverses a string.", "Explain in two sentences why the sky is blue.")


@dataclass(frozen=True)
class Endpoint:
    """One tab's API event and the inputs it gets; `overrides` match a parameter's name or its label."""
    tab: str
    api_name: str
    overrides: tuple[tuple[str, object], ...] = ()


def endpoints(tokens: int) -> list[Endpoint]:
    """Short runs (a few seconds each when alone) so that the queue, not one run, sets the pace."""
    return [Endpoint("Generate", "/run", (("max_new_tokens", tokens),)),
            Endpoint("Race", "/race", (("max_new_tokens", max(4, tokens // 2)),)),
            Endpoint("Beams", "/beams_run", (("max tokens", tokens), ("max_tokens", tokens))),
            Endpoint("Whisper", "/whisper_transcribe", (("Decoders", ["greedy", "beam"]), ("decoders", ["greedy", "beam"])))]


@dataclass
class Request:
    user: int
    tab: str
    start_s: float  # since the load began
    seconds: float
    outcome: str  # ok | busy | message | traceback | error | timeout
    detail: str = ""


# ---------------------------------------------------------------- the server

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(port: int) -> None:
    """The child process: the app exactly as app.py serves it, on loopback only."""
    from app.page import build_demo, launch_kwargs

    build_demo().queue(max_size=32).launch(server_name="127.0.0.1", server_port=port, quiet=True, **launch_kwargs())


def start_server(port: int, budget_gb: float | None) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONPATH": str(ROOT)}
    if budget_gb is not None:
        env["SPECLAB_MEMORY_BUDGET_GB"] = str(budget_gb)
    return subprocess.Popen([sys.executable, "-m", "bench.load", "--serve", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=open(SERVER_LOG, "w"))


def stop_server(server: subprocess.Popen) -> int | None:
    """Ctrl-C, as a person ends app.py: its exit status (0 is clean; 134 was the abort of issue 23 item 5, a run
    still inside PyTorch while the interpreter finalized). None: still running after the exit hook's wait, killed."""
    from app.shared.decode_slot import EXIT_WAIT

    server.send_signal(signal.SIGINT)
    try:
        return server.wait(EXIT_WAIT + 30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        return None


def wait_until_up(url: str, server: subprocess.Popen, seconds: float = 300) -> None:
    import urllib.request

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the app server exited with {server.returncode} (see {SERVER_LOG})")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"the app server did not answer on {url} within {seconds:.0f} s")


class RssSampler(threading.Thread):
    """The server's resident memory (its children included), once a second."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.samples, self.done = pid, [], threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        import psutil

        process = psutil.Process(self.pid)
        while not self.done.is_set():
            try:
                rss = sum(p.memory_info().rss for p in [process, *process.children(recursive=True)])
            except psutil.Error:
                break
            self.samples.append((round(time.monotonic() - self.t0, 1), round(rss / 1e9, 3)))
            self.done.wait(1.0)


# ---------------------------------------------------------------- the users

def api_parameters(client) -> dict[str, list[dict]]:
    return {name: info["parameters"] for name, info in
            client.view_api(print_info=False, return_format="dict")["named_endpoints"].items()}


def arguments(endpoint: Endpoint, parameters: list[dict], prompt: str) -> list:
    """Every parameter's default, the endpoint's overrides, a file for an Audio input, a prompt for the first Textbox
    that has a default (the prompt box on every tab), the clip's reference for one that has none (Whisper's)."""
    from gradio_client import handle_file

    overrides = dict(endpoint.overrides)
    reference = json.loads((CLIP.parent / "clips.json").read_text())[CLIP.name]["reference"]
    values, prompted = [], False
    for p in parameters:
        name, label, component = p.get("parameter_name"), p.get("label"), p.get("component")
        if name in overrides or label in overrides:
            values.append(overrides[name if name in overrides else label])
        elif component == "Audio":
            values.append(handle_file(str(CLIP)))
        elif component == "Textbox" and p.get("parameter_has_default") and not prompted:
            values.append(prompt if endpoint.tab != "Whisper" else p.get("parameter_default"))
            prompted = True
        elif component == "Textbox" and not p.get("parameter_has_default"):
            values.append(reference if endpoint.tab == "Whisper" else "")
        else:
            values.append(p.get("parameter_default"))
    return values


def classify(result) -> tuple[str, str]:
    """A finished request's outcome from its outputs: the tabs put a message in their error box (output 2)."""
    text = json.dumps(result, default=str)
    if TRACEBACK.search(text):
        return "traceback", TRACEBACK.search(text).group(0)
    error = result[1] if isinstance(result, (list, tuple)) and len(result) > 1 else ""
    error = re.sub(r"<[^>]+>", "", error) if isinstance(error, str) else ""
    if error.strip():
        return ("busy" if BUSY.search(error) else "message"), error.strip()[:200]
    return "ok", ""


def user(index: int, url: str, plan: list[Endpoint], until: float, hard_stop: float, t0: float,
         log: list[Request], missing: set[str], lock: threading.Lock) -> None:
    from gradio_client import Client

    client = Client(url, verbose=False)
    parameters = api_parameters(client)
    rng = random.Random(index)
    turn = index
    while time.monotonic() < until:
        endpoint = plan[turn % len(plan)]
        turn += 1
        if endpoint.api_name not in parameters:
            with lock:
                missing.add(endpoint.api_name)
            if all(e.api_name not in parameters for e in plan):
                return
            continue
        start = time.monotonic()
        outcome, detail = run_one(client, endpoint, parameters[endpoint.api_name], rng.choice(PROMPTS), hard_stop)
        with lock:
            log.append(Request(index, endpoint.tab, round(start - t0, 2), round(time.monotonic() - start, 2),
                               outcome, detail))


def run_one(client, endpoint: Endpoint, parameters: list[dict], prompt: str, hard_stop: float) -> tuple[str, str]:
    job = client.submit(*arguments(endpoint, parameters, prompt), api_name=endpoint.api_name)
    try:
        result = job.result(timeout=max(1.0, hard_stop - time.monotonic()))
    except TimeoutError:
        job.cancel()
        return "timeout", f"no answer before the load's hard stop ({endpoint.api_name})"
    except Exception as error:  # noqa: BLE001 - every failure is a finding, classified by its text
        text = f"{type(error).__name__}: {error}"
        if TRACEBACK.search(text):
            return "traceback", text[:300]
        return ("busy" if BUSY.search(text) else "error"), text[:300]
    return classify(result)


# ---------------------------------------------------------------- the report

def summary(log: list[Request], samples: list[tuple[float, float]], budget_gb: float, args, missing: set[str],
            wall_s: float) -> dict:
    tabs = {}
    for tab in ("Generate", "Race", "Beams", "Whisper"):
        rows = [r for r in log if r.tab == tab]
        done = sorted(r.seconds for r in rows if r.outcome in ("ok", "busy", "message"))
        tabs[tab] = {"requests": len(rows), **{k: sum(r.outcome == k for r in rows) for k in
                                               ("ok", "busy", "message", "traceback", "error", "timeout")},
                     "median_s": round(statistics.median(done), 1) if done else None,
                     "p95_s": round(done[min(len(done) - 1, int(0.95 * len(done)))], 1) if done else None,
                     "max_s": round(done[-1], 1) if done else None}
    peak = max((gb for _, gb in samples), default=0.0)
    bad = sum(t["traceback"] + t["error"] + t["timeout"] for t in tabs.values())
    return {"users": args.users, "minutes": args.minutes, "tokens": args.tokens, "wall_s": round(wall_s, 1),
            "tabs": tabs, "missing_endpoints": sorted(missing), "peak_rss_gb": peak,
            "start_rss_gb": samples[0][1] if samples else None, "memory_budget_gb": round(budget_gb, 2),
            "within_budget": peak <= budget_gb, "every_request_answered_clearly": bad == 0 and not missing,
            "machine": machine()}


def machine() -> dict:
    import platform

    return {"cpus": os.cpu_count(), "ram_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1),
            "python": platform.python_version()}


def markdown(s: dict) -> str:
    lines = [f"# Load test: {s['users']} users for {s['minutes']} min on loopback (bench/load.py)", "",
             f"{s['machine']['cpus']} CPUs, {s['machine']['ram_gb']} GB RAM; wall {s['wall_s']} s including the "
             f"grace period for requests in flight. Outcomes: ok; busy = a clear busy/queue-full message; message = "
             f"another clear message in the tab's error box; traceback, error, timeout = failures.", "",
             "| tab | requests | ok | busy | message | traceback | error | timeout | median s | p95 s | max s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for tab, t in s["tabs"].items():
        lines.append(f"| {tab} | {t['requests']} | {t['ok']} | {t['busy']} | {t['message']} | {t['traceback']} | "
                     f"{t['error']} | {t['timeout']} | {t['median_s']} | {t['p95_s']} | {t['max_s']} |")
    lines += ["", f"Server RSS (with children): {s['start_rss_gb']} GB when the load began, peak {s['peak_rss_gb']} GB;"
              f" memory budget for resident models {s['memory_budget_gb']} GB (decoders/runtime/residency.py): "
              f"{'within' if s['within_budget'] else 'OVER'} the budget.",
              f"Missing endpoints: {', '.join(s['missing_endpoints']) or 'none'}. Every request answered clearly: "
              f"{'yes' if s['every_request_answered_clearly'] else 'NO'}."]
    if "server_exit" in s:
        lines.append(f"Server ended with Ctrl-C (SIGINT) after the load: exit status {s['server_exit']}"
                     f"{' (clean)' if s['server_exit'] == 0 else ''}.")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=3.0, help="how long users keep sending requests")
    parser.add_argument("--grace", type=float, default=240.0, help="seconds requests in flight get afterwards")
    parser.add_argument("--tokens", type=int, default=24, help="new tokens per Generate/Beams run (Race: half)")
    parser.add_argument("--budget-gb", type=float, default=None, help="the server's memory budget (default: its own)")
    parser.add_argument("--stem", default="load")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve)
        return {}
    if not (1 <= args.users <= 32 and 0 < args.minutes <= 30):
        parser.error("--users must be 1..32 and --minutes 0..30 (the load test is bounded)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.budget_gb is not None:
        os.environ["SPECLAB_MEMORY_BUDGET_GB"] = str(args.budget_gb)
    from decoders.runtime.residency import memory_budget_bytes
    import torch

    budget_gb = memory_budget_bytes(torch.device("cpu")) / 1e9
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    server = start_server(port, args.budget_gb)
    try:
        wait_until_up(url, server)
        sampler = RssSampler(server.pid)
        sampler.start()
        log, missing, lock = [], set(), threading.Lock()
        t0 = time.monotonic()
        until, hard_stop = t0 + 60 * args.minutes, t0 + 60 * args.minutes + args.grace
        plan = endpoints(args.tokens)
        users = [threading.Thread(target=user, args=(i, url, plan, until, hard_stop, t0, log, missing, lock),
                                  daemon=True) for i in range(args.users)]
        for thread in users:
            thread.start()
        for thread in users:
            thread.join(max(0.0, hard_stop + 30 - time.monotonic()))
        wall = time.monotonic() - t0
        sampler.done.set()
        sampler.join(5)
    finally:
        exit_status = stop_server(server)
    with lock:
        requests = list(log)
    result = {**summary(requests, sampler.samples, budget_gb, args, missing, wall), "server_exit": exit_status}
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(
        {**result, "requests": [asdict(r) for r in requests], "rss_samples": sampler.samples}, indent=1))
    (RESULTS / f"{args.stem}.md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
