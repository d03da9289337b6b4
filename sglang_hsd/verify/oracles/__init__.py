"""Oracles of the verifiers, apart from the serving path.

``exact.py`` (chains) and ``tree_exact.py`` (trees) enumerate the exact law of speculative rounds
on tiny tabular worlds in float64; ``simulate.py`` runs the real batched verifiers on those worlds
(Monte Carlo); ``stats.py`` holds the chi-square tests that compare the two; ``report.py`` is the
losslessness report of ``sglang-hsd check``. ``adaptive_exact.py`` and ``adaptive_rounds_exact.py``
enumerate rounds whose draft length adapts (within a round; across rounds by ``BudgetController``),
``adaptive_rounds_simulate.py`` runs the controller with the batched ``verify_chain``.
"""
