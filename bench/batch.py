"""Batched decoding with ragged rows, raced: `python -m bench.batch --target smollm2-135m|qwen2.5-coder-1.5b`.

For B in {1, 2, 4, 8} and two prompt sets (ShareGPT chat turns; HumanEval code-editing prompts, assets/bench), it
runs SpecLab's batched baseline and batched speculative decoding (prompt lookup; the draft model where the target has
one, else layer skip) and measures, per run: total tokens/s (all rows' tokens over the batch's decode time, and end
to end with the prefill), the share of decode time spent realigning (decoders/batch: trim, compaction, rows leaving),
and per-row equivalence: each row against that prompt decoded alone with the same method (decoders/compare.py: same,
rounding, mismatch). Peers in the same run: transformers' batched `generate` (greedy, left padding), checked against
our baseline decoded alone, and its assisted generation, which refuses B > 1 (the refusal is recorded, not skipped).
It also times t(n·B): one target forward over n new tokens in each of B rows after a fixed context, against one
token in one row, which is what decides whether batching and drafting pay on this machine.

Greedy, float32. A set has 7 prompts (5 scored + 2 tuning); B = 8 repeats the first. Results go to
bench/results/batch-<target>.{json,md}; the CLAIMS row reads them (bench/claims.py).
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time
from dataclasses import replace

import torch

from decoders import DecodeOptions, generate, generate_batch
from decoders.batch.ragged import RaggedRunner
from decoders.compare import compare

from . import cli
from .common import LoadMeter, load_prompts
from .runner import set_threads

BATCHES = (1, 2, 4, 8)
SETS = {"chat": "chat", "code-editing": "code-editing"}  # set name -> prompt kind in assets/bench


def methods_for(has_draft: bool, self_drafted: str | None = None) -> dict[str, DecodeOptions]:
    """Our methods: the batched baseline and speculative decoding with prompt lookup and a model drafter; early
    exit too when self_drafted names a target with trained early-exit weights (decoders/selfdraft: "auto" finds
    them by the options' model name)."""
    base = DecodeOptions(dtype="float32", record=False)
    drafter = {"draft-model": replace(base, method="speculative", drafter="draft-model", gamma=4)} if has_draft else \
        {"layer-skip": replace(base, method="speculative", drafter="layer-skip", gamma=2)}
    if self_drafted:
        drafter["early-exit"] = replace(base, model=self_drafted, method="speculative", drafter="early-exit",
                                        rule="adaedl")
    return {"baseline": replace(base, method="baseline"),
            "prompt-lookup": replace(base, method="speculative", drafter="prompt-lookup", gamma=5), **drafter}


def has_self_weights(kind: str, target: str) -> bool:
    from decoders.selfdraft import store

    try:
        store.locate(kind, target)
    except store.WeightsMissing:
        return False
    return True


def set_prompts(kind: str, encode, max_batch: int) -> list[dict]:
    prompts = load_prompts(10, [kind], "prompts") + load_prompts(10, [kind], "tuning")
    out = [{"id": p.id, "ids": encode(p.text)} for p in prompts]
    return [out[i % len(out)] for i in range(max_batch)]


def run_ours(options: DecodeOptions, prompts: list[dict], models: dict, alone: dict) -> dict:
    ids = [p["ids"] for p in prompts]
    batch = generate_batch(options, ids, target=models["target"], draft=models.get("draft"))
    kinds = []
    for p, row in zip(prompts, batch):
        key = (options.method, options.drafter, p["id"])
        if key not in alone:  # a prompt decoded alone is the same at every B: decode it once
            alone[key] = _alone(options, p["ids"], models)
        reference = alone[key]
        kinds.append(compare(row, reference, models["target"].model).kind)  # a difference is re-scored on it
    t = batch.totals
    return {"tokens": t["tokens"], "decode_seconds": t["decode_seconds"], "prefill_seconds": t["prefill_seconds"],
            "tokens_per_second": t["tokens_per_second"],
            "e2e_tokens_per_second": t["tokens"] / (t["decode_seconds"] + t["prefill_seconds"]),
            "realign_seconds": t["realign_seconds"], "realign_share": t["realign_share"], "rounds": t["rounds"],
            "tau": [x for x in t["tau"]], "padding_added": t["padding_added"],
            "equivalence": {k: kinds.count(k) for k in ("same", "rounding", "mismatch", "prefix", "unclassified")},
            "row_kinds": kinds}


def _alone(options: DecodeOptions, ids: list[int], models: dict):
    return generate(options, ids, target=models["target"], draft=models.get("draft"))


@torch.inference_mode()
def run_hf_batched(target, prompts: list[dict], max_new_tokens: int, alone_baseline: dict) -> dict:
    """transformers' batched greedy generate with left padding; rows checked against our baseline alone."""
    eos = list(target.eos_token_ids)
    pad = eos[0] if eos else 0
    width = max(len(p["ids"]) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)  # (B, P) left-padded
    mask = torch.zeros_like(ids)  # (B, P)
    for r, p in enumerate(prompts):
        ids[r, width - len(p["ids"]):] = torch.tensor(p["ids"])
        mask[r, width - len(p["ids"]):] = 1
    start = time.perf_counter()
    out = target.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                num_beams=1, eos_token_id=eos or None, pad_token_id=pad, temperature=None,
                                top_p=None, top_k=None)
    seconds = time.perf_counter() - start
    rows, same = [], 0
    for r, p in enumerate(prompts):
        row = out[r, width:].tolist()
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:cut])
        reference = alone_baseline.get(("baseline", "draft-model", p["id"]))
        same += reference is not None and reference.output_ids == row[:cut]
    tokens = sum(len(r) for r in rows)
    return {"tokens": tokens, "seconds": seconds, "e2e_tokens_per_second": tokens / seconds,
            "same_as_baseline_alone": same, "rows": len(prompts)}


