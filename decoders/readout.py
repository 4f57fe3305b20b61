"""What a round reads from the target's logits, in one device-to-host copy.

On a GPU every .tolist() or float() of a device tensor waits for the device and copies a few bytes; greedy
verification and the recorder used to make several such reads per round (the argmax, the committed rows' top-2, one
probability per drafted node). Here they are computed on the device and copied to the host together, once per
round, after the verification forward (a replayed CUDA graph's outputs, decoders/runtime/graphs.py, or an eager forward's):
  argmax  (N+1,)    the target's choice after every node (greedy verification walks it, decoders/verify.py)
  top     (N+1, k)  the k = TOP_LOGITS best [id, logit] of every row (the trace's TokenRecord.top: where the baseline
                    chose another token, this run's logit for it is usually on record, decoders/compare.py)
  shown   (N,)      with recording on: the target probability of each drafted node's token after its parent (the
                    trace's NodeRecord.p: the warped p, or at temperature 0 the unwarped softmax)
The argmax is topk's first entry, so finding it costs the same one pass over the logits the argmax alone did; an
exact tie between a row's two best logits goes to topk's order, in the baseline and every method alike.
  walk    (4N+1,)   at temperature > 0: the sampled verification's walk, run on the device before the copy
                    (decoders/verify.py walk_on_device: which nodes were tested, their outcomes, acceptance
                    probabilities and draws, and the token the target adds), finished on the host by verify()
The copy happens inside the round's verification time (it is what verification waits for); with recording on, that
includes the node probabilities' one pass over the rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .clock import DecodeClock
from .trace import TOP_LOGITS
from .tree import DraftTree


@dataclass
class RoundReadout:
    argmax: list[int]  # (N+1,) target argmax per row
    top: list[list]  # (N+1) rows of k [id, logit] pairs, best first
    shown: list[float] | None  # (N,) node i's token under row parent(i), for nodes 1..N; None with recording off
    walk: list[float] | None = None  # (4N+1,) the sampled walk's numbers (decoders/verify.py); None when greedy

    def top_of(self, rows: list[int]) -> list[list]:
        return [self.top[row] for row in rows]


@torch.inference_mode()
def read_round(tree: DraftTree, logits: torch.Tensor, p: torch.Tensor | None, record: bool,
               walk: torch.Tensor | None = None, clock: DecodeClock | None = None) -> RoundReadout:
    """logits (N+1, V) raw target output; p (N+1, V) warped, None at temperature 0; walk (4N+1,) float64 the sampled
    verification's device walk, or None. One host copy, made through the run's clock when given: on CUDA the copy's
    wait is what times the round (decoders/clock.py)."""
    rows, k = logits.shape[0], min(TOP_LOGITS, logits.shape[-1])
    values, ids = logits.float().topk(k, dim=-1)  # (N+1, k), (N+1, k)
    parts = [ids.double().flatten(), values.double().flatten()]  # token ids are exact in float64
    nodes = tree.size - 1
    if record and nodes:
        parents = upload(tree.parents[1:], logits.device)  # (N,) queued behind the forward, no wait
        tokens = upload(tree.tokens[1:], logits.device)  # (N,)
        parts.append(_shown(logits, p, parents, tokens).double())  # (N,)
    if walk is not None:
        parts.append(walk)  # (4N+1,) last, so its slice is the copy's tail
    values = torch.cat(parts)  # (2k(N+1) [+ N] [+ 4N+1],) float64
    host = clock.read(values) if clock is not None else values.cpu().tolist()  # the one device-to-host copy
    best = [int(i) for i in host[:k * rows]]
    scores = host[k * rows:2 * k * rows]
    top = [[[best[k * r + j], scores[k * r + j]] for j in range(k)] for r in range(rows)]
    walked = host[len(host) - walk.shape[0]:] if walk is not None else None
    shown_p = host[2 * k * rows:2 * k * rows + nodes] if record and nodes else None
    return RoundReadout([best[k * r] for r in range(rows)], top, shown_p, walked)


def upload(values: list, device: torch.device | str, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Host numbers to the device without waiting for it. (n,) A plain torch.tensor(values, device="cuda") copies
    from pageable memory, which makes the host wait for every kernel queued before it (the round's forward too);
    from pinned memory the copy queues behind them instead (PyTorch keeps the pinned block until the copy is done)."""
    host = torch.tensor(values, dtype=dtype, device="cpu")  # (n,) explicitly: a default device may be set
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _shown(logits: torch.Tensor, p: torch.Tensor | None, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Each node's token under its parent's row: from the warped p, or at temperature 0 the unwarped softmax's
    entries, computed as exp(logit - logsumexp) from one pass over the rows, not a whole (N+1, V) softmax. (N,)"""
    if p is not None:
        return p[parents, tokens]
    scores = logits.float()  # (N+1, V)
    return torch.exp(scores[parents, tokens] - torch.logsumexp(scores, dim=-1)[parents])