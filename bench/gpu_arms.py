"""What `python -m bench.gpu` measures (bench/gpu.py runs it): the methods it races and how, the t(n) timing of one
model's forwards as each KV path runs them, and transformers' generate with its own static cache.

Every SpecLab arm is a bench.runner Method, so it runs through decoders.stream like the other benches, interleaved
and paired by prompt and repetition (bench/runner.py). "graph" arms set cuda_graphs (decoders/runtime/graphs.py); on a CPU
(the dry run) no graph can be captured, so those arms run the same fixed-shape forwards eagerly and say so.
"""
from __future__ import annotations

import statistics
import time
import traceback

import torch

from decoders.runtime.buffers import KVPlan
from decoders.controller import TREE_BOUNDS
from decoders.costs import branching_tree
from decoders.runtime.runner import CachedModel

from .runner import Method, hf, ours

# t(n) widths: every n gets its own graph (its own bucket), so a graphed t(n) is never a padded one
TN_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
PAPER_EAGLE2 = dict(tree_k=10, tree_depth=6, tree_m=59)
PAPER_DDD = dict(tree_k=10, tree_m=59)  # S, x, n, w: DecodeOptions' defaults are the DDD paper's
CONTROLLED = dict(controller="cost")


def fast_path(on_gpu: bool) -> dict:
    """The options of the arms raced against the graph baseline: graphs on a GPU; on a CPU (the dry run) the same
    fixed-shape forwards, eagerly (no graph can be captured there)."""
    return dict(kv_cache="fixed", cuda_graphs=on_gpu)


def step_arms(on_gpu: bool) -> list[Method]:
    """The baseline three ways: transformers' DynamicCache (eager), fixed buffers (eager), and graphs."""
    graph = "CUDA graphs" if on_gpu else "fixed buffers, eager (dry run: no GPU, no graph)"
    return [ours("ours/baseline", f"baseline · {graph}", "baseline", **fast_path(on_gpu)),
            ours("ours/baseline-dynamic", "baseline · DynamicCache, eager", "baseline", kv_cache="dynamic"),
            ours("ours/baseline-fixed", "baseline · fixed buffers, eager", "baseline", kv_cache="fixed")]


def speculative_arms(on_gpu: bool, retrained_head: str | None = None) -> list[Method]:
    """The speculative methods with the fast path, against the graph baseline (greedy, code prompts); with
    `retrained_head` (a folder bench/gpu_train.py wrote) EAGLE-2 cost-aware once more from that head."""
    fast, head = fast_path(on_gpu), dict(eagle_head="auto")
    retrained = [ours("ours/eagle2-cost-retrained", "EAGLE-2 · head retrained on this GPU · cost-aware", "eagle2",
                      eagle_head=retrained_head, **TREE_BOUNDS, **CONTROLLED, **fast)] if retrained_head else []
    return [
        ours("ours/prompt-lookup", "prompt lookup γ=10", "prompt-lookup", gamma=10, **fast),
        ours("ours/prompt-lookup-cost", "prompt lookup · cost-aware cap", "prompt-lookup", **CONTROLLED, **fast),
        ours("ours/eagle2-paper", "EAGLE-2 · head · K10 D6 M59 (paper)", "eagle2", **head, **PAPER_EAGLE2, **fast),
        ours("ours/eagle2-cost", "EAGLE-2 · head · cost-aware (K4, up to D16 M32)", "eagle2", **head,
             **TREE_BOUNDS, **CONTROLLED, **fast),
        ours("ours/ddd-paper", "DDD · head · M59 (paper)", "ddd", **head, **PAPER_DDD, **fast),
        ours("ours/early-exit", "early exit · AdaEDL", "early-exit", rule="adaedl", **fast),
        ours("ours/prophet", "prophet · AdaEDL", "prophet", rule="adaedl", **fast),
    ] + retrained


# transformers' own generate: the DynamicCache (bench/peers.py), and its static cache, which on CUDA transformers
# compiles by itself (torch.compile "reduce-overhead"; generation_config.disable_compile turns that off)
HF_STATIC = {"hf/greedy-static-compiled": ("greedy", {"cache_implementation": "static"}),
             "hf/greedy-static": ("greedy", {"cache_implementation": "static", "disable_compile": True}),
             "hf/prompt-lookup-static": ("prompt-lookup", {"cache_implementation": "static",
                                                            "prompt_lookup_num_tokens": 10,
                                                            "max_matching_ngram_size": 3}),
             "hf/early-exit-static": ("early-exit", {"cache_implementation": "static", "assistant_early_exit": 2})}


