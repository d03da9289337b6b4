"""The settings of the lookup level below a draft language model (``draft_lookup.py``):
``--hsd-draft-lookup`` and ``--hsd-draft-lookup-copies``, read back from the environment in every
scheduler process, and the server options they cannot run with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

LOOKUP_FLAG = "--hsd-draft-lookup"
LOOKUP_ENV = "SGLANG_HSD_DRAFT_LOOKUP"
COPIES_FLAG = "--hsd-draft-lookup-copies"
COPIES_ENV = "SGLANG_HSD_DRAFT_LOOKUP_COPIES"


@dataclass(frozen=True)
class LookupSetting:
    """Fields:
        ngram: the longest suffix the lookup matches (``lookup_draft.lookup_continuation``);
            0: no lookup level (the default).
        copies: the most tokens one lookup copies (None: as many as the round's chain has room
            for). Each copy is a row of the draft model's forward, so on CPU, where a forward's
            cost grows with its rows, a cap keeps rejected copies cheap.
    """

    ngram: int = 0
    copies: int | None = None

    @property
    def enabled(self) -> bool:
        return self.ngram > 0

    @classmethod
    def from_env(cls) -> "LookupSetting":
        """The flags' values, or an ``--hsd-plan`` file's lookup level (``lookup:N`` with its
        buffer as the copies). Raises ValueError naming the flag for a value that is not an
        integer of its range, or for both a plan's lookup level and the flags."""
        ngram = _count(LOOKUP_ENV, LOOKUP_FLAG, off_word="off")
        copies = _count(COPIES_ENV, COPIES_FLAG)
        if copies is not None and not ngram:
            raise ValueError(f"{COPIES_FLAG} {copies} needs {LOOKUP_FLAG} <longest n-gram>")
        planned = planned_lookup()
        if planned is not None:
            if ngram is not None or copies is not None:
                raise ValueError(f"{LOOKUP_FLAG} / {COPIES_FLAG} with an --hsd-plan lookup level "
                                 f"(lookup:{planned[0]}, {planned[1]} copies): give one of them")
            return cls(planned[0], planned[1])
        return cls(ngram or 0, copies)


def planned_lookup() -> tuple[int, int, int] | None:
    """(longest n-gram, copies, the draft model's buffer) of the ``--hsd-plan`` file's lookup
    level; None without a plan or a lookup level in it (a bad plan is reported by the plan's own
    validation, ``server_args.plan_problems``)."""
    from sglang_hsd.sglang_plugin.config import PLAN_ENV, ExitLevelConfigError, lookup_from_plan

    path = os.environ.get(PLAN_ENV, "").strip()
    if not path:
        return None
    try:
        return lookup_from_plan(path)
    except ExitLevelConfigError:
        return None


def _count(env: str, flag: str, off_word: str | None = None) -> int | None:
    """A positive integer from ``env`` (None when unset; ``off_word`` reads as 0)."""
    text = os.environ.get(env, "").strip().lower()
    if not text:
        return None
    if off_word is not None and text == off_word:
        return 0
    expected = "a positive integer" + (f" or {off_word}" if off_word else "")
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{flag} ({env}): expected {expected}, got {text!r}") from None
    if value < 1:
        raise ValueError(f"{flag} ({env}): expected {expected}, got {value}")
    return value


def lookup_problems(args, plan_exit_level: bool) -> list[str]:
    """What the lookup level cannot run with: it replaces the draft steps of a chain round of a
    separate draft language model, on CPU, with no other intermediate level.

    Args:
        args: SGLang's ``ServerArgs``.
        plan_exit_level: whether the ``--hsd-plan`` file has an exit level.
    """
    from sglang_hsd.sglang_plugin.config import EXIT_LAYER_ENV
    from sglang_hsd.sglang_plugin.draft_kind import MODEL, resolve_draft_kind

    try:
        setting = LookupSetting.from_env()
    except ValueError as err:
        return [str(err)]
    if not setting.enabled:
        return []
    draft = args.speculative_draft_model_path
    draft_model = draft is not None and resolve_draft_kind(draft) == MODEL
    exit_level = plan_exit_level or bool(os.environ.get(EXIT_LAYER_ENV, "").strip())
    flag = f"{LOOKUP_FLAG} {setting.ngram}"
    problems = []
    if not draft_model:
        problems.append(f"{flag}: the lookup's copies are verified by a separate draft language model "
                        "(--hsd-draft-kind model); an EAGLE-3 head reads the target's hidden states "
                        "of every position, which copies do not have")
    if (args.speculative_eagle_topk or 1) > 1:
        problems.append(f"{flag} with --speculative-eagle-topk {args.speculative_eagle_topk}: the lookup "
                        "level drafts chains; use --speculative-eagle-topk 1")
    if (args.device or "cuda") != "cpu":
        problems.append(f"{flag} with --device {args.device or 'cuda'}: the draft CUDA graph and the "
                        "overlap scheduler bypass the lookup level; CPU only (--device cpu)")
    planned = planned_lookup()
    if planned is not None and planned[2] != args.speculative_num_steps:
        problems.append(f"--hsd-plan lookup:{planned[0]} drafts for a draft model whose buffer is {planned[2]}: "
                        f"pass --speculative-num-steps {planned[2]} (got {args.speculative_num_steps})")
    if exit_level:
        problems.append(f"{flag} with an exit level (--hsd-exit-layer or an --hsd-plan exit level): "
                        "the server runs one intermediate level; drop one of them")
    return problems
