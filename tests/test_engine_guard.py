"""The engine guard (minispec/guard/engine_guard.py): a step that raises is run again request by request,
and the rerun keeps the step's draft catch-up budget (issue 41, item 4)."""

import pytest

from minispec.base.config import SpecConfig
from minispec.models.llama import LlamaModel
from minispec.core.request import SamplingParams

from conftest import drafter_of, record_draft_forwards, tiny_config, tiny_engine

# results depend on the kernels the engine runs: the fast-kernel pass of `make test` runs these (-m kernels)
pytestmark = pytest.mark.kernels

TARGET = LlamaModel.random(tiny_config(), seed=0)
DRAFT = LlamaModel.random(tiny_config(num_layers=1), seed=5)
GREEDY = dict(temperature=0, ignore_eos=True)


def plain_tokens(prompt, max_tokens):
    engine = tiny_engine(TARGET)
    engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, **GREEDY))
    return engine.run_until_done()[0].output_token_ids


@pytest.mark.parametrize("draft", [DRAFT, TARGET], ids=["draft-model", "self-draft"])
def test_a_step_rerun_request_by_request_keeps_the_steps_catch_up_budget(draft):
    """The target's forward raises whenever it packs more than one request, so every step runs
    again request by request. Each rerun used to propose again and reach ``observe``, which gave
    the next rerun a fresh catch-up budget: 16 catch-up tokens ran in a step under a budget of 8.
    Now a rerun verifies the drafts the step proposed (the drafter is not asked twice), so the
    draft's catch-up tokens of a step, reruns included, never pass the budget; output is exact."""
    budget = 8
    prompts = {"a": list(range(1, 13)), "b": list(range(40, 51)), "c": [7, 7, 7, 9, 9, 9, 9, 9, 9, 9]}
    expected = {rid: plain_tokens(p, 16) for rid, p in prompts.items()}
    engine = tiny_engine(TARGET, spec=SpecConfig(method="draft", num_speculative_tokens=3), draft=draft,
                         max_num_batched_tokens=budget)
    runner, drafter = engine.runner, drafter_of(engine)
    forward, counted = runner.forward, {"group_failures": 0}

    def one_at_a_time(items, **kw):
        if len(items) > 1:
            counted["group_failures"] += 1
            raise RuntimeError("this device computes one request per step")
        return forward(items, **kw)

    runner.forward, draft_forwards = one_at_a_time, record_draft_forwards(drafter)
    for rid, p in prompts.items():
        engine.add_request(p, SamplingParams(max_tokens=16, **GREEDY), request_id=rid)
    per_step, final = [], {}
    while engine.has_unfinished():
        before = len(draft_forwards)
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        per_step.append(sum(len(item.token_ids) for first, items in draft_forwards[before:] if first
                            for item in items))  # the catch-up forwards (later ones draft a position each)
    assert {rid: o.output_token_ids for rid, o in final.items()} == expected
    assert all(o.error is None for o in final.values())
    assert counted["group_failures"] >= 5 and sum(engine.requests[r].num_draft_proposed for r in prompts) > 0
    assert max(per_step) <= budget, per_step
    assert drafter.block_manager.num_free_blocks == drafter.block_manager.num_blocks and not drafter.progress.num_cached
