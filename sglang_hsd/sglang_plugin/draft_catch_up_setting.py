"""The settings of the draft-cache catch-up (``draft_catch_up.py``): ``--hsd-draft-catch-up``
and ``--hsd-draft-extend``, read back from the environment in every scheduler process, and where
the catch-up cannot run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sglang_hsd.sglang_plugin.config import on_off_from_env

CATCH_UP_ENV = "SGLANG_HSD_DRAFT_CATCH_UP"
CATCH_UP_FLAG = "--hsd-draft-catch-up"
EXTEND_ENV = "SGLANG_HSD_DRAFT_EXTEND"
EXTEND_FLAG = "--hsd-draft-extend"
EXTEND_MODES = ("tail", "window")

@dataclass(frozen=True)
class CatchUpSetting:
    """Fields:
        enabled: the flag's value (True: on, the default).
        explicit: whether the user set it (the default turns itself off where unsupported; an
            explicit ``on`` is refused there).
        tail: ``--hsd-draft-extend`` (True: ``tail``, the default; False: ``window``).
        tail_explicit: whether the user set ``--hsd-draft-extend`` (an explicit ``tail`` is
            refused where the catch-up does not run).
    """

    enabled: bool = True
    explicit: bool = False
    tail: bool = True
    tail_explicit: bool = False

    @classmethod
    def from_env(cls) -> "CatchUpSetting":
        value = on_off_from_env(CATCH_UP_ENV, CATCH_UP_FLAG)
        extend = os.environ.get(EXTEND_ENV, "").strip().lower()
        if extend and extend not in EXTEND_MODES:
            raise ValueError(f"{EXTEND_FLAG} ({EXTEND_ENV}) must be one of "
                             f"{', '.join(EXTEND_MODES)}, got {extend!r}")
        return cls(value != "off", explicit=value is not None, tail=extend != "window",
                   tail_explicit=bool(extend))


def unsupported_reason(device: str, draft_model: bool, adaptive_off: str | None) -> str | None:
    """Why the catch-up cannot run with this server, or None. ``adaptive_off``: why no round
    drafts zero tokens (``--hsd-adaptive`` off or not applied), or None."""
    if not draft_model:
        return ("an EAGLE-3 draft head (its extend reads the target's hidden states of every "
                "position; only --hsd-draft-kind model is supported)")
    if device != "cpu":
        return (f"--device {device} (the overlap scheduler and draft CUDA graphs bypass the "
                "catch-up; CPU only)")
    if adaptive_off is not None:
        return f"{adaptive_off} (no round drafts zero tokens)"
    return None
