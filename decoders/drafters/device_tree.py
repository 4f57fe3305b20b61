"""EAGLE-2 / DDD growth kept on the device: one host read a round (issue 46).

The engine of decoders/drafters/tree_draft.py (its docstring has the papers' rules) as tensor operations, so a GPU
round never waits for the device until the tree is done ("the host engine" below: the per-node Python engine it
replaced, kept as its oracle in tests/tree_reference.py):
  pool        tokens, parents, log values and log q as (P,) device tensors, appended one step's (F·K,) at a time
  frontier    the `width` best of the last step's nodes by a stable descending sort: ties to the earlier node, as
              the host engine's sorted(key=(-value, id)) did; values are float64 sums of the float32 log q, the
              same doubles Python's float arithmetic made
  ancestors   each node's row of draft slots (in feeding order) that hold an ancestor: a child's is its parent's
              plus the parent's own slot, so the tree mask of the next forward is a concatenation, no Python loop
  DDD stop    H = logsumexp of the frontier's values, compared on the device: once H < x a flag marks every later
              node invalid. On an accelerator the remaining steps still run (the host cannot stop them without
              waiting) and their nodes are dropped when read (their forwards still count: the draft cost paid);
              on the CPU, where reading a flag waits for nothing, growth stops at the check (STOPS_READ_ON), as
              the host engine did
  rerank      the M best valid nodes by one stable sort (pool ids ascend with depth, so ties go to the shallower,
              earlier node), their tree parents by one scatter; the chosen ids come back sorted (parents first)
  the read    chosen tokens, tree parents, log q and (DDD) validity and H values, and with
              recording the whole pool and the frontiers: one float64 tensor, one .cpu() (ids are exact below 2^53)
A rule that prices trees (the cost controller, decoders/controller.py) decides between steps from the values, so
its runs read the values once a step; the default rules read nothing until the end.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..tree import DraftTree, Flavor

STOPS_READ_ON = frozenset({"cpu"})  # device types whose DDD stop flag is read at the check (no sync to wait for)


@dataclass
class Frontier:
    """What one expansion step feeds the draft, every node at the same depth; tensors on the draft's device."""

    ids: torch.Tensor  # (F,) pool ids, best first
    tokens: torch.Tensor  # (F,) their tokens
    rows: torch.Tensor  # (F,) each node's parent's row in the previous expansion's output (0 for the root's children)
    seen: torch.Tensor  # (F, fed) bool: which of this round's draft slots (in feeding order) hold an ancestor
    depth: int  # the nodes' depth (1: children of the root)
    fed: int  # draft slots filled before this forward: its nodes take slots fed .. fed + F - 1

    @property
    def size(self) -> int:
        return self.ids.shape[0]

    def mask(self, context: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive attention mask (F, context + fed + F): the committed context, the ancestors' slots, itself."""
        n, device = self.size, self.ids.device
        allowed = torch.cat([torch.ones(n, context, dtype=torch.bool, device=device), self.seen,
                             torch.eye(n, dtype=torch.bool, device=device)], dim=1)  # (F, context + fed + F)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device)  # (F, context + fed + F)
        return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


@dataclass
class DeviceGrowth:
    """A grown pool, still on the device: per step s (1-based) the nodes it added, in pool order."""

    tokens: list[torch.Tensor] = field(default_factory=list)  # per step (n_s,) long
    parents: list[torch.Tensor] = field(default_factory=list)  # per step (n_s,) long pool ids, -1 = the root
    log_value: list[torch.Tensor] = field(default_factory=list)  # per step (n_s,) float64
    log_q: list[torch.Tensor] = field(default_factory=list)  # per step (n_s,) float64
    alive: list[torch.Tensor] = field(default_factory=list)  # per step () bool: no DDD check stopped before it
    frontiers: list[torch.Tensor] = field(default_factory=list)  # per step (F_s,) pool ids, best first
    checks: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # DDD: (step, H () float32)
    threshold: float = -math.inf
    stop: str = "depth"  # "depth" | "budget" | "cost"; "ddd" is known only when read
    forwards: int = 1

    @property
    def size(self) -> int:
        return sum(t.shape[0] for t in self.tokens)

    def add(self, parents, tokens, log_q, log_value, alive) -> int:
        """Append one step's nodes (n,) each; returns the pool id of the first."""
        start = self.size
        self.parents.append(parents), self.tokens.append(tokens)
        self.log_q.append(log_q), self.log_value.append(log_value), self.alive.append(alive)
        return start


@torch.inference_mode()  # no autograd bookkeeping: on the CPU each of these small ops costs its dispatch
def grow_on_device(root_logq: torch.Tensor, expand: Callable[[Frontier], torch.Tensor], shape, max_depth: int,
                   keep_growing: Callable[[list[float], list[float], int], bool] | None = None) -> DeviceGrowth:
    """Grow EAGLE-2's (or DDD's) pool. root_logq (V,) draft log-probs after the root; expand(frontier) -> (F, V)
    log-probs after each frontier node (one draft forward). keep_growing: a pricing rule's test before each step
    (it reads the values: one host read a step). A step's children sit row by row (K per frontier node), so a
    child's parent row is its index // K: no per-node bookkeeping."""
    device = root_logq.device
    growth = DeviceGrowth(threshold=shape.threshold)
    k = min(shape.k, root_logq.shape[-1])
    top = torch.topk(root_logq, k)  # values, indices: (K,)
    log_q = top.values.double()  # (K,)
    alive = torch.ones((), dtype=torch.bool, device=device)  # ()
    start = growth.add(torch.full((k,), -1, device=device), top.indices, log_q, log_q, alive)
    seen = torch.zeros(1, 0, dtype=torch.bool, device=device)  # (rows of the last forward, fed): the root's, empty
    kids, eyes = k, {}  # children per row of the last forward; (F, F) identities by size
    local = _best(log_q, shape.beam)  # (F,) the frontier among the last step's nodes
    growth.frontiers.append(local + start)
    fed, depth_cap = 0, min(shape.steps, max_depth)
    for step in range(2, depth_cap + 1):
        values = growth.log_value[-1]  # (n,) the last step's nodes
        if step in shape.checks:
            h = torch.logsumexp(values[local].float(), 0)  # () float32, as the host engine's torch.tensor(list)
            alive = alive & ~(h.double() < shape.threshold)  # () compared in float64, as Python compared
            growth.checks.append((step, h))
            if device.type in STOPS_READ_ON and not alive:
                break  # the CPU: stop here, as the host engine did (DeviceGrowth.read finds the check)
        if keep_growing is not None and not _worth_a_step(growth, local, alive, keep_growing):
            break
        rows = local // kids  # (F,) each node's parent's row in the last forward (0: the root)
        frontier = Frontier(local + start, growth.tokens[-1][local], rows, seen[rows], step - 1, fed)
        logq = expand(frontier)  # (F, V)
        growth.forwards += 1
        top = torch.topk(logq, min(shape.k, logq.shape[-1]), dim=-1)  # values, indices: (F, K)
        n, kids = top.indices.shape
        log_q = top.values.double()  # (F, K)
        start = growth.add(frontier.ids[:, None].expand(n, kids).reshape(-1), top.indices.reshape(-1),
                           log_q.reshape(-1), (values[local][:, None] + log_q).reshape(-1), alive)  # (F·K,) each
        eye = eyes.get(n)
        if eye is None:
            eye = eyes[n] = torch.eye(n, dtype=torch.bool, device=device)  # (F, F): each node's own slot
        seen = torch.cat([frontier.seen, eye], dim=1)  # (F, fed + F): what each row's children see above them
        fed += n
        local = _best(growth.log_value[-1], shape.beam)  # (F',)
        growth.frontiers.append(local + start)
    else:
        growth.stop = "budget" if depth_cap < shape.steps else "depth"
    return growth


def _best(values: torch.Tensor, width: int) -> torch.Tensor:
    """Indices of the `width` highest values, best first, ties to the lower index (a stable sort). (≤ width,)"""
    return torch.sort(values, descending=True, stable=True).indices[:width]


def _worth_a_step(growth: DeviceGrowth, local: torch.Tensor, alive: torch.Tensor, keep_growing) -> bool:
    """A pricing rule's test before a step, from one read of the values (its runs read once a step); a DDD stop
    found in the same read ends growth as the host engine did."""
    frontier = growth.log_value[-1][local]  # (F,)
    pool = torch.cat(growth.log_value)  # (P,)
    host = torch.cat([alive.double()[None], frontier, pool]).cpu().tolist()
    if not host[0]:
        return False  # stopped by DDD: read as such (DeviceGrowth.read finds the flag)
    f = frontier.shape[0]
    if keep_growing([math.exp(v) for v in host[1:1 + f]], sorted((math.exp(v) for v in host[1 + f:]), reverse=True),
                    growth.forwards):
        return True
    growth.stop = "cost"
    return False


@dataclass
class ReadGrowth:
    """What the host learns from the one read: the tree to verify and, recording, the search for the trace."""

    tree: DraftTree
    chosen: list[int]  # pool ids sent, ascending
    steps: int
    stop: str
    ddd: list[dict]
    pool: list[dict] | None  # recording only: the valid pool (trace schema: RoundRecord.search)
    frontiers: list[list[int]] | None


@torch.inference_mode()
def read(growth: DeviceGrowth, pending: int, m: int, record: bool, rule=None) -> ReadGrowth:
    """Rerank to the M best valid nodes on the device and bring the round back in one copy (two with a rule that
    prices trees: it sizes M from the sorted values first)."""
    log_value = torch.cat(growth.log_value)  # (P,)
    device, total = log_value.device, log_value.shape[0]
    checked = bool(growth.checks)  # DDD flags exist only after a check; EAGLE-2's nodes are all valid
    valid = torch.cat([a.expand(t.shape[0]) for a, t in zip(growth.alive, growth.tokens)]) if checked else None  # (P,)
    key = log_value.masked_fill(~valid, -math.inf) if checked else log_value  # (P,) a stopped step's nodes last
    order = torch.sort(key, descending=True, stable=True).indices  # (P,)
    if rule is not None and rule.prices_trees:
        m = _priced_size(key[order], growth.forwards, m, rule)
    m = min(m, total)
    chosen = torch.sort(order[:m]).values  # (M,) pool ids, parents before children
    parents = torch.cat(growth.parents)[chosen]  # (M,) pool ids
    index = torch.zeros(total, dtype=torch.long, device=device)  # (P,) pool id -> tree node (0: not sent)
    index[chosen] = torch.arange(1, m + 1, device=device)
    under = torch.where(parents < 0, 0, index[parents.clamp_min(0)])  # (M,) each parent's tree node (root: 0)
    lost = (parents >= 0) & (under == 0)  # (M,) a sent node whose parent was not sent: never
    tokens = torch.cat(growth.tokens)  # (P,)
    parts = [tokens[chosen], under, torch.cat(growth.log_q)[chosen], chosen]
    if checked:
        parts += [(lost & valid[chosen]).sum()[None], valid[chosen]]
        parts += [h[None] for _, h in growth.checks]
    else:
        parts.append(lost.sum()[None])
    if record:
        parts += [torch.cat(growth.parents), tokens, log_value] + growth.frontiers
    host = torch.cat([p.double() for p in parts]).cpu().tolist()  # the drafter's one device-to-host copy
    return _unpack(growth, host, pending, m, record, total)


def _priced_size(ranked: torch.Tensor, forwards: int, m: int, rule) -> int:
    """A pricing rule's M from the valid values, best first (as tree_draft.tree_proposal asks it)."""
    values = [math.exp(v) for v in ranked.cpu().tolist() if v != -math.inf]
    return max(1, min(m, rule.tree_size(values, forwards, min(m, len(values)))))


def _unpack(growth: DeviceGrowth, host: list[float], pending: int, m: int, record: bool, total: int) -> ReadGrowth:
    cut = _Cursor(host)
    tokens, under, log_q, chosen = (cut.take(m) for _ in range(4))
    assert cut.take(1) == [0.0], "rerank lost an ancestor"
    checked = bool(growth.checks)
    valid = cut.take(m) if checked else [1.0] * m
    heights = cut.take(len(growth.checks))
    sent = int(sum(valid))  # a stopped step's nodes sort last by value and by id: the tail
    tree = DraftTree(tokens=[pending] + [int(t) for t in tokens[:sent]], parents=[-1] + [int(u) for u in under[:sent]],
                     flavor=Flavor.DETERMINISTIC, q_token=[None] + [math.exp(v) for v in log_q[:sent]])
    first = _first_stop(growth, heights)  # a check inside the steps grown (or just before the next, when a pricing
    grown = len(growth.tokens)  # rule's read found it) stopped DDD; later steps' nodes were marked invalid
    steps, stop = (first - 1, "ddd") if first <= grown + 1 else (grown, growth.stop)
    ddd = [{"step": step, "H": h, "x": growth.threshold, "stop": h < growth.threshold}
           for (step, _), h in zip(growth.checks, heights) if step <= steps + 1]
    pool = frontiers = None
    if record:
        parents, pool_tokens, values = cut.take(total), cut.take(total), cut.take(total)
        sizes = [t.shape[0] for t in growth.tokens]
        step_of = [s + 1 for s, n in enumerate(sizes) for _ in range(n)]
        kept = sum(sizes[:steps])
        pool = [{"id": i, "parent": int(parents[i]), "token": int(pool_tokens[i]), "value": math.exp(values[i]),
                 "depth": step_of[i], "step": step_of[i]} for i in range(kept)]
        frontiers = [[int(i) for i in cut.take(f.shape[0])] for f in growth.frontiers][:steps]
    return ReadGrowth(tree, [int(c) for c in chosen[:sent]], steps, stop, ddd, pool, frontiers)


def _first_stop(growth: DeviceGrowth, heights: list[float]) -> int:
    """The step of the first check below x (beyond the last step when none is)."""
    return next((step for (step, _), h in zip(growth.checks, heights) if h < growth.threshold), math.inf)


class _Cursor:
    def __init__(self, values: list[float]):
        self.values, self.at = values, 0

    def take(self, n: int) -> list[float]:
        self.at += n
        return self.values[self.at - n:self.at]
