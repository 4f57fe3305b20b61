"""DSBD: dynamic-width speculative beam decoding (Qin et al., AAAI 2025), one iteration at a time.

The paper's full text was not available: this follows the official code (ZongyueQin/DSBD,
beam_speculative_sampling) as reconstructed in docs/algorithms.md §6.2-6.4, with one deliberate change: draft beams are
drawn i.i.d. (with replacement) and nothing is replaced by the argmax, so every beam a layer produces is an exact
draw from the target's joint P (tests/test_dsbd.py proves it for one layer by chi-square).

One iteration: the draft runs beam sampling for γ layers (W draws per layer) from the input beams; the drafts form
a forest (one tree per input beam) that the target scores in one forward; then layer by layer the width K_ℓ is
chosen from the acceptance-count distribution and K_ℓ target beams are produced by recursive rejection sampling
over the (parent, token) space. A layer that cannot produce K_ℓ beams from its W drafts is the last one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import nn

from ..clock import DecodeClock
from ..sampling import Warp, uniform
from ..verify import acceptance_probability, residual
from .forest import Forest, draft_forest_layer, forest_forward, keep_paths
from .search import BeamResult, mark_prefill_done, joint_distribution, last
from .state import BeamRows, FinishedPool, PeakMeter, extend
from .width import acceptance_count_distribution, choose_width


@dataclass(frozen=True)
class DsbdSettings:
    """The code's defaults: γ 4, width 8, min width 1, thres 0.7, W input beams (one_input_beam False)."""

    gamma: int = 4  # draft layers per iteration
    width: int = 8  # W: draft draws per layer and the most beams a layer keeps
    min_width: int = 1  # K_min
    thres: float = 0.7  # a layer's width K is the largest with P(W drafts produce K beams) >= thres
    one_input_beam: bool = False  # memory mode: one beam carried between iterations (one target KV row)


@dataclass
class LayerVerdict:
    """One layer's recursive rejection sampling over the joint (parent, token) space."""

    accepted: list[int]  # draft draw positions accepted, in order (each one target beam)
    checks: list[dict]  # per draft draw: status "accepted" | "rejected" | "not_reached", u, accept_prob
    passed: bool  # produced the full width
    residual: torch.Tensor  # (N,) R when the walk stopped (P after the last acceptance, minus later rejections)


def verify_layer(p: torch.Tensor, q: torch.Tensor, draws: list[int | None], target_width: int,
                 generator: torch.Generator, residual_fn: Callable = residual) -> LayerVerdict:
    """Produce up to `target_width` exact draws from p out of i.i.d. drafts from q. p, q: (N,) over (parent, token),
    q restricted to valid parents (not renormalised). draws[j]: the flat index of draft j, None when its parent
    was not kept (then R(x) = 0 and it fails). residual_fn is the RRS core's; tests swap it to show it matters."""
    r = p  # (N,)
    accepted: list[int] = []
    checks: list[dict] = []
    for j, x in enumerate(draws):
        if len(accepted) == target_width:
            checks.extend({"status": "not_reached", "u": None, "accept_prob": None} for _ in draws[j:])
            break
        u = uniform(generator)
        r_x, q_x = (float(r[x]), float(q[x])) if x is not None else (0.0, 1.0)
        ok = u * q_x < r_x
        checks.append({"status": "accepted" if ok else "rejected", "u": u,
                       "accept_prob": acceptance_probability(r_x, q_x)})
        if ok:
            accepted.append(j)
            r = p  # one target beam produced; the next one starts afresh from P
        else:
            r = residual_fn(r, q)  # (N,)
    return LayerVerdict(accepted, checks, len(accepted) == target_width, r)


def produced_beams(verdict: LayerVerdict, draws: list[int | None], p: torch.Tensor, n_out: int,
                   generator: torch.Generator) -> list[int]:
    """The layer's beams as flat (parent, token) indices: the accepted drafts, then (if the layer failed) one draw
    from the residual, which completes the beam in progress, then fresh draws from P; the first n_out."""
    beams = [draws[j] for j in verdict.accepted]
    if not verdict.passed and len(beams) < n_out:
        beams.append(int(torch.multinomial(verdict.residual, 1, generator=generator)))
        if len(beams) < n_out:
            beams += torch.multinomial(p, n_out - len(beams), replacement=True, generator=generator).tolist()
    return beams[:n_out]


@dataclass
class _Beam:
    """A target beam inside an iteration: its input row, block columns of its cached path, tokens, scores."""

    root: int
    columns: list[int]  # forest columns of its drafted tokens (layers 1..ℓ)
    tokens: list[int]  # tokens added this iteration
    scores: list[float]  # log P of the draw at each layer (the ranking score: per-step renormalised, not log p)
    logps: list[float]  # the target's cumulative log p of the beam's generated tokens, at each layer


