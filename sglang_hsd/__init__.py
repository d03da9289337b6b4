"""sglang-hsd: lossless hierarchical speculative decoding for SGLang and PyTorch runtimes."""

__version__ = "0.1.0"
