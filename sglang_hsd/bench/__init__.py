"""``sglang-hsd bench``: HSD against no speculation, measured with SGLang's own serving client.

Modules: ``config`` (the options and the refusals that need nothing started), ``plan`` (the two
servers, prompts and rows, decided and checked before anything starts), ``run`` (each server in
turn, every row's client run), ``report`` (the table, ``bench.json``, ``bench.png``), ``cli``
(the subcommand). Shared with the project's serving benchmarks (``benchmarks/``): ``client``
(SGLang's client with each request's accept length kept), ``server_info`` (``/server_info``),
``prompts`` (prompt files) and ``record`` (commit, command, machine and load of a run).
"""
