"""Speculation beyond the core's chain: draft trees, the EAGLE head, acceptance models, policies,
the drafter's guard and the acceptance watch. Their builders: minispec/build/speculation.py."""
