"""EAGLE-3 and early-exit heads (architectures, training, export)."""
