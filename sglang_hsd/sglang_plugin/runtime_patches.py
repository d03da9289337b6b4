"""What ``register()`` changes in SGLang at run time, in every process it loads in.

* on platforms without them (CPU), torch versions of the top-k / top-p renormalisation kernels and
  of the draft sampler's Triton ``row_argmax``, and on CPU the draft sampler's draw by inverse
  transform sampling instead of an exponential race (``cpu/cpu_sampling.py``);
* on CPU, the eager form of SGLang's ``torch.compile``-d ``_select_top_k_tokens_later`` (the
  draft steps after the first): compiling it on its first call, with inductor probing the CPU's
  vector instructions by building test programs, took 11-15 s of the first round drafting two
  tokens, in every server (its start-up warm-up, every test server), for a handful of small
  ops per draft step;
* on CPU, the eager form of SGLang's ``torch.compile``-d ``apply_scaling_penalties`` (the
  repetition penalty, in its module and where ``sampling_batch_info`` imported it): its compile
  made the first request with a ``repetition_penalty`` take 15.1 s for 16 tokens on a tiny model
  (the next ones 0.08 s), in every server, with or without speculation;
* on CPU with ``--hsd-cpu-linear onednn-packed``, oneDNN's packed kernel for the unquantized
  float32 linear layers and lm_head of every model loaded (``cpu/linear_path.py``);
* the ``--hsd-*`` flags on the launcher's parser (``cli_flags.py``);
* ``/server_info`` -> ``internal_states[]`` gains an ``hsd`` entry (``hsd_internal_state``);
* SGLang's output streamer returns ``meta_info["hsd_draft_budget"]`` (each decode round's draft
  length under ``--hsd-adaptive``) once per request (``adaptive_spec.py``);
* seeded requests (``--hsd-request-seeds``, default auto): stream seeds for an HSD batch with a
  seeded request, kept through SGLang's batch merge and filter, seeded drafts drawn with the
  target's keys, and SGLang's torch sampler taking min-p with a seed (``request_seeds.py``);
* an HSD server's requests have their token ids checked against the vocabulary before they are
  scheduled (``request_validation.py``: an id outside it killed the scheduler).

Every replaced SGLang function keeps its original as ``__sglang_hsd_original__`` (the signature
checks read it). The verify hooks are not installed here but by each ``HSDWorker``
(``verify_hook.install_verify_hooks``), bound to that worker's state.
"""

from __future__ import annotations

from sglang_hsd.sglang_plugin.adaptive_spec import install_request_level_key
from sglang_hsd.sglang_plugin.cli_flags import extend_cli
from sglang_hsd.sglang_plugin.config import ALGORITHM_NAME
from sglang_hsd.sglang_plugin.request_seeds import install_request_seeds
from sglang_hsd.sglang_plugin.request_validation import install_request_validation


def install_patches() -> None:
    """Install the patches listed in the module docstring (SGLang imported here)."""
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative import eagle_utils, spec_utils
    from sglang.srt.utils import is_cpu

    from sglang_hsd.sglang_plugin.cpu import cpu_sampling
    from sglang_hsd.sglang_plugin.cpu.linear_path import CpuLinearConfig, install_cpu_linear_path

    if eagle_utils.top_k_renorm_prob is None:  # no renorm kernels on this platform
        eagle_utils.top_k_renorm_prob = cpu_sampling.top_k_renorm_prob
    if eagle_utils.top_p_renorm_prob is None:
        eagle_utils.top_p_renorm_prob = cpu_sampling.top_p_renorm_prob
    if is_cpu():  # SGLang's draft sampler calls a Triton argmax kernel; torch's on CPU
        original = spec_utils.row_argmax
        spec_utils.row_argmax = cpu_sampling.torch_row_argmax
        spec_utils.row_argmax.__sglang_hsd_original__ = original
        # The draft sampler's draw (sample_draft_proposal calls it through the module).
        if not hasattr(spec_utils.fast_sample, "__sglang_hsd_original__"):
            spec_utils.fast_sample = cpu_sampling.make_draft_fast_sample(spec_utils.fast_sample)
        _run_eagerly(spec_utils, "_select_top_k_tokens_later")
        from sglang.srt.sampling import sampling_batch_info
        from sglang.srt.sampling.penaltylib import repetition_penalty

        _run_eagerly(repetition_penalty, "apply_scaling_penalties")
        _run_eagerly(sampling_batch_info, "apply_scaling_penalties")
        # Every server in this process, speculative or not, runs the same linear kernels.
        install_cpu_linear_path(CpuLinearConfig.from_env())
    extend_cli(ServerArgs)
    extend_internal_state()
    install_request_seeds()
    install_request_validation()
    install_request_level_key()