@torch.inference_mode()
def try_hf_assisted(target, draft, prompts: list[dict], max_new_tokens: int) -> str:
    """transformers' assisted generation (a draft model, or its prompt lookup without one) on a batch of rows."""
    eos = list(target.eos_token_ids)
    pad = eos[0] if eos else 0
    width = max(len(p["ids"]) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)  # (B, P)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p["ids"]):] = torch.tensor(p["ids"])
        mask[r, width - len(p["ids"]):] = 1
    extra = {"assistant_model": draft.model} if draft is not None else {"prompt_lookup_num_tokens": 5}
    try:
        target.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=min(max_new_tokens, 4),
                              do_sample=False, eos_token_id=eos or None, pad_token_id=pad, temperature=None,
                              top_p=None, top_k=None, **extra)
    except Exception as err:  # noqa: BLE001  the refusal itself is the result
        return f"refused: {type(err).__name__}: {str(err).splitlines()[0]}"
    return "ran"


@torch.inference_mode()
def t_grid(target, context: int = 128, ns=(1, 5), batches=BATCHES, reps: int = 3) -> list[dict]:
    """Seconds of one target forward over n new tokens in each of B rows after `context` cached tokens."""
    out = []
    for b in batches:
        runner = RaggedRunner(target.model, b)
        runner.forward([list(range(1, context + 1))] * b, last_only=True)
        for n in ns:
            times = []
            for _ in range(reps):
                snap = runner.snapshot()
                start = time.perf_counter()
                runner.forward([list(range(2, n + 2))] * b)
                times.append(time.perf_counter() - start)
                runner.restore(snap, list(range(len(runner.cache.layers))))
            out.append({"batch": b, "n": n, "seconds": statistics.median(times)})
        runner.release()
    one = next(x["seconds"] for x in out if x["batch"] == 1 and x["n"] == 1)
    for x in out:
        x["relative"] = x["seconds"] / one
    return out


def summarize(rows: list[dict]) -> None:
    """Speed-ups: against the batched baseline at the same B and set, and against the same method at B = 1."""
    index = {(r["set"], r["batch"], r["method"]): r for r in rows}
    for r in rows:
        base = index.get((r["set"], r["batch"], "baseline"))
        one = index.get((r["set"], 1, r["method"]))
        rate = r.get("tokens_per_second")
        r["over_batched_baseline"] = rate / base["tokens_per_second"] if base and rate else None
        r["over_batch_1"] = rate / one["tokens_per_second"] if one and rate else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch", description=__doc__.split("\n")[0])
    cli.run_arguments(parser, target="smollm2-135m", stem="batch", prompts=False)
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--sets", default="chat,code-editing")
    args = parser.parse_args(argv)
    threads = set_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    models, draft_name = cli.load_pair(args.target)
    methods = methods_for(draft_name is not None,
                          args.target if has_self_weights("early-exit", args.target) else None)
    began, load = time.monotonic(), LoadMeter().start()
    grid = t_grid(models["target"])
    rows, peers, assisted, alone = [], [], {}, {}
    encode = lambda text: models["target"].encode_prompt(text, chat=True)  # noqa: E731
    for set_name in [s.strip() for s in args.sets.split(",") if s.strip()]:
        prompts = set_prompts(SETS[set_name], encode, max(batches))
        for b in batches:
            for key, options in methods.items():
                options = replace(options, max_new_tokens=args.max_new_tokens)
                result = run_ours(options, prompts[:b], models, alone)
                rows.append({"set": set_name, "batch": b, "method": key, **result})
                print(f"{set_name} B={b} {key}: {result['tokens_per_second']:.1f} tok/s, realign "
                      f"{100 * result['realign_share']:.1f}%, rows {result['equivalence']}", flush=True)
            hf = run_hf_batched(models["target"], prompts[:b], args.max_new_tokens, alone)
            peers.append({"set": set_name, "batch": b, "method": "hf-batched-greedy", **hf})
            if b > 1 and b not in assisted:
                assisted[b] = try_hf_assisted(models["target"], models.get("draft"), prompts[:b], args.max_new_tokens)
            _save(args, argv, draft_name, batches, threads, (began, load.summary()), methods, grid, rows, peers,
                  assisted)
    result = _save(args, argv, draft_name, batches, threads, (began, load.stop()), methods, grid, rows, peers, assisted)
    print(markdown(result))
    return 0


