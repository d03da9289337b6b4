"""Plain-PyTorch runtime: compact model forward, KV cache, hierarchical speculative generation.

``SpeculativeGenerator(target, parse_levels("exit:4,exit:12,target")).generate(prompts, params)``
is the library entry point for custom runtimes.
"""

from sglang_hsd.runtime.config import HierarchyConfig, parse_levels
from sglang_hsd.runtime.engine import SpeculativeGenerator
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.stats import GenerationResult, LevelStats

__all__ = [
    "CausalLM",
    "GenerationResult",
    "HierarchyConfig",
    "LevelStats",
    "SpeculativeGenerator",
    "parse_levels",
]
