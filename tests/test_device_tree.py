"""The on-device EAGLE-2 / DDD engine (decoders/drafters/device_tree.py) and EAGLE-1 static tree
(decoders/drafters/static_tree.py) against the host engines they replaced.

`host_grow` below is the host engine as it stood before issue 46 (Python lists, one node at a time): the oracle. On
synthetic drafts with many exact ties (integer logits), over EAGLE-2 and DDD shapes, depth limits and threshold
stops, the device engine must give the same pool (tokens, parents, values to the last bit), frontiers, DDD checks,
stop, chosen set and tree; every frontier's ancestor slots and parent rows must be what the tree says.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from decoders.drafters.device_tree import read
from decoders.drafters.tree_draft import STATIC_TREE, TreeShape, grow
from tree_reference import PoolNode, build_tree, rerank

V = 12


def host_grow(root_logq, expand, shape, max_depth):
    """The host engine of tree_draft.grow before issue 46 (dynamic trees): pool, frontiers, ddd, steps, stop."""
    pool, frontiers, ddd = [], [], []
    top = torch.topk(root_logq, min(shape.k, root_logq.numel()))
    for log_q, token in zip(top.values.tolist(), top.indices.tolist()):
        pool.append(PoolNode(parent=-1, token=token, log_value=log_q, log_q=log_q, depth=1, step=1))
    frontier = sorted(range(len(pool)), key=lambda i: (-pool[i].log_value, i))[:shape.beam]
    frontiers.append(frontier)
    steps, depth_cap = 1, min(shape.steps, max_depth)
    for step in range(2, depth_cap + 1):
        if step in shape.checks:
            h = float(torch.logsumexp(torch.tensor([pool[i].log_value for i in frontier]), 0))
            ddd.append({"step": step, "H": h, "x": shape.threshold, "stop": h < shape.threshold})
            if h < shape.threshold:
                return pool, frontiers, ddd, steps, "ddd"
        logq = expand([pool[i].token for i in frontier], step - 1)  # (F, V)
        top = torch.topk(logq, min(shape.k, logq.shape[-1]), dim=-1)
        added = []
        for row, parent in enumerate(frontier):
            base = pool[parent]
            for log_q, token in zip(top.values[row].tolist(), top.indices[row].tolist()):
                pool.append(PoolNode(parent, token, base.log_value + log_q, log_q, base.depth + 1, step))
                added.append(len(pool) - 1)
        frontier = sorted(added, key=lambda i: (-pool[i].log_value, i))[:shape.beam]
        frontiers.append(frontier)
        steps = step
    return pool, frontiers, ddd, steps, "budget" if depth_cap < shape.steps else "depth"


def _draft(seed: int):
    """A draft whose log-probs depend on (token, depth) only, from integer logits: exact ties are common."""
    g = torch.Generator().manual_seed(seed)
    table = torch.log_softmax(torch.randint(0, 3, (V, 8, V), generator=g).float(), -1)  # (token, depth, V)
    root = torch.log_softmax(torch.randint(0, 3, (V,), generator=g).float(), -1)  # (V,)
    return root, lambda tokens, depth: table[torch.as_tensor(tokens), depth]  # (F, V)


SHAPES = [TreeShape(k=k, steps=d, m=m) for k, d, m in itertools.product((1, 2, 3, 5), (1, 2, 4), (1, 6, 40))] + [
    TreeShape.ddd(k=k, m=m, checks=checks, threshold=x, steps=5, width=w)
    for k, m, checks, x, w in itertools.product((2, 3), (4, 30), ((2,), (2, 3, 4)), (-math.inf, -1.5, -3.0), (2, 5))]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("stops_read_on", [frozenset(), frozenset({"cpu"})], ids=["gpu-like", "cpu"])
def test_device_growth_equals_the_host_engine(seed, stops_read_on, monkeypatch):
    from decoders.drafters import device_tree

    monkeypatch.setattr(device_tree, "STOPS_READ_ON", stops_read_on)  # DDD: flag only, or stop at the check
    root, table = _draft(seed)
    for shape, max_depth in itertools.product(SHAPES, (2, 64)):
        fed = []  # every Frontier the device engine fed, in order

        def expand(frontier):
            fed.append(frontier)
            return table(frontier.tokens, frontier.depth)

        grown = grow(root, expand, shape, max_depth)
        pool, frontiers, ddd, steps, stop = host_grow(root, lambda tokens, depth: table(tokens, depth), shape,
                                                      max_depth)
        done = read(grown, 99, shape.m, record=True)
        case = (seed, shape, max_depth)
        assert [(p["token"], p["parent"], p["depth"], p["step"]) for p in done.pool] == \
               [(n.token, n.parent, n.depth, n.step) for n in pool], case
        assert [p["value"] for p in done.pool] == [math.exp(n.log_value) for n in pool], case  # bit for bit
        assert (done.frontiers, done.ddd, done.steps, done.stop) == (frontiers, ddd, steps, stop), case
        chosen = rerank(pool, shape.m)
        tree = build_tree(99, pool, chosen)
        assert done.chosen == chosen, case
        assert (done.tree.tokens, done.tree.parents, done.tree.q_token) == (tree.tokens, tree.parents, tree.q_token)
        _check_frontiers(fed, pool)


def _check_frontiers(fed, pool):
    """Each fed frontier's seen row marks exactly its ancestors' slots; its rows point at its parents."""
    slots: list[int] = []  # pool ids in feeding order
    previous: list[int] = []
    for frontier in fed:
        ids = frontier.ids.tolist()
        if frontier.fed == len(slots) and ids and max(ids) < len(pool):  # steps after a DDD stop are not checked
            for row, node in enumerate(ids):
                ancestors, up = set(), pool[node].parent
                while up != -1:
                    ancestors.add(up)
                    up = pool[up].parent
                assert [s for s, pid in enumerate(slots) if pid in ancestors] == \
                       frontier.seen[row].nonzero().flatten().tolist()
                expected_row = previous.index(pool[node].parent) if pool[node].parent >= 0 else 0  # the root's row
                assert int(frontier.rows[row]) == expected_row
        slots += ids
        previous = ids


def host_grow_static(root_logq, expand, paths, max_depth):
    """tree_draft.grow_static before issue 46 (Python lists, one read a depth): pool, frontiers, steps, stop."""
    pool, frontiers, node_of, steps = [], [], {}, 0
    depth_cap = min(max(len(p) for p in paths), max_depth)
    for depth in range(1, depth_cap + 1):
        level = [p for p in paths if len(p) == depth]
        if depth == 1:
            rows, logq = {(): 0}, root_logq[None]  # (1, V)
        else:
            parents = list(dict.fromkeys(node_of[p[:-1]] for p in level))  # pool ids, first-listed first
            logq = expand([pool[i].token for i in parents], depth - 1)  # (F, V)
            rows = {path: parents.index(i) for path, i in node_of.items() if i in parents}
        ranked = torch.topk(logq, max(p[-1] for p in level) + 1, dim=-1)
        values, tokens = ranked.values.double().tolist(), ranked.indices.tolist()
        for path in level:
            row, parent = rows[path[:-1]], node_of.get(path[:-1], -1)
            base = pool[parent].log_value if parent >= 0 else 0.0
            log_q = values[row][path[-1]]
            pool.append(PoolNode(parent, tokens[row][path[-1]], base + log_q, log_q, depth, depth))
            node_of[path] = len(pool) - 1
        frontiers.append([node_of[p] for p in level])
        steps = depth
    return pool, frontiers, steps, "depth" if depth_cap == max(len(p) for p in paths) else "budget"


STATIC_PATHS = [STATIC_TREE, ((0,), (1,), (2,), (0, 0), (1, 0), (0, 1), (2, 0), (0, 0, 0)), ((0,), (0, 0), (0, 0, 0)),
                ((0,), (1,), (2,), (3,), (4,), (4, 0), (0, 1), (0, 0), (4, 0, 2), (0, 1, 3), (4, 0, 2, 0))]


@pytest.mark.parametrize("seed", range(4))
def test_the_static_tree_on_the_device_equals_the_host_engine(seed):
    """EAGLE-1's tree: same pool (values to the bit), frontiers, steps, stop, chosen set and tree, and every fed
    frontier's ancestor slots and parent rows as the tree says; one read (device_tree.read) a round."""
    root, table = _draft(seed)
    for paths, max_depth in itertools.product(STATIC_PATHS, (1, 2, 3, 64)):
        shape, fed = TreeShape.static(paths), []

        def expand(frontier):
            fed.append(frontier)
            return table(frontier.tokens, frontier.depth)

        grown = grow(root, expand, shape, max_depth)
        pool, frontiers, steps, stop = host_grow_static(root, table, paths, max_depth)
        done = read(grown, 99, shape.m, record=True)
        case = (seed, paths, max_depth)
        assert [(p["token"], p["parent"], p["depth"], p["step"]) for p in done.pool] == \
               [(n.token, n.parent, n.depth, n.step) for n in pool], case
        assert [p["value"] for p in done.pool] == [math.exp(n.log_value) for n in pool], case  # bit for bit
        assert (done.frontiers, done.steps, done.stop, grown.forwards) == (frontiers, steps, stop, len(fed) + 1)
        chosen = rerank(pool, shape.m)
        tree = build_tree(99, pool, chosen)
        assert done.chosen == chosen == list(range(len(pool))), case  # a static tree sends every node grown
        assert (done.tree.tokens, done.tree.parents, done.tree.q_token) == (tree.tokens, tree.parents, tree.q_token)
        _check_frontiers(fed, pool)


