"""Plain-PyTorch runtime: compact model forward, KV cache, speculative generation."""
