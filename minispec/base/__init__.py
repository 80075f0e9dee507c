"""What the core stands on and imports nothing of it: the engine's configs (config), the checks a
request passes before it is queued (checks), draft-tree geometry (tree_shape), the paged K/V tensors
(kv_cache), grouped-query attention on a GPU (gpu_attention) and structured output's value type
(structured_output). Torch-free where tests/test_architecture.py's contracts say so."""
