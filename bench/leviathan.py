"""Leviathan's theory rows: α and S per (method, prompt kind), solved only from rounds that drafted γ tokens.

S(α, γ, c) (Leviathan et al. 2023, Thm 3.8) models a round that drafts exactly γ tokens, each accepted with the same
probability α, so τ = E[tokens per round] = (1 − α^(γ+1)) / (1 − α) can be solved for α only over such rounds. A
prompt lookup round that found no match (0 drafts) or copied fewer than γ tokens, and a last round cut short by
max_new_tokens, would drag τ down and read as a low α: they are left out. α also differs by prompt kind (code
editing copies long spans, chat almost none), so α, S and the measured speed-up are all taken per (method, kind);
pooling α over kinds and setting it against a median of per-kind speed-ups compares two different things.

Where the rounds come from, per run record (bench/runner.py):
- `rounds`: [[drafted, accepted], ...] per round, recorded by the runner (or, for files written before it recorded
  them, replayed from the recorded output by `python -m bench.replay`, formerly `bench.leviathan replay`: prompt
  lookup is a pure function of the context, so at temperature 0 its drafts can be recomputed; a replay is kept only
  when its drafted, accepted and round totals equal the run's);
- otherwise only whole runs in which every round drafted γ (drafted = γ × rounds) count ("whole runs"): the totals
  cannot say which rounds of a mixed run were full, so such a run is left out and the row says so.
"""
from __future__ import annotations

import json
from pathlib import Path

from .costs import alpha_from_tau, leviathan_speedup, speedup_with_verify_cost, t_of

# The words stored in results files' records (matched on load, so they stay as written; the command that writes them is
# now `python -m bench.replay`, which owns the command line so that this module never imports bench/report.py).
REPLAYED = "replayed from the recorded output by python -m bench.leviathan replay; totals match the run's"


def verification_rounds(record: dict) -> int | None:
    """Target verification forwards of a run (its rounds). Records carry the trace's τ = tokens ÷ rounds; records
    written before the runner kept it (and before it counted the prefill call in target_forwards) count rounds in
    target_forwards itself."""
    if record.get("trace_tau"):
        return round(record["n_tokens"] / record["trace_tau"])
    return record.get("target_forwards")


def full_rounds(record: dict, gamma: int) -> tuple[int, int, int, str] | None:
    """(full rounds, tokens they produced, all rounds, where the counts come from) of one run; None when the run
    cannot say which of its rounds were full.

    A round produces its accepted drafts plus the target's own token: accepted + 1 (what τ counts)."""
    rounds = record.get("rounds")
    if rounds:
        full = [accepted for drafted, accepted in rounds if drafted == gamma]
        source = "replayed" if record.get("rounds_source") == REPLAYED else "recorded"
        return len(full), sum(a + 1 for a in full), len(rounds), source
    total = verification_rounds(record)
    if not total or record.get("drafted") is None:
        return None
    if record["drafted"] == gamma * total:  # every round drafted γ: the whole run counts
        return total, record["accepted"] + total, total, "whole runs"
    return None


def draft_cost(method: dict, costs: dict | None) -> float | None:
    """Leviathan's c for a method: 0 for prompt lookup (a lookup costs no forward), the measured draft/target
    step ratio for a draft model, unknown (None) for the rest."""
    if method.get("kind") == "prompt-lookup":
        return 0.0
    if method.get("kind") == "draft-model":
        return ((costs or {}).get("draft") or {}).get("c")
    return None


def theory(runs: list[dict], method: dict, costs: dict | None) -> dict:
    """α, S and S with t(n) for one (method, kind) from its runs' full rounds, with what they rest on."""
    gamma = method["gamma"]
    counts = [full_rounds(r, gamma) for r in runs]
    usable = [c for c in counts if c is not None]
    n_full, tokens, n_rounds = (sum(c[i] for c in usable) for i in range(3))
    out = {"gamma": gamma, "full_rounds": n_full, "rounds": n_rounds, "runs": len(runs),
           "runs_without_round_counts": len(counts) - len(usable),
           "round_counts": "; ".join(sorted({c[3] for c in usable})),  # recorded / replayed / whole runs
           "alpha_from_tau": None, "S_leviathan": None, "S_with_t": None}
    if not n_full:
        out["note"] = (f"no round with γ = {gamma} drafts to solve α from" if usable and not out[
            "runs_without_round_counts"] else f"α not solvable: {out['runs_without_round_counts']} of {len(runs)} "
                       f"runs had rounds with fewer than γ = {gamma} drafts and no per-round counts")
        return out
    alpha = alpha_from_tau(tokens / n_full, gamma)
    cost = draft_cost(method, costs)
    out["alpha_from_tau"] = alpha
    if cost is None:
        out["note"] = "no draft cost c measured for this method"
        return out
    out["S_leviathan"] = leviathan_speedup(alpha, gamma, cost)
    t_verify = t_of((costs or {}).get("target_curve"), gamma + 1)
    if t_verify:
        out["S_with_t"] = speedup_with_verify_cost(alpha, gamma, cost, t_verify)
    return out