def test_the_mask_lets_each_node_see_the_context_its_ancestors_and_itself():
    from decoders.drafters.device_tree import Frontier

    seen = torch.tensor([[True, False, True], [False, True, False]])  # (F, fed)
    frontier = Frontier(torch.tensor([5, 6]), torch.tensor([1, 2]), torch.tensor([0, 1]), seen, 3, 3)
    mask = frontier.mask(2, torch.float32)  # (2, 2 + 3 + 2)
    allowed = (mask == 0).tolist()
    assert allowed == [[True, True, True, False, True, True, False], [True, True, False, True, False, False, True]]
    assert (mask[mask != 0] == torch.finfo(torch.float32).min).all()


@pytest.mark.parametrize("record", [True, False])
def test_a_greedy_chain_on_the_device_equals_the_host_chain(record):
    """draft_chain(tensors=True) feeds each argmax back as a (1,) tensor and reads once: same tree, checks, q."""
    from decoders.drafters.base import draft_chain
    from decoders.rules import HeuristicRule, StaticRule
    from decoders.sampling import Warp

    table = torch.log_softmax(torch.randint(0, 3, (V, V), generator=torch.Generator().manual_seed(1)).float(), -1)
    fed = []

    def step(tokens):
        fed.append(tokens)
        return table[torch.as_tensor(tokens)[-1]]  # (V,) from the last token only

    for rule in (StaticRule(5), HeuristicRule(4, 8)):
        host = draft_chain(step, [3], 5, rule, Warp(0.0), torch.Generator(), record)
        device = draft_chain(step, [3], 5, rule, Warp(0.0), torch.Generator(), record, tensors=True)
        assert (device.tree.tokens, device.tree.parents, device.tree.q_token) == \
               (host.tree.tokens, host.tree.parents, host.tree.q_token)
        assert (device.checks, device.forwards, device.reason) == (host.checks, host.forwards, host.reason)
    assert any(isinstance(tokens, torch.Tensor) for tokens in fed)  # the device chain never read its drafts
