"""The ship rule: a trained drafter replaces the shipped one only when it beats it on the held-out split.

Both are scored on the same held-out replies (the target's own replies to prompts no drafter trained on,
decoders/training/prompts.py): greedy α by depth and the expected accepted chain, computed exactly as during
training; for an EAGLE head also τ (new tokens ÷ target forwards, prefill included) of EAGLE-2 under the cost-aware
controller (the Race's preset, decoders/controller.TREE_BOUNDS), decoding held-out prompts with both heads
interleaved, prompt by prompt, so a busy moment of the shared machine falls on both.

A candidate wins when its α(1) is higher by more than one standard error, its expected accepted chain is higher and,
for an EAGLE head, its τ is not lower. A candidate is a weights folder (what training writes with --out) or a training checkpoint (.pt): a
checkpoint is first exported to a folder in the shipped format and dtype, so what is scored is what would ship.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch

KINDS = ("eagle", "early-exit", "prophet")


# ---------------------------------------------------------------------------------------------- loading


def export_checkpoint(kind: str, path: Path, target, folder: Path, dtype: torch.dtype) -> Path:
    """A training checkpoint's weights as a folder the drafters load (EAGLE's layout, or the self-drafter store)."""
    from .checkpoint import read_checkpoint

    state = read_checkpoint(path, "" if kind == "eagle" else kind)  # an EAGLE head's is "eagle" or "eagle3"
    meta, weights = state["meta"], state["parts"]["model"]
    if kind == "eagle" and state.get("kind") not in ("eagle", "eagle3", None):
        raise ValueError(f"{path} is a {state['kind']} checkpoint, not an EAGLE head's")
    if kind == "eagle":
        from ..eagle.head import EagleHead
        from ..eagle.head3 import Eagle3Head
        from ..eagle.official import save_official

        head = (Eagle3Head(target, vocab_ids=meta.get("vocab_ids"), feature_layers=meta.get("feature_layers"))
                if state.get("kind") == "eagle3" else
                EagleHead(target, bias=bool(meta.get("bias", True)), vocab_ids=meta.get("vocab_ids")))
        head.load_state_dict(weights)
        extra = {"steps": state["history"].steps, "checkpoint": str(path)}
        return save_official(head, folder, dtype=dtype, extra=extra)
    from ..selfdraft import store
    from ..selfdraft.heads import ExitBlock, Prophet

    model = (ExitBlock(target, int(meta["exit_layer"]), vocab_ids=meta.get("vocab_ids")) if kind == "early-exit"
             else Prophet(target, int(meta["n_layers"]), vocab_ids=meta.get("vocab_ids")))
    model.load_state_dict(weights, strict=False)
    return store.save(model, folder, dtype, {"steps": state["history"].steps, "checkpoint": str(path)})


def load_drafter(kind: str, folder: Path, target):
    if kind == "eagle":
        from ..eagle.official import load_official

        return load_official(folder, target).eval()
    from ..selfdraft import store

    return store.load(folder, target)


# ---------------------------------------------------------------------------------------------- scoring


def heldout_alpha(kind: str, drafter, records: list, depths: int) -> dict:
    """α by depth and expected accepted chain on the held-out records (decoders/selfdraft/record.Recorded)."""
    if kind == "eagle":
        from ..eagle.data import featurized_for
        from ..eagle.train import acceptance_by_depth

        return acceptance_by_depth(drafter, featurized_for(drafter, records), depths)  # EAGLE-1/2 or EAGLE-3
    from ..selfdraft.train import exit_alpha, prophet_alpha

    return (exit_alpha if kind == "early-exit" else prophet_alpha)(drafter, records, depths)


def decode_options(kind: str, folder: Path, model: str, max_new: int):
    from ..controller import TREE_BOUNDS
    from ..options import DecodeOptions

    if kind == "eagle":
        return DecodeOptions(model=model, method="speculative", drafter="eagle2", eagle_head=str(folder),
                             controller="cost", max_new_tokens=max_new, record=False, **TREE_BOUNDS)
    return DecodeOptions(model=model, method="speculative", drafter=kind, self_weights=str(folder), rule="adaedl",
                         max_draft=8, max_new_tokens=max_new, record=False)


def decode_tau(lm, kinds_folders: dict[str, tuple[str, Path]], prompts: list[list[int]], max_new: int) -> dict:
    """name -> {"tau", "tokens", "forwards", "seconds"}: every drafter on each prompt in turn (interleaved)."""
    from bench.runner import forwards_with_prefill
    from ..api import stream

    totals = {name: {"tokens": 0, "forwards": 0, "seconds": 0.0, "outputs": []} for name in kinds_folders}
    for ids in prompts:
        for name, (kind, folder) in kinds_folders.items():
            began = time.perf_counter()
            trace = None
            for trace in stream(decode_options(kind, folder, lm.name, max_new), ids, target=lm):
                pass
            total = totals[name]
            total["seconds"] += time.perf_counter() - began
            total["tokens"] += len(trace.output_ids)
            total["forwards"] += forwards_with_prefill(trace.totals["target_forwards"], len(ids))
            total["outputs"].append(list(trace.output_ids))
    for total in totals.values():
        total["tau"] = total["tokens"] / max(total["forwards"], 1)
    return totals


def verdict(kind: str, candidate: dict, incumbent: dict) -> tuple[bool, str]:
    """Wins: α(1) higher by more than one standard error of the incumbent's (a binomial over its chains: a gain
    inside the held-out split's noise ships nothing), the accepted chain higher, and (EAGLE) τ not lower."""
    a, chains = incumbent["alpha"][0], max(int(incumbent.get("chains", 0)), 1)
    margin = (a * (1 - a) / chains) ** 0.5
    better_first = candidate["alpha"][0] > a + margin
    better_chain = candidate["mean_accepted"] > incumbent["mean_accepted"]
    tau_ok = kind != "eagle" or "tau" not in candidate or candidate["tau"] >= incumbent["tau"]
    wins = better_first and better_chain and tau_ok
    why = (f"α(1) {candidate['alpha'][0]:.3f} vs {a:.3f} (one standard error {margin:.3f}), accepted chain "
           f"{candidate['mean_accepted']:.3f} vs {incumbent['mean_accepted']:.3f}"
           + (f", τ {candidate['tau']:.2f} vs {incumbent['tau']:.2f}" if "tau" in candidate else ""))
    return wins, ("beats the shipped drafter: " if wins else "does not beat the shipped drafter: ") + why