def hf_arms() -> list[Method]:
    """transformers' greedy, prompt lookup (SpecLab's n-gram size) and assistant early exit (the shipped exit's
    k 2) on its DynamicCache; the static-cache twins run through `run_hf_static`."""
    return [hf("hf/greedy", "HF greedy", "baseline"),
            hf("hf/prompt-lookup", "HF prompt lookup (10 tokens, n-gram 3)", "prompt-lookup",
               prompt_lookup_num_tokens=10, max_matching_ngram_size=3),
            hf("hf/early-exit", "HF assistant early exit (k 2)", "early-exit", assistant_early_exit=2)]


@torch.inference_mode()
def run_hf_static(key: str, target, prompt_ids: list[int], max_new_tokens: int) -> dict:
    """One transformers generate call with its static cache (HF_STATIC[key]); an error is a result, not a crash:
    {"error": its last line} (the issue saw reduce-overhead fail at the second call on torch 2.11)."""
    kind, settings = HF_STATIC[key]
    settings = dict(settings)
    model = target.model
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids], device=device)  # (1, P)
    eos = list(target.eos_token_ids) or None
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                  do_sample=False, num_beams=1, eos_token_id=eos, pad_token_id=(eos[0] if eos else 0), **settings)
    try:
        start = _now(device)
        out = model.generate(**kwargs)
        seconds = _now(device) - start
    except Exception as err:  # transformers refuses a combination, or compile fails: recorded, the bench goes on
        last = traceback.format_exception_only(type(err), err)[-1].strip()
        return {"method": key, "error": last[:300]}
    output = out[0, len(prompt_ids):].tolist()
    return {"method": key, "output_ids": output, "n_tokens": len(output), "seconds": seconds,
            "tok_s": len(output) / seconds if seconds > 0 else None}


# ---------------------------------------------------------------- t(n): one forward of n tokens after a context

@torch.inference_mode()
def time_widths(model: torch.nn.Module, path: str, widths=TN_WIDTHS, repeats: int = 5, context: int = 128,
                tree: bool = False) -> dict:
    """Median seconds of one forward over n new tokens (a chain, or a branching tree) after `context` cached tokens,
    for every n, as `path` runs it: "dynamic" (DynamicCache, eager), "fixed" (buffers, eager) or "graphs" (buffers,
    each n replayed as its own captured graph). Interleaved over n, after two warm-up passes (which capture)."""
    kind = "dynamic" if path == "dynamic" else "fixed"
    plan = KVPlan(kind, committed=context + max(widths) + 1, graphs=path == "graphs", buckets=tuple(widths))
    runner = CachedModel(model, plan)
    if runner.fixed is not None:
        runner.fixed.choose_by_time = False  # t(n) of n's own graph, never of a wider bucket it could pad to
    device = runner.device
    vocab = model.config.vocab_size
    tokens = [(17 * i + 3) % vocab for i in range(context)]
    samples = {n: [] for n in widths}
    try:
        runner.forward(tokens)
        for rep in range(repeats + 2):
            for n in widths:
                start = _now(device)
                if tree:
                    runner.forward_tree(branching_tree(tokens[0], n - 1, vocab))
                else:
                    runner.forward(tokens[:n])
                seconds = _now(device) - start
                runner.drop_last(n)
                if rep >= 2:
                    samples[n].append(seconds)
    finally:
        if runner.fixed is not None:
            runner.fixed.choose_by_time = runner.fixed.graphs  # a kept forward goes back as lease made it
        runner.release()
    medians = {n: statistics.median(v) for n, v in samples.items()}
    return {"path": path, "tree": tree, "context": context, "repeats": repeats,
            "seconds": medians, "t": {n: medians[n] / medians[widths[0]] for n in widths}}


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def caps(records: list[dict], key: str) -> dict | None:
    """The cost-aware controller's per-round caps of one arm (chain: drafts allowed; tree: nodes sent): median and
    range over every round of every run (decoders/controller.py records them in the trace)."""
    values = [cap for r in records if r["method"] == key for cap in r.get("controller_caps") or []]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": len(values)}
