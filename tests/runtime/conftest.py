import pytest
import torch

pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _inference_mode():
    """Every runtime test runs as the runtime does: under inference mode."""
    with torch.inference_mode():
        yield
