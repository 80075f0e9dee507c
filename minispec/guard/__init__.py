"""Failure isolation: the GuardedEngine every builder returns, which also names its stack (``describe``)."""
