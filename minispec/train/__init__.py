"""Draft training: distil a small draft from the target on the target's own answers, then ship it.

Speculation pays only when the draft agrees with the target (Leviathan et al. 2023, section 3.5).
The draft learns the target's next-token distribution on text the target wrote itself (distill.py;
an EAGLE head reading the target's hidden states in distill_eagle.py), over a reduced vocabulary
whose logit i scores target token vocab_map[i]. Only its own weights are shipped (ship.py); the
command is ``python -m minispec.train`` (command.py).
Invariant: a shipped draft loads only against the target it was distilled from, and tokens outside
its vocabulary get zero draft probability, so verification stays exact.
Taught in notebooks/04_speculative_decoding.ipynb; the shipped draft is described in
data/draft/MODEL_CARD.md.
"""