def compare(kind: str, lm, replies: Path, candidate: Path, incumbent: Path, depths: int = 5, decode_prompts: int = 0,
            max_new: int = 96, save_dtype: torch.dtype = torch.float16, log=print) -> dict:
    """The comparison record (JSON-ready): both drafters' held-out scores and the verdict."""
    from .replies import ReplyStore

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    store = ReplyStore(replies)
    store.check_target(lm.name)
    held = store.load("heldout")
    if not held:
        raise ValueError(f"{replies} has no held-out replies; write them with python -m decoders.training replies")
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(candidate)
        if folder.is_file():  # a checkpoint: score what would ship
            folder = export_checkpoint(kind, folder, lm.model, Path(scratch) / "candidate", save_dtype)
        scores = {}
        for name, path in (("candidate", folder), ("shipped", Path(incumbent))):
            scores[name] = heldout_alpha(kind, load_drafter(kind, path, lm.model), held, depths)
            log(f"{name}: held-out α by depth " + " ".join(f"{a:.3f}" for a in scores[name]["alpha"])
                + f" | accepted chain {scores[name]['mean_accepted']:.3f}")
        if decode_prompts:
            prompts = _spread([r.ids[: int((~r.loss_mask).sum())].tolist() for r in held], decode_prompts)
            taus = decode_tau(lm, {"candidate": (kind, folder), "shipped": (kind, Path(incumbent))}, prompts, max_new)
            same = taus["candidate"]["outputs"] == taus["shipped"]["outputs"]
            for name in scores:
                scores[name]["tau"] = taus[name]["tau"]
                scores[name]["decode_seconds"] = taus[name]["seconds"]
                log(f"{name}: τ {taus[name]['tau']:.2f} over {len(prompts)} held-out prompts x {max_new} tokens")
    wins, why = verdict(kind, scores["candidate"], scores["shipped"])
    log(why)
    record = {"kind": kind, "target": lm.name, "candidate": str(candidate), "shipped": str(incumbent),
              "heldout_sequences": len(held), "heldout_tokens": sum(len(r.ids) for r in held), "depths": depths,
              "scores": scores, "wins": wins, "verdict": why,
              "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if decode_prompts:
        record |= {"decode_prompts": decode_prompts, "max_new": max_new, "outputs_equal": same}
    return record


def _spread(items: list, count: int) -> list:
    """`count` items evenly spaced through the list (chat and code prompts both)."""
    if count >= len(items):
        return items
    return [items[round(i * (len(items) - 1) / max(count - 1, 1))] for i in range(count)]


def markdown(record: dict) -> str:
    depths = record["depths"]
    rows = []
    for name in ("shipped", "candidate"):
        s = record["scores"][name]
        tau = f" {s['tau']:.2f} |" if "tau" in s else ""
        rows.append(f"| {name} | " + " | ".join(f"{a:.3f}" for a in s["alpha"]) + f" | {s['mean_accepted']:.3f} |{tau}")
    tau_head = " τ (EAGLE-2, cost-aware) |" if "tau" in record["scores"]["shipped"] else ""
    return (f"# {record['kind']} for {record['target']}: candidate vs shipped, held-out\n\n"
            f"Candidate `{record['candidate']}`; shipped `{record['shipped']}`; {record['heldout_sequences']} held-out "
            f"replies ({record['heldout_tokens']:,} tokens), the target's own greedy text for prompts no drafter "
            f"trained on. α(k): greedy acceptance at depth k given 1..k-1 accepted; accepted chain: expected accepted "
            f"drafts of a {depths}-token chain.\n\n"
            f"| drafter | " + " | ".join(f"α({k})" for k in range(1, depths + 1)) + f" | accepted chain |{tau_head}\n"
            f"|---|" + "---|" * (depths + 1) + ("---|" if tau_head else "") + "\n" + "\n".join(rows) + "\n\n"
            f"**Verdict** ({record['written']}): {record['verdict']}.\n")


def write(record: dict, out: Path) -> tuple[Path, Path]:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out.with_suffix(".json"), out.with_suffix(".md")
    json_path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    md_path.write_text(markdown(record))
    return json_path, md_path