def _run_eagerly(module, name: str) -> None:
    """Replace ``module.name``, a ``torch.compile``-d function, by the function it compiles
    (module docstring). Idempotent: a function that is not compiled (this replacement included)
    is left alone."""
    compiled = getattr(module, name)
    eager = getattr(compiled, "_torchdynamo_orig_callable", None)
    if eager is None:
        return

    def run(*args, **kwargs):
        return eager(*args, **kwargs)

    run.__name__ = run.__qualname__ = name
    run.__sglang_hsd_original__ = compiled
    setattr(module, name, run)


def extend_internal_state() -> None:
    """``/server_info`` -> ``internal_states[]`` gains ``hsd``: per-level statistics of the exit
    level (when configured) and the KV pool's free slots (for leak checks)."""
    from sglang.srt.managers.scheduler_components.internal_state import (
        SchedulerInternalStateController as controller,
    )

    original = controller.__dict__["_add_speculative"]
    if getattr(original, "__sglang_hsd_original__", None) is not None:
        return

    def _add_speculative(self, state):
        original(self, state)
        scheduler = self.scheduler
        if not hsd_is_active_for(scheduler):
            return
        state["hsd"] = hsd_internal_state(scheduler)

    _add_speculative.__sglang_hsd_original__ = original
    controller._add_speculative = _add_speculative


def hsd_is_active_for(scheduler) -> bool:
    """True when ``scheduler`` (SGLang's ``Scheduler``) runs ``--speculative-algorithm HSD``."""
    algorithm = getattr(scheduler, "spec_algorithm", None)
    if algorithm is None:
        return False
    return str(getattr(algorithm, "name", algorithm)).upper() == ALGORITHM_NAME


def hsd_internal_state(scheduler) -> dict:
    """The ``hsd`` entry of a scheduler's internal state."""
    worker = getattr(scheduler, "draft_worker", None)
    exit_level = getattr(worker, "hsd_exit", None)
    allocator = scheduler.token_to_kv_pool_allocator
    state = {
        "kv_available_size": int(allocator.available_size()),
        "kv_evictable_size": int(scheduler.tree_cache.evictable_size()),
        "max_total_num_tokens": int(scheduler.max_total_num_tokens),
        "exit_layer": None if exit_level is None else exit_level.exit_layer,
    }
    # The draft model's KV pool (its own cache for a draft language model) and whether its slots
    # come from the target's allocator, as in SGLang's EAGLE and STANDALONE workers.
    draft_runner = getattr(getattr(worker, "_draft_worker", None), "draft_runner", None)
    draft_allocator = getattr(draft_runner, "token_to_kv_pool_allocator", None)
    if draft_allocator is not None:
        state["draft_kv_available_size"] = int(draft_allocator.available_size())
        state["draft_kv_shares_allocator"] = draft_allocator is allocator
    adaptive = getattr(worker, "hsd_adaptive", None)
    state["adaptive"] = {"enabled": False} if adaptive is None else adaptive.as_dict()
    catch_up = getattr(worker, "hsd_catch_up", None)
    state["draft_catch_up"] = {"enabled": False} if catch_up is None else catch_up.as_dict()
    lookup = getattr(worker, "hsd_lookup", None)
    state["draft_lookup"] = {"enabled": False} if lookup is None else lookup.as_dict()
    copies = getattr(worker, "hsd_draft_copies", None)
    if copies is not None:
        state["draft_copies"] = copies
    draft_step = getattr(worker, "hsd_draft_step", None)
    if draft_step is not None:
        state["draft_step"] = draft_step.as_dict()
    if exit_level is not None:
        state["levels"] = exit_level.stats.as_dict()
        state["max_split_logit_diff"] = exit_level.max_split_logit_diff
    return state
