"""benchmarks/model_decode.py on a tiny saved model: every kernel variant decodes the same greedy
tokens, the packed variants alternate their repeats, and the result files name the padding."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks import model_decode  # noqa: E402
from sglang_hsd.runtime.testing import tiny_llama  # noqa: E402


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN not built in")
def test_kernel_variants_decode_the_same_tokens(tmp_path, capsys):
    tiny_llama(vocab_size=48, num_layers=2, hidden_size=32, seed=3).save_pretrained(tmp_path / "model")
    model_decode.main(["--model", str(tmp_path / "model"), "--kernels", "mkl", "packed", "packed-padded",
                       "--pad-to", "4", "--no-hf", "--new-tokens", "6", "--prompt-len", "5", "--repeats", "2",
                       "--threads", "1", "--name", "decode", "--out-dir", str(tmp_path)])
    result = json.loads((tmp_path / "decode.json").read_text())
    assert [row["kernel"] for row in result["rows"]] == ["mkl", "packed", "packed-padded"]
    assert all(row["greedy_agree"] == 6 and len(row["seconds"]) == 2 for row in result["rows"])
    assert result["padding"] == "rows padded: 1 -> 4, 2 -> 4, 3 -> 4"
    assert "| packed-padded |" in (tmp_path / "decode.md").read_text()
    with pytest.raises(SystemExit):
        model_decode.main(["--model", str(tmp_path / "model"), "--pad-to", "1"])
    assert "--pad-to must be >= 2" in capsys.readouterr().err