def _save(args, argv, draft_name, batches, threads, clock, methods, grid, rows, peers, assisted) -> dict:
    """Write what is measured so far (after every B, so a run cut short by its time limit still leaves figures).
    clock: (the run's start on time.monotonic, the machine's load so far)."""
    summarize(rows)
    began, load = clock
    result = {"settings": {"target": args.target, "draft": draft_name, "dtype": "float32", "batches": batches,
                           "max_new_tokens": args.max_new_tokens, "threads": threads,
                           "machine": f"{platform.machine()} · torch {torch.__version__}", "load": load,
                           "command": cli.command("python -m bench.batch", argv),
                           "minutes": (time.monotonic() - began) / 60,
                           "methods": {k: o.to_dict() for k, o in methods.items()}},
              "t_grid": grid, "rows": rows, "peers": peers,
              "hf_assisted": {str(b): v for b, v in assisted.items()}}
    cli.write(cli.out_stem(args), result, markdown(result))
    return result


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _x(x) -> str:
    return "–" if x is None else f"{x:.2f}×"


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [f"# Batched decoding, ragged rows: {s['target']}" + (f" + {s['draft']} draft" if s.get("draft") else ""),
             "", f"`{s['command']}` · {s['dtype']} · greedy · {s['max_new_tokens']} new tokens per row · "
             f"{s['threads']} threads · {s['machine']} · "
             f"{(s.get('load') or {}).get('label') or 'machine load not recorded'} · {s['minutes']:.1f} min", "",
             "Total tok/s = all rows' tokens / the batch's decode time (prefill excluded; 'e2e' includes it). "
             "Rows = each row against that prompt decoded alone with the same method (same / rounding / mismatch).",
             "", "| set | B | method | total tok/s | e2e tok/s | × batched baseline | × same method at B=1 | "
             "realign share | τ per row | rows same/rounding/mismatch |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        eq = r["equivalence"]
        taus = " ".join("–" if t is None else f"{t:.2f}" for t in r["tau"])
        lines.append(f"| {r['set']} | {r['batch']} | {r['method']} | {r['tokens_per_second']:.1f} | "
                     f"{r['e2e_tokens_per_second']:.1f} | {_x(r['over_batched_baseline'])} | {_x(r['over_batch_1'])} | "
                     f"{_pct(r['realign_share'])} | {taus} | {eq['same']}/{eq['rounding']}/"
                     f"{eq['mismatch'] + eq['prefix']} |")
    lines += ["", "Peers (same run): transformers' batched greedy `generate`, left padding (end to end, prefill "
              "included; rows compared with our baseline decoded alone).", "",
              "| set | B | e2e tok/s | rows equal to the baseline alone |", "|---|---|---|---|"]
    for p in result["peers"]:
        lines.append(f"| {p['set']} | {p['batch']} | {p['e2e_tokens_per_second']:.1f} | "
                     f"{p['same_as_baseline_alone']}/{p['rows']} |")
    lines += ["", "transformers' assisted generation at B > 1: " +
              "; ".join(f"B={b}: {v}" for b, v in result["hf_assisted"].items()), "",
              "t(n·B): one target forward over n new tokens in each of B rows (128 cached tokens), relative to n=1, "
              "B=1:", "", "| B | n | seconds | relative |", "|---|---|---|---|"]
    for g in result["t_grid"]:
        lines.append(f"| {g['batch']} | {g['n']} | {g['seconds'] * 1000:.1f} ms | {g['relative']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
