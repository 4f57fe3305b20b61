"""How long the app takes to draw one big draft tree (moved here from tests/test_render.py: a timing with no bound).

python -m bench.render_timing [--nodes 100] [--reps 5]

Builds a random bushy round of `--nodes` nodes (every node rejected or not reached, so every status style is
drawn), times app.figures.tree.tree_figure and the figure's JSON serialization (what Gradio sends to the browser),
and prints the minimum over repetitions in ms (the least disturbed by other jobs on the machine).
"""
from __future__ import annotations

import argparse
import random
import time

from decoders.trace import NodeRecord, RoundRecord, Trace


def random_round(n: int, rng: random.Random) -> RoundRecord:
    """A round of n nodes, each hanging off one of the 12 nodes before it (bushy and deep)."""
    nodes = [NodeRecord(0, -1, 0, "r", 0, None, None, None, None, "root")]
    for i in range(1, n):
        parent = rng.randrange(max(0, i - 12), i)
        nodes.append(NodeRecord(i, parent, i, f"t{i}", nodes[parent].depth + 1, 0.5, 0.5, 1.0, 0.3,
                                rng.choice(["rejected", "not_reached"])))
    return RoundRecord(index=0, n_drafted=n - 1, n_accepted=0, committed=[7], provenance=["resampled"],
                       bonus_token=7, bonus_text="b", bonus_source="resampled", nodes=nodes)


def measure(n_nodes: int, reps: int) -> dict:
    """Minimum build and serialization time (ms) of the tree figure for one n-node round."""
    from app.figures.tree import tree_figure

    trace = Trace(method="speculative", label="bench", options={"rule": "static", "gamma": 12}, models={},
                  precision="", prompt="", prompt_ids=[1], rounds=[random_round(n_nodes, random.Random(0))])
    build, serialize = [], []
    for _ in range(reps):
        start = time.perf_counter()
        figure = tree_figure(trace, 0)
        build.append(time.perf_counter() - start)
        start = time.perf_counter()
        figure.to_json()
        serialize.append(time.perf_counter() - start)
    return {"nodes": n_nodes, "build_ms": 1000 * min(build), "serialize_ms": 1000 * min(serialize)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    result = measure(args.nodes, args.reps)
    print(f"{result['nodes']}-node tree figure: built in {result['build_ms']:.1f} ms, "
          f"serialized in {result['serialize_ms']:.1f} ms (min of {args.reps})")


if __name__ == "__main__":
    main()
