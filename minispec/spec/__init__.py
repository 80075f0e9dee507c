"""Speculative decoding: drafters propose, verification accepts or rejects, policies decide when."""
