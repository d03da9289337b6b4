"""Plugin configuration: which chain verifier HSD runs, read from the environment.

SGLang's ``ServerArgs`` is a closed dataclass that is pickled to every scheduler process, so a
plugin cannot add a field to it. ``register()`` does add ``--hsd-verify-method`` to the launcher's
argument parser (``ServerArgs.add_cli_args`` is wrapped); the flag's action stores the value in the
``SGLANG_HSD_VERIFY_METHOD`` environment variable, which every process SGLang spawns inherits.
Setting the variable directly works too (e.g. for ``sglang.Engine`` in Python).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

VERIFY_METHOD_ENV = "SGLANG_HSD_VERIFY_METHOD"
VALIDATE_ENV = "SGLANG_HSD_VALIDATE"
# Lossless chain verifiers the server may run (``hsd-paper`` is lossy and never served).
SERVER_VERIFY_METHODS = ("hsd", "tokenwise")
ALGORITHM_NAME = "HSD"
# Defaults when the user gives none of steps / topk / draft tokens: a 4-token chain.
DEFAULT_NUM_STEPS = 4
DEFAULT_TOPK = 1


@dataclass(frozen=True)
class PluginConfig:
    """Fields:
        verify_method: chain verifier for sampled requests ("hsd" or "tokenwise").
        validate: check verifier inputs on every step (slow; for debugging).
    """

    verify_method: str = "hsd"
    validate: bool = False

    @classmethod
    def from_env(cls) -> "PluginConfig":
        method = os.environ.get(VERIFY_METHOD_ENV, "hsd").strip().lower()
        if method not in SERVER_VERIFY_METHODS:
            raise ValueError(
                f"{VERIFY_METHOD_ENV}={method!r} is not a lossless chain verifier; use one of "
                f"{SERVER_VERIFY_METHODS} (--hsd-verify-method)"
            )
        return cls(verify_method=method, validate=os.environ.get(VALIDATE_ENV, "0") == "1")
