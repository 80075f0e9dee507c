"""K/V beyond the core's block table and tensors: full blocks shared by their tokens (prefix_cache.py)."""
