"""profile_round's options: the kernel and draft-length settings bench_e2e runs, checked before loading."""

import pytest

from benchmarks import profile_round


def test_kernel_and_draft_length_options_parse():
    args = profile_round.parse_args(["--pack-linears", "--draft-length", "adaptive:0.4:16",
                                     "--drafter-precision", "bf16"])
    assert (args.pack_linears, args.draft_length, args.drafter_precision) == (True, "adaptive:0.4:16", "bf16")
    defaults = profile_round.parse_args([])
    assert (defaults.pack_linears, defaults.draft_length, defaults.drafter_precision) == (False, "fixed", "fp32")


@pytest.mark.parametrize("argv, needle", [
    (["--drafter-precision", "int3"], "--drafter-precision"),
    (["--draft-length", "sometimes"], "fixed or adaptive"),
])
def test_bad_settings_are_refused_before_any_model_loads(argv, needle):
    with pytest.raises(ValueError, match=needle):
        profile_round.parse_args(argv)
