"""``server_law.confirmed_p_values``: the first sample decides unless it rejects; a rejection is
confirmed (or overturned) by a fresh sample ``confirm_factor`` times as large, with a warning."""

from __future__ import annotations

import pytest

from tests.sglang_plugin.server_law import ALPHA, confirmed_p_values


def _fixed(p_values):
    calls = []

    def p_value_of(n):
        calls.append(n)
        return p_values[len(calls) - 1]

    return p_value_of, calls


def test_first_sample_decides_when_it_does_not_reject():
    p_value_of, calls = _fixed([0.3])
    assert confirmed_p_values(p_value_of, 240, "t") == [0.3]
    assert calls == [240]


@pytest.mark.parametrize("second", [0.5, 1e-6])
def test_rejection_is_decided_by_a_larger_fresh_sample(second):
    p_value_of, calls = _fixed([1e-5, second])
    with pytest.warns(UserWarning, match="first sample of 240 rejected the law"):
        p_values = confirmed_p_values(p_value_of, 240, "t")
    assert calls == [240, 960]
    assert p_values == [1e-5, second]
    assert (p_values[-1] > ALPHA) == (second > ALPHA)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="samples and confirm_factor"):
        confirmed_p_values(lambda n: 1.0, 0, "t")
