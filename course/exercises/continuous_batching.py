"""Notebook 02's exercises (notebooks/02_continuous_batching.ipynb): static batching's wasted
slot-steps, and an admission rule (shortest prompt first) run inside the real engine's scheduler,
then priced on the simulated H100.
"""

from __future__ import annotations

from course.checks import check_function, run_check
from course.exercises.harness import (H100, AdmissionRuleScheduler, _course_prompts, _engine, _generate,
                                      tiny_course_model)
from minispec.base.config import EngineConfig, SchedulerConfig
from minispec.core.request import Request, SamplingParams
from minispec.core.support.metrics import request_metrics
from minispec.sim import build_sim_engine


def static_batching_slot_steps(output_lengths: list[int], batch_size: int) -> int:
    """Decode slot-steps static batching spends: each batch runs until its longest request ends."""
    return sum(max(output_lengths[i: i + batch_size]) * len(output_lengths[i: i + batch_size])
               for i in range(0, len(output_lengths), batch_size))


def check_02_static_waste(fn, quiet=False) -> str:
    cases = [(([5, 5, 5, 5], 2), 20), (([1, 9, 3, 3], 2), 24), (([4, 1, 1, 1, 8], 2), 4 * 2 + 1 * 2 + 8),
             (([7], 4), 7), (([2, 3, 10], 3), 30)]
    return check_function("02 static batching slot-steps", fn, cases, quiet=quiet)


# 02: an admission rule inside the scheduler
def reference_shortest_prompt_first(waiting: list[Request]) -> Request:
    """The waiting request with the fewest prompt tokens (ties: the one that arrived first)."""
    return min(waiting, key=lambda r: (r.num_prompt_tokens, r.arrival_order))


def run_admission(engine, rule, tokenizer=None, n: int = 6, max_tokens: int = 8) -> dict:
    """``n`` prompts of different lengths added at once (the longest first) to ``engine``, its
    scheduler admitting by ``rule`` (None: the engine's own, first come first served). Returns
    {"order": prompt lengths in admission order, "outputs": token ids per request}."""
    if rule is not None:
        engine.scheduler = AdmissionRuleScheduler(engine.scheduler, rule)
    prompts = sorted((engine.tokenize(p) for p in _course_prompts(tokenizer, "chat", n)),
                     key=len, reverse=True)
    before = set(engine.requests)
    outputs = _generate(engine, prompts, max_tokens)
    reqs = sorted((r for rid, r in engine.requests.items() if rid not in before),
                  key=lambda r: r.first_scheduled_time_s)
    return {"order": [r.num_prompt_tokens for r in reqs], "outputs": outputs}


def simulated_admission_ttft(rule, lengths=(4096, 2048, 1024, 512, 256, 128), max_num_seqs: int = 2) -> float:
    """Mean TTFT (s) of prompts of ``lengths`` tokens, added at once in that order, admitted by
    ``rule`` (None: first come first served) on the simulated H100 serving an 8B model: the same
    Scheduler on a virtual clock, where a prompt's prefill costs what its length costs."""
    config = EngineConfig(model=H100["model"], enable_prefix_caching=False,
                          scheduler=SchedulerConfig(max_num_seqs=max_num_seqs))
    engine = build_sim_engine(config, hardware=H100["hardware"])
    if rule is not None:
        engine.scheduler = AdmissionRuleScheduler(engine.scheduler, rule)
    for n in lengths:
        engine.add_request([1] * n, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    engine.run_until_done()
    ttft = [request_metrics(r)["ttft_s"] for r in engine.requests.values()]
    return sum(ttft) / len(ttft)


def check_02_admission_in_engine(rule, model=None, tokenizer=None, quiet=False) -> str:
    """``rule(waiting) -> Request`` runs as the scheduler's admission rule: pass when the real
    engine admits the shortest prompt first, every request gets its tokens and every block comes
    back; the simulated H100 then shows what it does to the mean TTFT."""
    def test():
        engine = _engine(model or tiny_course_model(), tokenizer, max_num_seqs=2)
        fcfs = run_admission(engine, None, tokenizer)
        mine = run_admission(engine, rule, tokenizer)
        want = sorted(mine["order"])
        if mine["order"] != want:
            return False, (f"the engine admitted prompts of {mine['order']} tokens in that order; shortest "
                           f"first is {want}")
        if any(len(o) != len(f) for o, f in zip(mine["outputs"], fcfs["outputs"])):
            return False, "a request did not get all its tokens"
        sim, sim_fcfs = simulated_admission_ttft(rule), simulated_admission_ttft(None)
        return True, (f"admitted {want} (first come first served: {fcfs['order']}), every "
                      "block came back; on the "
                      f"simulated H100 (8B model) mean TTFT {sim * 1e3:.0f} ms against "
                      f"{sim_fcfs * 1e3:.0f} ms")
    return run_check("02 your admission rule inside the scheduler", test,
                     attempted=rule is not None, quiet=quiet)
