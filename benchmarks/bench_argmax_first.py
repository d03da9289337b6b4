"""Exact expected accepted draft tokens per round: stock tree vs sampled vs argmax-first children.

Offline, no model: synthetic context-dependent worlds (``expand_exact.perturbed_world``: Dirichlet
targets p, drafters q = p exp(sigma z) renormalised, optionally flattened to q^(1/F), a drafter less
confident than the target) read at temperature T (p^(1/T), q^(1/T), renormalised). Per world and
server shape (D, k, N), the exact expected accepted draft tokens of one round from the empty prefix:

* stock: SGLang's tree (deterministic top-k beam, pruned to the N - 1 best path scores) +
  ``target-only``;
* sampled: ``spine_wide`` with Gumbel top-k children + ``hsd`` (``--hsd-tree-draft sampled``);
* argmax-first: ``spine_wide`` with argmax-first children + ``hsd`` (``--hsd-tree-draft argmax-first``),
  and the same under the ``beam`` rule (``--hsd-tree-rule beam``), closer to the stock tree's shape.

The laws come from the sequential oracle ``oracles/expand_exact.py``, whose round law equals the
batched drafter's (``tests/tree_draft/test_argmax_first.py::test_round_law_is_the_sequential_rule``).
Tiny vocabularies overstate what sampled children cover; recorded real distributions:
``bench_tree.py`` (its budgeted table has an argmax-first column).

    PYTHONPATH=. python benchmarks/bench_argmax_first.py
"""

from __future__ import annotations

import argparse

import numpy as np

from sglang_hsd.verify.oracles.exact import TabularWorld
from sglang_hsd.verify.oracles.expand_exact import Shape, expand_round_law, perturbed_world

# (label, Dirichlet concentration, sigma, flattening F of the drafter)
WORLDS = [("peaked, close q", 0.3, 0.5, 1.0), ("peaked, noisy q", 0.3, 1.0, 1.0),
          ("peaked, flat q", 0.3, 0.5, 2.0), ("flat p, close q", 1.0, 0.5, 1.0)]
RULES = {"stock": ("stock", "sampled"), "sampled": ("spine_wide", "sampled"),
         "argmax-first": ("spine_wide", "argmax-first"), "argmax-first beam": ("beam", "argmax-first")}


def at_temperature(world: TabularWorld, temperature: float, flatten: float) -> TabularWorld:
    """p and q read at ``temperature`` (q additionally flattened by ``flatten``)."""
    def power(rows, exponent):
        rows = rows ** exponent
        return rows / rows.sum(-1, keepdims=True)

    return TabularWorld(world.vocab_size, world.max_len, power(world.target, 1.0 / temperature),
                        power(world.draft, 1.0 / (temperature * flatten)))


def table(vocab: int, seeds: int, shapes, temperatures) -> list[str]:
    lines = [f"V = {vocab}, mean over {seeds} seeds per world family; accepted draft tokens per round (exact)", "",
             "| shape | T | world | stock + target-only | sampled + hsd | argmax-first + hsd | af - stock | af - sampled | argmax-first beam + hsd |",
             "|---" * 9 + "|"]
    for shape in shapes:
        for temperature in temperatures:
            for label, concentration, sigma, flatten in WORLDS:
                values = {name: [] for name in RULES}
                for seed in range(seeds):
                    world = at_temperature(perturbed_world(vocab, shape[0], seed, concentration, sigma), temperature, flatten)
                    for name, (rule, children) in RULES.items():
                        values[name].append(expand_round_law(world, rule, Shape(*shape), children=children).expected_accepted)
                mean = {name: float(np.mean(v)) for name, v in values.items()}
                lines.append(f"| {':'.join(map(str, shape))} | {temperature} | {label} | {mean['stock']:.3f} | "
                             f"{mean['sampled']:.3f} | {mean['argmax-first']:.3f} | "
                             f"{mean['argmax-first'] - mean['stock']:+.3f} | {mean['argmax-first'] - mean['sampled']:+.3f} | {mean['argmax-first beam']:.3f} |")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--shapes", nargs="+", default=["5:4:8", "4:2:8"])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    args = parser.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split(":")) for s in args.shapes]
    print("\n".join(table(args.vocab, args.seeds, shapes, args.temperatures)))


if __name__ == "__main__":
    main()
