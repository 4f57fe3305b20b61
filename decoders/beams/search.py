"""Deterministic beam search (transformers' num_beams algorithm, step for step) and beam sampling
(docs/algorithms.md §6.1).

Both keep one KV row per live beam (state.BeamRows) and gather the rows by parent after every step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import nn

from ..clock import DecodeClock
from ..sampling import Warp
from .state import BeamRows, Candidate, FinishedPool

_NEG = -1.0e9  # transformers' "impossible" score: the placeholder of empty slots and of masked candidates


@dataclass
class BeamResult:
    """A finished beam run: the best hypothesis, the ranked pool, and one record per step (the beam trace's input)."""

    tokens: list[int]  # generated tokens of the best candidate (EOS included when it ended there)
    score: float  # its ranking score (length-normalised; what it is per method: decoders/beams/trace.py)
    candidates: list[Candidate]  # the finished pool, best first: tokens, ranking score, the target's log p
    steps: list[dict] = field(default_factory=list)  # per step: beams, parents, tokens, scores, kv_bytes
    target_forwards: int = 0
    peak_kv_bytes: int = 0
    stop_reason: str = ""


def joint_distribution(scores: torch.Tensor, logits: torch.Tensor, warp: Warp) -> torch.Tensor:
    """Beam sampling's joint P over (beam, token): warp(score[b] + log p(v | b)) flattened. (R,), (R, V) -> (R*V,)

    The warp (temperature, top-k, top-p) acts on the accumulated scores over all R·V entries at once, as in the
    DSBD code's baseline; the result is normalised over the whole (beam, token) space.
    """
    accumulated = scores[:, None] + torch.log_softmax(logits.float(), dim=-1)  # (R, V)
    return warp.probs(accumulated.reshape(-1))  # (R*V,)


@torch.inference_mode()
def iter_beam_search(model: nn.Module, prompt_ids: list[int], width: int, max_new_tokens: int, eos_ids: set[int],
                     length_penalty: float = 1.0, early_stopping: bool | str = False,
                     clock: DecodeClock | None = None) -> Iterator[BeamResult]:
    """transformers' `generate(num_beams=width, do_sample=False)` for one prompt, same choices token for token.

    Mirrors GenerationMixin._beam_search (transformers 5.x): keep the best 2·width (more with several EOS ids)
    continuations, the best `width` unfinished ones run on, the top-`width` finished ones enter the pool with
    score / generated_length ** length_penalty, and the early-stop heuristic decides when to stop.
    """
    rows = BeamRows(model)
    rows.prefill(prompt_ids)
    mark_prefill_done(clock)
    device = rows.device  # the bookkeeping lives next to the logits (a CPU tensor beside CUDA logits fails)
    keep = max(2, 1 + len(eos_ids)) * width
    prompt_len, max_length = len(prompt_ids), len(prompt_ids) + max_new_tokens
    running = [list(prompt_ids) for _ in range(width)]
    running_scores = torch.full((width,), _NEG, device=device)  # (B,): only beam 0 is real at the start
    running_scores[0] = 0.0
    pool_seqs: list[list[int]] = [list(prompt_ids) for _ in range(width)]
    pool_scores = torch.full((width,), _NEG, device=device)  # (B,) finished slots, placeholders at -1e9
    pool_done = torch.zeros(width, dtype=torch.bool, device=device)  # (B,)
    improvable = True
    result = BeamResult([], 0.0, [])
    cur_len, first = prompt_len, True
    while True:
        logits = rows.step([seq[-1] for seq in running] if not first else [prompt_ids[-1]])  # (R, V)
        result.target_forwards += 1
        if first:  # transformers feeds `width` identical rows; one row repeated is the same numbers
            logits = logits.expand(width, -1)  # (B, V)
        log_probs = torch.log_softmax(logits, dim=-1) + running_scores[:, None]  # (B, V)
        vocab = log_probs.shape[-1]
        top_scores, top_index = torch.topk(log_probs.reshape(-1), k=keep)  # (K,), (K,)
        top_beams, top_tokens = (top_index // vocab).tolist(), (top_index % vocab).tolist()
        hits = torch.tensor([t in eos_ids or cur_len + 1 >= max_length for t in top_tokens], device=device)  # (K,)
        # the best `width` continuations that did not stop run on
        live_order = torch.topk(top_scores + hits.float() * _NEG, k=width)[1].tolist()
        parents = [top_beams[i] for i in live_order]
        new_running = [running[top_beams[i]] + [top_tokens[i]] for i in live_order]
        new_running_scores = (top_scores + hits.float() * _NEG)[live_order]  # (B,)
        # among the best `width` candidates, those that stopped compete for the finished pool
        finished_scores = top_scores / ((cur_len + 1 - prompt_len) ** length_penalty)  # (K,)
        if bool(pool_done.all()) and early_stopping is True:
            finished_scores = finished_scores + _NEG
        if not improvable:
            finished_scores = finished_scores + _NEG
        just_done = hits & (torch.arange(keep, device=device) < width)  # (K,)
        finished_scores = finished_scores + (~just_done).float() * _NEG
        merged_scores = torch.cat([pool_scores, finished_scores])  # (B+K,)
        merged_seqs = pool_seqs + [running[b] + [t] for b, t in zip(top_beams, top_tokens)]
        merged_done = torch.cat([pool_done, just_done])
        best = torch.topk(merged_scores, k=width)[1].tolist()
        pool_seqs, pool_scores, pool_done = [merged_seqs[i] for i in best], merged_scores[best], merged_done[best]
        result.steps.append({"parents": parents, "tokens": [s[-1] for s in new_running],
                             "scores": new_running_scores.tolist(), "kv_bytes": rows.kv_bytes(),
                             "logps": new_running_scores.tolist(),  # beam search's score is the cumulative log p
                             "finished": [(seq[prompt_len:], float(score)) for seq, score, done in
                                          zip(pool_seqs, pool_scores, pool_done) if done]})
        result.peak_kv_bytes = max(result.peak_kv_bytes, rows.kv_bytes())
        yield result  # live: after every step
        rows.reorder(parents if not first else [0] * width)  # the first step had one real row
        running, running_scores, first = new_running, new_running_scores, False
        cur_len += 1
        improvable = improvable and _may_improve(running_scores, pool_scores, pool_done, cur_len, prompt_len,
                                                 max_length, early_stopping, length_penalty)
        all_stopped = bool(hits.all())
        if not improvable or (bool(pool_done.all()) and early_stopping is True) or all_stopped:
            break
    rows.release()
    result.stop_reason = "eos" if cur_len < max_length else "max_new_tokens"
    result.candidates = [Candidate(seq[prompt_len:], float(s), float(s) * (len(seq) - prompt_len) ** length_penalty)
                         for seq, s, d in zip(pool_seqs, pool_scores, pool_done) if d]  # log p = score · len^lp
    best = result.candidates[0] if result.candidates else Candidate(pool_seqs[0][prompt_len:], 0.0)
    result.tokens, result.score = best.tokens, best.score
    yield result  # the finished run: pool ranked, stop reason set


def _may_improve(running_scores: torch.Tensor, pool_scores: torch.Tensor, pool_done: torch.Tensor, cur_len: int,
                 prompt_len: int, max_length: int, early_stopping: bool | str, length_penalty: float) -> bool:
    """transformers' early-stop heuristic: could the best running beam still beat the worst finished one?"""
    if early_stopping == "never" and length_penalty > 0.0:
        hypothetical = max_length - prompt_len
    else:
        hypothetical = cur_len - prompt_len
    best_possible = float(running_scores[0]) / (hypothetical ** length_penalty)
    worst_finished = torch.where(pool_done, pool_scores.min(), torch.full_like(pool_scores, _NEG))  # (B,)
    return bool((best_possible > worst_finished).any())


@torch.inference_mode()
def iter_beam_sampling(model: nn.Module, prompt_ids: list[int], width: int, max_new_tokens: int, eos_ids: set[int],
                       warp: Warp, generator: torch.Generator, clock: DecodeClock | None = None) -> Iterator[BeamResult]:
    """Beam sampling as the DSBD code's baseline does it (docs/algorithms.md §6.1), with i.i.d. draws.

    Every step draws `width` (beam, token) pairs with replacement from the joint P = warp(score + log p); a drawn
    beam's score becomes log P(b, v). Draws that end in EOS move to the finished pool (score / generated length);
    the others run on. Stops when the pool holds `width` candidates, no beam is left, or at max_new_tokens (then
    the running beams join the pool). The best length-normalised candidate wins.
    """
    rows = BeamRows(model)
    rows.prefill(prompt_ids)
    mark_prefill_done(clock)
    pool = FinishedPool(width)
    beams, scores = [list(prompt_ids)], torch.zeros(1, device=rows.device)  # (R,) the ranking score: log P(draw)
    logps = torch.zeros(1, device=rows.device)  # (R,) the target's cumulative log p of each beam (T = 1, unwarped)
    result = BeamResult([], 0.0, [])
    prompt_len = len(prompt_ids)
    for step in range(max_new_tokens):
        logits = rows.step([seq[-1] for seq in beams])  # (R, V)
        result.target_forwards += 1
        joint = joint_distribution(scores, logits, warp)  # (R*V,)
        picks = torch.multinomial(joint, width, replacement=True, generator=generator).tolist()
        vocab = logits.shape[-1]
        parents, tokens = [i // vocab for i in picks], [i % vocab for i in picks]
        new_scores = torch.log(joint[picks].clamp_min(1e-30))  # (W,)
        token_logp = torch.log_softmax(logits, dim=-1)[parents, tokens]  # (W,) log p(token | its beam)
        new_logps = logps[parents] + token_logp  # (W,)
        live = [j for j, t in enumerate(tokens) if t not in eos_ids]
        n_new = step + 1
        for j in range(width):
            if j not in live:
                pool.add(beams[parents[j]][prompt_len:] + [tokens[j]], float(new_scores[j]) / n_new,
                         float(new_logps[j]))
        result.steps.append({"parents": parents, "tokens": tokens, "scores": new_scores.tolist(),
                             "logps": new_logps.tolist(), "kv_bytes": rows.kv_bytes(), "live": live,
                             "finished": [(c.tokens, c.score) for c in pool.items]})
        result.peak_kv_bytes = max(result.peak_kv_bytes, rows.kv_bytes())
        yield result  # live: after every step
        beams = [beams[parents[j]] + [tokens[j]] for j in live]
        scores, logps = new_scores[live], new_logps[live]  # (R',), (R',)
        if not beams or pool.full:
            result.stop_reason = "eos"
            break
        rows.reorder([parents[j] for j in live])
    else:
        result.stop_reason = "max_new_tokens"
        for seq, score, logp in zip(beams, scores.tolist(), logps.tolist()):
            pool.add(seq[prompt_len:], score / max_new_tokens, logp)
    rows.release()
    result.candidates = list(pool.items)
    result.tokens, result.score = result.candidates[0].tokens, result.candidates[0].score
    yield result  # the finished run: pool ranked, stop reason set


def mark_prefill_done(clock: DecodeClock | None) -> None:
    """Decode time starts here, as in the chain loop (decoders/clock.py): the prompt's cache exists."""
    if clock is not None:
        clock.prefill_done()


def last(steps: Iterator[BeamResult]) -> BeamResult:
    """Drain a live beam run and return its finished result."""
    result = None
    for result in steps:
        pass
    return result


def beam_search(*args, **kwargs) -> BeamResult:
    """iter_beam_search, drained (same arguments)."""
    return last(iter_beam_search(*args, **kwargs))


def beam_sampling(*args, **kwargs) -> BeamResult:
    """iter_beam_sampling, drained (same arguments)."""
    return last(iter_beam_sampling(*args, **kwargs))
