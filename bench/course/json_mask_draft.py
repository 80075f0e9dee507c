"""Mask the draft or not? The measurement behind ``SpecConfig.mask_draft``'s default.

Under a JSON schema a draft can draft from its own distribution and have what the grammar rejects
cut before the verify (vLLM's way), or draft from its distribution masked by the grammar
(llama.cpp's way). This runs the shipped draft (an EAGLE head), as a chain and as a tree, both
ways, jump-forward off and on, over held-out JSON prompts at concurrency 1, greedy
(bench/course/json_routes.py's rows: acceptance rate, tokens per verify step, tokens per step, step time,
tokens/s). docs/architecture.md ("Structured output") quotes the result.

    python -m bench json_mask_draft            # writes bench/results/json_mask_draft.json
"""

from __future__ import annotations

import sys

from json_routes import ROOT, main as json_routes_main

if __name__ == "__main__":
    sys.exit(json_routes_main(["--drafters", "eagle,eagle-tree", "--arms", "grammar,grammar+jump,unmasked,unmasked+jump",
                               "--num-prompts", "12", "--concurrency", "1",
                               "--out", str(ROOT / "bench" / "results" / "json_mask_draft.json")] + sys.argv[1:]))