@dataclass
class _Draft:
    parents: list[int]
    tokens: list[int]
    q: torch.Tensor  # (R_prev * V,) the draft joint this layer was drawn from


@torch.inference_mode()
def iter_dsbd(target: nn.Module, draft: nn.Module, prompt_ids: list[int], settings: DsbdSettings, max_new_tokens: int,
              eos_ids: set[int], warp: Warp, generator: torch.Generator,
              clock: DecodeClock | None = None) -> Iterator[BeamResult]:
    """Decode with DSBD; result.steps holds one record per iteration (the beam trace's forest, widths, beams)."""
    target_rows, draft_rows = BeamRows(target), BeamRows(draft)
    meter = PeakMeter(target_rows, draft_rows)  # KV held by both caches, read right after every forward
    target_rows.prefill(prompt_ids)
    meter.note()
    draft_rows.prefill(prompt_ids)
    meter.note()
    mark_prefill_done(clock)  # both prompts are cached: decode time starts
    n_out = 1 if settings.one_input_beam else settings.width
    pool = FinishedPool(n_out)
    beams, scores = [list(prompt_ids)], [0.0]  # the input beams (pending token last) and their target scores
    logps = [0.0]  # the target's cumulative log p of each input beam's generated tokens (T = 1, unwarped)
    result = BeamResult([], 0.0, [])
    produced = 0
    while produced < max_new_tokens and beams:
        gamma = min(settings.gamma, max_new_tokens - produced - 1)  # never overshoot: ℓ accepted + 1 drawn
        prefix = target_rows.length  # before the forest forward appends its block
        record = _iteration(target_rows, draft_rows, beams, scores, logps, gamma, settings, n_out, eos_ids, warp,
                            generator, meter)
        new_beams: list[_Beam] = record.pop("_beams")
        ended: list[_Beam] = record.pop("_ended")  # beams that drew EOS on a layer that passed
        result.target_forwards += 1
        produced += max(len(b.tokens) for b in new_beams + ended)
        if new_beams:
            keep_paths(target_rows, prefix, [b.root for b in new_beams], [[0] + b.columns for b in new_beams])
            draft_rows.reorder([b.root for b in new_beams])
            extend(draft_rows, [[beams[b.root][-1]] + b.tokens[:-1] for b in new_beams])
            meter.note()
        live = [i for i, b in enumerate(new_beams) if b.tokens[-1] not in eos_ids]
        for beam in ended + [b for b in new_beams if b.tokens[-1] in eos_ids]:
            finished = beams[beam.root][len(prompt_ids):] + beam.tokens
            pool.add(finished, beam.scores[-1] / len(finished), beam.logps[-1])
        record["finished"] = [(c.tokens, c.score) for c in pool.items]
        record["kv_bytes"] = {"target": target_rows.kv_bytes(), "draft": draft_rows.kv_bytes()}
        record["target_rows"] = target_rows.rows  # live beams the target cache holds going forward
        result.peak_kv_bytes = meter.peak  # the draft forest and the target's scored forest included
        result.steps.append(record)
        yield result  # live: after every iteration
        beams = [beams[new_beams[i].root] + new_beams[i].tokens for i in live]
        scores = [new_beams[i].scores[-1] for i in live]
        logps = [new_beams[i].logps[-1] for i in live]
        if not new_beams:
            break
        if live and len(live) < len(new_beams):
            target_rows.reorder(live)
            draft_rows.reorder(live)
        if pool.full:
            break
    result.stop_reason = "eos" if produced < max_new_tokens or not beams else "max_new_tokens"
    for sequence, score, logp in zip(beams, scores, logps):
        if produced >= max_new_tokens:
            pool.add(sequence[len(prompt_ids):], score / max(1, len(sequence) - len(prompt_ids)), logp)
    target_rows.release()
    draft_rows.release()
    result.candidates = list(pool.items)
    result.tokens, result.score = (result.candidates[0].tokens, result.candidates[0].score) if result.candidates \
        else ([], 0.0)
    yield result  # the finished run: pool ranked, stop reason set