def applies(method: dict) -> bool:
    """The formula fits a chain with a fixed draft length: SpecLab methods under the static rule."""
    return method.get("family", "ours") == "ours" and method.get("rule") == "static" and bool(method.get("gamma"))


def theory_columns(records: list[dict], methods: list[dict], costs: dict | None, method_key: str,
                   kind: str) -> dict:
    """The report's theory columns for one (method, kind) row: {} where the formula does not apply."""
    method = next((m for m in methods if m["key"] == method_key), None)
    if method is None or not applies(method):
        return {}
    runs = [r for r in records if r["method"] == method_key and r["prompt_kind"] == kind]
    found = theory(runs, method, costs)
    return {"alpha_from_tau": found["alpha_from_tau"], "S_leviathan": found["S_leviathan"],
            "S_with_t": found["S_with_t"], "theory": found}


# --- replaying prompt lookup's rounds for files written before the runner recorded them ---------------------------

def replay_prompt_lookup(prompt_ids: list[int], output_ids: list[int], gamma: int, max_ngram: int,
                         max_new_tokens: int, eos_ids: set[int]) -> list[list[int]]:
    """[[drafted, accepted], ...] of a greedy prompt lookup run, recomputed as decoders/loop.py ran it: each round
    drafts lookup(context, n-gram, min(γ, budget − 1)) (cut after an end-of-sequence token), the target accepts the
    longest prefix equal to what it produced (greedy: the recorded output), and commits that plus one token."""
    from decoders.drafters.prompt_lookup import lookup

    ids, produced, rounds = list(prompt_ids), 0, []
    while produced < min(max_new_tokens, len(output_ids)):
        limit = min(gamma, max_new_tokens - produced - 1)
        draft = lookup(ids, max_ngram, limit) if limit > 0 else []
        ends = [i for i, token in enumerate(draft) if token in eos_ids]
        draft = draft[:ends[0] + 1] if ends else draft
        accepted = 0
        while accepted < len(draft) and produced + accepted < len(output_ids) and \
                draft[accepted] == output_ids[produced + accepted]:
            accepted += 1
        committed = output_ids[produced:produced + accepted + 1]
        rounds.append([len(draft), accepted])
        ids += committed
        produced += len(committed)
    return rounds


def replay_file(path: Path, encode) -> dict[str, int]:
    """Add replayed `rounds` to every greedy SpecLab prompt lookup record of a results file whose replay matches the
    run's totals, then refresh the stored rows. `encode(model, text)` gives the prompt ids the run used."""
    result = json.loads(path.read_text())
    counts = {"replayed": 0, "kept": 0, "mismatch": 0}
    for run in result["runs"].values():
        methods = {m["key"]: m for m in run.get("methods") or result["methods"]}
        for record in run["records"]:
            method = methods.get(record["method"])
            if not method or method["family"] != "ours" or method["kind"] != "prompt-lookup" or \
                    record.get("temperature") or not method.get("gamma"):
                continue
            if record.get("rounds") and record.get("rounds_source") != REPLAYED:
                counts["kept"] += 1  # recorded by the runner: never overwritten
                continue
            prompt_ids = encode(run["models"]["target"], run["prompt_texts"][record["prompt"]])
            rounds = replay_prompt_lookup(prompt_ids, record["output_ids"], method["gamma"],
                                          method["options"].get("ngram", 3), result["meta"]["max_new_tokens"],
                                          set(encode.eos_ids(run["models"]["target"])))
            totals = (len(rounds), sum(d for d, _ in rounds), sum(a for _, a in rounds))
            if len(prompt_ids) == record["prompt_tokens"] and totals == (
                    verification_rounds(record), record["drafted"], record["accepted"]):
                record["rounds"], record["rounds_source"] = rounds, REPLAYED
                counts["replayed"] += 1
            else:
                counts["mismatch"] += 1
        refresh_rows(run, list(methods.values()))
    path.write_text(json.dumps(result, indent=1, default=str))
    return counts


def refresh_rows(run: dict, methods: list[dict]) -> None:
    """Rewrite only the theory columns of a run's stored rows (the other columns stay as the run wrote them)."""
    for row in run.get("rows") or []:
        for key in ("alpha_from_tau", "S_leviathan", "S_with_t", "theory"):
            row.pop(key, None)
        row.update(theory_columns(run["records"], methods, run.get("costs"), row["method"], row["kind"]))
