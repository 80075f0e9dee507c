"""Notebook 01's exercises (notebooks/01_decode_is_memory_bound.ipynb): the roofline's ridge point,
the K/V gather of paged attention run inside the engine, and a profiled step split into its parts."""

from __future__ import annotations

import torch

from course.checks import check_number, close, run_check, shown
from course.exercises.harness import (LearnerGatherRunner, _course_prompts, _engine, _first_difference,
                                      _generate, tiny_course_model)


def ridge_point_tokens(flops_per_s: float, bandwidth_bytes_s: float, bytes_per_weight: float) -> float:
    """Tokens per step where a step's weight FLOPs (2 per weight per token) take as long as reading
    the weights once: 2 * n / flops = bytes_per_weight / bandwidth (Williams et al. 2009, roofline)."""
    return flops_per_s * bytes_per_weight / (2 * bandwidth_bytes_s)


def check_01_ridge(answer, flops_per_s: float, bandwidth_bytes_s: float,
                   bytes_per_weight: float, quiet=False) -> str:
    return check_number("01 ridge point (tokens per step)", answer,
                        ridge_point_tokens(flops_per_s, bandwidth_bytes_s, bytes_per_weight), rel=0.05,
                        hint="Set compute time 2*P*n/FLOPs equal to memory time P*bytes/bandwidth and solve "
                             "for n.",
                        quiet=quiet)


# -- the K/V gather, run in the engine ---------------------------------------------------------------
def reference_gather_context(cache, block_table: list[int]):
    """One request's context from a paged pool: cache [num_blocks, block_size, Hkv, D] and its block
    ids -> [len(block_table) * block_size, Hkv, D], block after block (what ``paged_attention``'s
    ``index_select`` does for a whole group at once)."""
    return cache[torch.tensor(block_table, dtype=torch.long)].flatten(0, 1)


def check_01_gather_in_engine(gather, model=None, tokenizer=None, quiet=False) -> str:
    """``gather(cache, block_table)`` first on a small pool whose every slot holds its own number,
    then as the gather of the real engine's paged attention (``LearnerGatherRunner``): passes when
    greedy outputs equal the engine's own token for token and every block comes back."""
    def test():
        pool = torch.arange(5 * 4 * 2 * 3, dtype=torch.float32).view(5, 4, 2, 3)  # 5 blocks of 4 slots
        for table in ([3, 1], [0], [4, 4, 2]):
            got, want = gather(pool, table), reference_gather_context(pool, table)
            if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
                what = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                return False, (f"gather(pool {tuple(pool.shape)}, {table}) returned {what}; "
                               f"{len(table)} blocks of 4 slots make a context of shape {tuple(want.shape)}")
            if not torch.equal(got, want):
                i = next(i for i in range(len(want)) if not torch.equal(got[i], want[i]))
                return False, (f"gather(pool, {table}): context token {i} should come from block "
                               f"{table[i // 4]}, slot {i % 4}: read the table in order, block by block")
        engine = _engine(model or tiny_course_model(), tokenizer)
        prompts = _course_prompts(tokenizer, "chat", 3)
        want = _generate(engine, prompts, 8)
        engine.runner = runner = LearnerGatherRunner(engine.runner, gather)
        diff = _first_difference(_generate(engine, prompts, 8), want)
        return diff is None, diff or (f"{runner.num_gathers:,} gathers in the engine's attention: every "
                                      "output token equals the engine's own, every block came back")
    return run_check("01 the K/V gather inside the engine", test, attempted=gather is not None, quiet=quiet)


# -- where a step's time goes: torch.profiler's split ------------------------------------------------
# the ops that multiply by the weights, in each of the engine's kernels (models/kernels.py, lowbit.py)
MATMUL_OPS = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::_weight_int8pack_mm",
              "aten::_weight_int4pack_mm_for_cpu")
PARTS = ("weight matmuls", "other ops", "Python and dispatch")


def reference_step_split(op_self_s: dict, wall_s: float) -> dict:
    """One step's wall time in three parts (seconds): the weight matmuls (``MATMUL_OPS``' own time),
    every other op's own time, and the rest (Python and dispatch between ops, at least 0)."""
    matmul = sum(s for name, s in op_self_s.items() if name in MATMUL_OPS)
    other = sum(op_self_s.values()) - matmul
    return dict(zip(PARTS, (matmul, other, max(0.0, wall_s - matmul - other))))


def check_01_step_split(fn, quiet=False) -> str:
    cases = [({"mkldnn::_linear_pointwise": 0.010, "aten::mul": 0.002, "aten::index_select": 0.001}, 0.016),
             ({"aten::mm": 0.004, "aten::_weight_int4pack_mm_for_cpu": 0.006, "aten::add": 0.003}, 0.012),
             ({}, 0.005)]

    def test():
        for ops, wall in cases:
            got, want = fn(ops, wall), reference_step_split(ops, wall)
            if not isinstance(got, dict) or set(got) != set(PARTS):
                return False, f"step_split({ops}, {wall}) returned {got!r}: a dict with the keys {PARTS}"
            wrong = [p for p in PARTS if not close(got[p], want[p], 1e-6, 1e-12)]
            if wrong:
                return False, (f"step_split({ops}, {wall}): {wrong[0]} {shown(got[wrong[0]])}, expected "
                               f"{want[wrong[0]]:.4g} s (an op's own time counts once; the rest is Python)")
        return True, f"all {len(cases)} cases agree"
    return run_check("01 split a profiled step", test, attempted=fn is not None, quiet=quiet)
