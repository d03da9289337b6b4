"""SGLang plugin: ``python -m sglang.launch_server --speculative-algorithm HSD ...``.

Loaded by SGLang from the ``sglang.srt.plugins`` entry point (``hsd``) in every process it
starts. ``register()`` is idempotent, imports SGLang only when called, checks the signature of
every SGLang symbol it subclasses or replaces (``signatures.py``) and refuses loudly on drift.

What it installs:
* the ``HSD`` algorithm (``SpeculativeAlgorithm.register``) with ``HSDSpecAlgo``
  (``spec_algo.py``): an EAGLE-3 family member that fills in the methods SGLang 0.5.23's
  ``CustomSpecAlgo`` lacks;
* ``HSDWorker`` (``worker.py``), built by the scheduler: the EAGLE-3 V2 worker with sampled
  drafts whose full q is scattered to the target vocabulary (``draft_worker.py``); it reads the
  configuration (``config.py``) once, installs our chain verifier behind SGLang's own verify entry
  point (``verify_hook.py``) and, with an exit layer, runs an intermediate early-exit verifier
  level (``exit_level.py``);
* ``--hsd-verify-method {hsd,tokenwise}``, ``--hsd-exit-layer L``, ``--hsd-exit-heads DIR|none``,
  ``--hsd-exit-method``, ``--hsd-exit-buffer N``, ``--hsd-plan plan.json`` on the launcher's
  parser (``cli_flags.py``), CPU stand-ins for missing sampling kernels and an ``hsd`` entry in
  ``/server_info`` (``runtime_patches.py``).

CPU-only machines also need ``cpu/cpu_shims.py`` installed before SGLang is imported; put
``BOOTSTRAP_DIR`` on ``PYTHONPATH`` (see ``cpu/_bootstrap/sitecustomize.py``).
"""

from __future__ import annotations

import logging
import os

from sglang_hsd.sglang_plugin.config import ALGORITHM_NAME

logger = logging.getLogger(__name__)

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu", "_bootstrap")
_REGISTERED = False


def register() -> None:
    """Register ``HSD`` with SGLang. Safe to call any number of times, in any process."""
    global _REGISTERED
    if _REGISTERED:
        return
    from sglang_hsd.sglang_plugin.signatures import check_all_signatures

    check_all_signatures()  # before touching anything: refuse on any drift
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from sglang_hsd.sglang_plugin.runtime_patches import install_patches
    from sglang_hsd.sglang_plugin.server_args import validate_hsd_server_args
    from sglang_hsd.sglang_plugin.spec_algo import HSDSpecAlgo, check_spec_class, create_hsd_worker

    if get_spec(ALGORITHM_NAME) is None:
        check_spec_class()
        SpeculativeAlgorithm.register(
            ALGORITHM_NAME, supports_overlap=True,
            validate_server_args=validate_hsd_server_args, spec_class=HSDSpecAlgo,
        )(create_hsd_worker)
    install_patches()
    _REGISTERED = True
    logger.info("sglang-hsd: registered speculative algorithm %s", ALGORITHM_NAME)


__all__ = ["register", "BOOTSTRAP_DIR", "ALGORITHM_NAME"]
