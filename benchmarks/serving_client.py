"""SGLang's serving benchmark client with every request's accept length kept: moved to
``sglang_hsd/bench/client.py`` (``sglang-hsd bench`` runs it too); re-exported here for the
scripts and tests that import it from this module.

Use: ``[sys.executable, "-c", PER_REQUEST_CLIENT, <the client's own arguments>]`` with
``PER_REQUEST_ENV`` set in the client's environment, or ``run_client``.
"""

from __future__ import annotations

from sglang_hsd.bench.client import (  # noqa: F401
    DATASETS_STUB, PER_REQUEST_CLIENT, PER_REQUEST_ENV, mean_se, read_per_request)