def _draft_layers(draft_rows: BeamRows, pending: list[int], scores: list[float], gamma: int, width: int,
                  warp: Warp, generator: torch.Generator, meter: PeakMeter) -> tuple[list[_Draft], int]:
    """Beam sampling with the draft for γ layers (i.i.d. draws, the draft's own scores after layer 1).

    The layers grow as a forest inside the draft's own cache (one tree per input row, tree masks, no copy of the
    cache and no reorder to W rows); the block is cropped off afterwards, as the EAGLE-2 drafter does."""
    if gamma == 0:
        return [], 0
    start = draft_rows.length
    block = [[-1] for _ in pending]  # per input row: the parent column of every cached block column (0 = root)
    logits = draft_forest_layer(draft_rows, start, block, [(row, 0) for row in range(len(pending))],
                                pending)  # (R, V): after each input beam's pending token
    meter.note()
    layers: list[_Draft] = []
    places: list[tuple[int, int]] = []  # (row, column) of the previous layer's drafts
    score = torch.tensor(scores, device=draft_rows.device)  # (R,) layer 1 starts from the target scores of the inputs
    try:
        for level in range(gamma):
            q = joint_distribution(score, logits, warp)  # (R_prev*V,)
            picks = torch.multinomial(q, width, replacement=True, generator=generator).tolist()
            vocab = logits.shape[-1]
            layers.append(_Draft([i // vocab for i in picks], [i % vocab for i in picks], q))
            if level == gamma - 1:
                break
            parent_place = places or [(row, 0) for row in range(len(pending))]
            places = _place_layer(block, [parent_place[par] for par in layers[-1].parents])
            logits = draft_forest_layer(draft_rows, start, block, places, layers[-1].tokens)  # (W, V)
            meter.note()
            score = torch.log(q[picks].clamp_min(1e-30))  # (W,)
    finally:
        draft_rows.crop(start)  # the draft cache keeps the input beams' committed tokens only
    return layers, gamma


def _place_layer(block: list[list[int]], parents: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Give each new draft a column in its parent's row (appending to `block`); returns their (row, column)."""
    places = []
    for row, parent_col in parents:
        block[row].append(parent_col)
        places.append((row, len(block[row]) - 1))
    return places


def _iteration(target_rows: BeamRows, draft_rows: BeamRows, beams: list[list[int]], scores: list[float],
               logps: list[float], gamma: int,
               settings: DsbdSettings, n_out: int, eos_ids: set[int], warp: Warp, generator: torch.Generator,
               meter: PeakMeter) -> dict:
    """Draft, score the forest, verify layer by layer; returns the iteration's record with the new beams.

    As in beam sampling, a beam that draws EOS leaves the live set at once: on a layer that passed it goes to
    `_ended` and its children no longer count (their parent is not valid, so P has no mass under it)."""
    pending = [b[-1] for b in beams]
    drafts, draft_forwards = _draft_layers(draft_rows, pending, scores, gamma, settings.width, warp, generator,
                                           meter)
    forest = Forest.roots(pending)
    for layer in drafts:
        forest.add_layer(layer.parents, layer.tokens)
    logits = forest_forward(target_rows, forest)  # (I, n, V)
    meter.note()  # the peak: every input row holds the scored forest block until keep_paths
    vocab = logits.shape[-1]
    valid = [_Beam(i, [], [], [s], [lp]) for i, (s, lp) in enumerate(zip(scores, logps))]  # the previous layer's target beams
    valid_ids = list(range(len(beams)))  # their index among the previous layer's drafts (inputs for layer 1)
    nodes = [{"id": i, "row": i, "layer": 0, "token": t, "parent": -1, "q": None, "p": None, "status": "root",
              "u": None, "accept_prob": None} for i, t in enumerate(pending)]
    widths: list[dict] = []
    ended: list[_Beam] = []
    stopped_at = None
    for level, layer in enumerate(drafts, start=1):
        p, token_logp = _target_joint(logits, valid, warp)  # (|valid|*V,) twice
        q_all = layer.q.view(-1, vocab)  # (R_prev, V)
        q = q_all[valid_ids].reshape(-1)  # (|valid|*V,) restricted, not renormalised
        position = {d: a for a, d in enumerate(valid_ids)}
        draws = [position[par] * vocab + tok if par in position else None
                 for par, tok in zip(layer.parents, layer.tokens)]
        distribution = acceptance_count_distribution(p, q, settings.width)
        k = min(choose_width(distribution, settings.thres, settings.min_width), settings.width)
        verdict = verify_layer(p, q, draws, k, generator)
        node_base = len(nodes)
        parent_node = _parent_nodes(nodes, level, len(beams), settings.width)
        for j, (par, tok) in enumerate(zip(layer.parents, layer.tokens)):
            x = draws[j]
            nodes.append({"id": node_base + j, "row": forest.row[level - 1][j], "layer": level, "token": tok,
                          "parent": parent_node[par], "q": float(layer.q[par * vocab + tok]),
                          "p": float(p[x]) if x is not None else None, **verdict.checks[j]})
        widths.append({"layer": level, "width": k, "distribution": distribution, "thres": settings.thres,
                       "passed": verdict.passed, "accepted": len(verdict.accepted)})
        if not verdict.passed:
            stopped_at = level
            new = produced_beams(verdict, draws, p, n_out, generator)
            out = [_extend(valid[x // vocab], x % vocab, None, p, token_logp, x) for x in new]
            _add_unreached(nodes, drafts, forest, level + 1, len(beams), settings.width, vocab)
            return _record(nodes, widths, stopped_at, out, ended, draft_forwards)
        accepted = [_extend(valid[draws[j] // vocab], layer.tokens[j], forest.col[level - 1][j], p, token_logp,
                            draws[j]) for j in verdict.accepted]
        ended += [beam for beam in accepted if beam.tokens[-1] in eos_ids]
        running = [i for i, beam in enumerate(accepted) if beam.tokens[-1] not in eos_ids]
        valid, valid_ids = [accepted[i] for i in running], [verdict.accepted[i] for i in running]
        if not valid:  # every beam of this layer ended: nothing left to extend
            _add_unreached(nodes, drafts, forest, level + 1, len(beams), settings.width, vocab)
            return _record(nodes, widths, level, [], ended, draft_forwards)
    p, token_logp = _target_joint(logits, valid, warp)  # (|valid|*V,) after the last drafted layer: drawn directly
    new = torch.multinomial(p, n_out, replacement=True, generator=generator).tolist()
    out = [_extend(valid[x // vocab], x % vocab, None, p, token_logp, x) for x in new]
    return _record(nodes, widths, stopped_at, out, ended, draft_forwards)


def _target_joint(logits: torch.Tensor, valid: list[_Beam], warp: Warp) -> tuple[torch.Tensor, torch.Tensor]:
    """P over (valid beam, token): the target's logits at each beam's last column, plus its score; and the target's
    own log p(token | beam) over the same space (temperature 1, unwarped). -> (|valid|*V,), (|valid|*V,)"""
    rows = torch.stack([logits[b.root, b.columns[-1] if b.columns else 0] for b in valid])  # (|valid|, V)
    p = joint_distribution(torch.tensor([b.scores[-1] for b in valid], device=rows.device), rows, warp)
    return p, torch.log_softmax(rows, dim=-1).reshape(-1)


def _extend(beam: _Beam, token: int, column: int | None, p: torch.Tensor, token_logp: torch.Tensor,
            x: int) -> _Beam:
    """The beam one layer on by the flat (beam, token) index x; column None for the iteration's last token
    (pending, not in the cache). Its score: log P(x), the draw's probability; its log p adds log p(token | beam)."""
    columns = beam.columns + ([column] if column is not None else [])
    return _Beam(beam.root, columns, beam.tokens + [token], beam.scores + [float(torch.log(p[x]))],
                 beam.logps + [beam.logps[-1] + float(token_logp[x])])


def _parent_nodes(nodes: list[dict], level: int, n_inputs: int, width: int) -> list[int]:
    """Node ids of the previous layer's drafts (the roots for layer 1), by draft index."""
    if level == 1:
        return list(range(n_inputs))
    start = n_inputs + (level - 2) * width
    return list(range(start, start + width))


def _add_unreached(nodes: list[dict], drafts: list[_Draft], forest: Forest, from_level: int, n_inputs: int,
                   width: int, vocab: int) -> None:
    """Draft nodes of the layers after the stop: drafted and scored, never tested."""
    for level in range(from_level, len(drafts) + 1):
        layer, parent_node = drafts[level - 1], _parent_nodes(nodes, level, n_inputs, width)
        for j, (par, tok) in enumerate(zip(layer.parents, layer.tokens)):
            nodes.append({"id": len(nodes), "row": forest.row[level - 1][j], "layer": level, "token": tok,
                          "parent": parent_node[par], "q": float(layer.q[par * vocab + tok]), "p": None,
                          "status": "not_reached", "u": None, "accept_prob": None})


def _record(nodes: list[dict], widths: list[dict], stopped_at: int | None, out: list[_Beam], ended: list[_Beam],
            draft_forwards: int) -> dict:
    return {"nodes": nodes, "layers": widths, "stopped_at": stopped_at,
            "beams": [{"row": b.root, "tokens": b.tokens, "score": b.scores[-1], "logp": b.logps[-1]} for b in out],
            "ended": [{"row": b.root, "tokens": b.tokens, "score": b.scores[-1], "logp": b.logps[-1]}
                      for b in ended],
            "target_forwards": 1, "draft_forwards": draft_forwards + 1, "_beams": out, "_ended": ended}


def dsbd(*args, **kwargs) -> BeamResult:
    """iter_dsbd, drained (same arguments)."""
    return last(iter_dsbd(*args, **kwargs))
