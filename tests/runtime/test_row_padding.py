"""Row padding of the packed linear kernel (``runtime/row_padding.py``): the choice from measured
costs, the setting's checks, and that a padded call returns the unpadded rows' product."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_hsd.runtime.layers import pack_linear_weight, packed_linear_supported
from sglang_hsd.runtime.row_padding import (
    NO_PADDING, RowPadding, choose_row_padding, measure_row_padding, padded_linear)


def test_padding_is_chosen_where_the_padded_call_measured_cheaper():
    zen4 = {1: 2.73, 2: 2.98, 3: 2.48, 4: 1.75}  # ms, 1536 x 8960 on the Zen 4 EPYC
    assert choose_row_padding(zen4.__getitem__) == RowPadding((4, 4, 4))
    # Another EPYC: one row within the noise margin of four, so it is not padded (padding every
    # few-row call, the plausible slip of trusting one machine's table, fails here).
    flat = {1: 1.33, 2: 1.51, 3: 1.54, 4: 1.30}
    assert choose_row_padding(flat.__getitem__) == RowPadding((1, 4, 4))
    mixed = {1: 1.0, 2: 3.0, 3: 1.2, 4: 1.5}
    assert choose_row_padding(mixed.__getitem__) == RowPadding((1, 4, 3))


def test_row_padding_checks_its_settings():
    assert NO_PADDING.rows_for(1) == 1 and RowPadding((4, 4, 4)).rows_for(3) == 4
    assert RowPadding((4, 4, 4)).rows_for(5) == 5 and RowPadding((4,)).rows_for(2) == 2
    assert RowPadding((4, 2, 4)).describe() == "rows padded: 1 -> 4, 3 -> 4"
    assert NO_PADDING.describe() == "no row padding"
    with pytest.raises(ValueError, match=r"pad_to\[1\] \(the row count for 2 rows\) must be an int >= 2"):
        RowPadding((4, 1))
    with pytest.raises(ValueError, match="target must be a positive int"):
        choose_row_padding(lambda rows: 1.0, target=0)
    with pytest.raises(ValueError, match=r"min_gain must be in \(0, 1\]"):
        choose_row_padding(lambda rows: 1.0, min_gain=1.5)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN not built in")
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 6])
def test_a_padded_call_returns_the_rows_product(rows):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(40, 24, generator=gen), torch.randn(40, generator=gen)
    if not packed_linear_supported(torch.nn.Linear(24, 40)):
        pytest.skip("packed kernel unavailable")
    x = torch.randn(rows, 24, generator=gen)
    out = padded_linear(x, pack_linear_weight(weight), bias, RowPadding((4, 4, 4)))
    assert out.shape == (rows, 40)
    torch.testing.assert_close(out, F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN not built in")
def test_measured_padding_is_a_valid_choice():
    padding = measure_row_padding(pack_linear_weight(torch.randn(64, 32)), 32, repeats=3)
    assert len(padding.pad_to) == 3
    assert all(p in (r, 4) for r, p in enumerate(padding.pad_to, start=1))
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        measure_row_padding(pack_linear_weight(torch.randn(64, 32)), 32, repeats=0)
