"""The course's claims about speculation and batching as workloads that run on either clock.

Each function takes ``build(config) -> Engine``: the real engine on this machine
(``minispec.build.build_engine`` over the loaded model) or the simulator's engine on a modelled
GPU (``minispec.sim.build_sim_engine``). Both share the scheduler, the policies and the metrics,
so one workload gives the measured and the modelled number of a claim. Prompts are token id
lists; the simulator reads only their lengths. The claims are about batching and speculation and
their simulated prompts are placeholders of one id, which prefix caching would share whole: every
workload here runs with prefix caching off, on either clock. bench/course/seed_claims.py prints all of
them as one table; notebooks 03, 05 and 06 run them cell by cell.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from minispec.base.config import EngineConfig, SpecConfig
from minispec.core.support.metrics import request_metrics
from minispec.tools.summary import StepLog, percentile, step_split, summarize
from minispec.core.request import SamplingParams
from minispec.tools.workload import run_closed_loop

Build = Callable[[EngineConfig], object]  # EngineConfig -> Engine (real or simulated)


def decode_latency(requests) -> dict:
    """Median TPOT, p99 and largest ITL (seconds) over ``requests``. A long prompt prefilled in one
    step stalls each decoder once, fewer than 1% of their gaps: the largest ITL shows that stall."""
    ms = [request_metrics(r) for r in requests]
    tpot = [m["tpot_s"] for m in ms if m["tpot_s"] is not None]
    itl = [x for m in ms for x in m["itl_s"]]
    return {"tpot_p50_s": percentile(tpot, 50), "itl_p99_s": percentile(itl, 99),
            "itl_max_s": max(itl, default=None)}


def throughput(build: Build, config: EngineConfig, prompts: list, concurrency: int, num_requests: int,
               max_tokens: int, ignore_eos: bool = False) -> dict:
    """Closed-loop tokens/s (and the run's summary) at one concurrency: the crossover's cell.

    A request ends at EOS unless ``ignore_eos``: run past its answer, a real model tends to repeat
    itself, text that an n-gram drafter predicts far better than the answer (bench/course/seed_claims.py
    once reported 3.4x for n-gram at concurrency 1 that way, where bench/course/crossover.py, which
    honours EOS, measured 2.4x). Greedy decoding ends at the same token with speculation on or
    off, so both runs do the same work. The simulator defines no EOS and always runs max_tokens.
    """
    engine = build(replace(config, enable_prefix_caching=False))
    log = engine.add_observer(StepLog())
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)
    requests, wall = run_closed_loop(engine, prompts, concurrency, num_requests, params)
    out = summarize(requests, wall, log.stats)
    out["draft_time_share"] = draft_time_share(log)
    return out


def draft_time_share(log: StepLog) -> float | None:
    """The draft's time over the target's, summed over the steps that drafted (the draft cost the
    device pays per verify step); None when no step drafted."""
    steps = [s for s in log.stats if s.num_draft_proposed]
    target = sum(s.target_time_s for s in steps)
    return sum(s.draft_time_s for s in steps) / target if steps and target else None


def neighbours(build: Build, config: EngineConfig, prompts: list, num_interactive: int, num_bulk: int,
               max_tokens: int, interactive_max_tokens: int | None = None) -> dict:
    """Fat verify steps slow everyone: the bulk lane never speculates; its latency is measured
    next to interactive requests that do not speculate either (spec off), then next to ones that do
    (``config.spec`` with the lane policy: only the interactive lane drafts).

    All requests arrive at once and the token budget is raised to hold every prompt, so all of them
    prefill in the first step and each TPOT compares decode steps alone. ``interactive_max_tokens``
    (default ``max_tokens``) lets the interactive requests outlast the bulk ones, so every bulk step
    has the same speculating neighbours.
    Returns: {"plain": ..., "speculating": ...}, each with the bulk and the interactive lane's
    median TPOT and p99 ITL in seconds, and "steps": the mean time of the steps the bulk lane
    decoded in (after the prefill step, up to its last token), split into the draft's forwards
    (``draft_s``), the target's forward (``target_s``) and the rest of the step (``other_s``):
    the engine times them apart, so which part slowed the bulk lane is measured.
    """
    params = {"bulk": SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
              "interactive": SamplingParams(max_tokens=interactive_max_tokens or max_tokens, temperature=0.0,
                                            ignore_eos=True)}
    out = {}
    n = num_interactive + num_bulk
    prompts = [prompts[i % len(prompts)] for i in range(n)]
    budget = max(config.scheduler.max_num_batched_tokens, sum(map(len, prompts)) + n * 8)
    sched = replace(config.scheduler, max_num_batched_tokens=budget,
                    max_num_seqs=max(n, config.scheduler.max_num_seqs))
    for name, spec in (("plain", SpecConfig()), ("speculating", replace(config.spec, policy="lane"))):
        engine = build(replace(config, spec=spec, scheduler=sched, enable_prefix_caching=False))
        log = engine.add_observer(StepLog())
        ids = {"interactive": [], "bulk": []}
        for i, prompt in enumerate(prompts):
            lane = "interactive" if i < num_interactive else "bulk"
            ids[lane].append(engine.add_request(prompt, params[lane], lane=lane))
        engine.run_until_done()
        out[name] = {lane: decode_latency([engine.requests[i] for i in rids]) for lane, rids in ids.items()}
        out[name]["steps"] = step_split(log.stats[1:max_tokens])  # the bulk lane's decode steps
    return out


PARTS = {"draft_s": "the drafter's sequential forwards",
         "verify_s": "the verify rows in the target's forward",
         "other_s": "the rest of the step (drafting and verifying on the host)"}


def neighbour_cost(plain: dict, speculating: dict) -> dict:
    """What a decode step gained when neighbours speculate, in seconds by part, from two runs' step
    splits (``summary.decode_step_split``, or ``neighbours``' "steps"): the drafter's forwards
    (``draft_s``), the verify rows (``verify_s``: the target forward's growth), the rest
    (``other_s``) and the whole step (``step_s``), beside the plain step (``plain_step_s``) and the
    main part (``cause``: a phrase of PARTS). A plain request in the step waits for all of it. The
    two runs must decode alike batches (all requests in flight together, or the same
    ``max_num_seqs`` kept full): the target's growth is then the verify rows'."""
    added = {"draft_s": speculating["draft_s"] - plain["draft_s"],
             "verify_s": speculating["target_s"] - plain["target_s"],
             "other_s": speculating["other_s"] - plain["other_s"]}
    return {**added, "step_s": speculating["step_s"] - plain["step_s"], "plain_step_s": plain["step_s"],
            "cause": PARTS[max(added, key=added.get)]}


def explain_cost(added: dict) -> str:
    """One sentence from ``neighbour_cost``: how much longer a decode step got, and from what."""
    # rounded before printing, plus 0.0: a part of -0.0004 s prints as 0.00, not -0.00
    keys = ("draft_s", "verify_s", "other_s", "step_s", "plain_step_s")
    ms = {key: round(1000 * added[key], 2) + 0.0 for key in keys}
    return (f"a decode step took {ms['plain_step_s']:.2f} -> {ms['plain_step_s'] + ms['step_s']:.2f} ms: the "
            f"drafter's forwards added {ms['draft_s']:.2f} ms, the verify rows {ms['verify_s']:.2f} ms, the "
            f"rest {ms['other_s']:.2f} ms; mostly {added['cause']}")


def chunking_and_speculation(build: Build, config: EngineConfig, decode_prompts: list, long_prompt: list,
                             budget: int, max_tokens: int, arrive_after_steps: int = 4,
                             progress: bool = False) -> dict:
    """Chunked prefill composes with speculation: decoders run, a long prompt arrives after a few
    steps, in the four combinations of chunked prefill (token budget ``budget``, else the whole
    prompt in one step) and speculation (``config.spec``, else off). ``progress`` prints one line
    per finished run (a notebook cell is not silent for half a minute).

    Returns: {(chunked, speculating): {"tpot_p50_s", "itl_p99_s", "itl_max_s" of the decoders,
    "long_ttft_s"}}.
    """
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    whole = max(len(long_prompt) + max_tokens + 64, budget)  # unchunked: the whole prompt fits one step
    out = {}
    for chunked in (False, True):
        for speculating in (False, True):
            sched = replace(config.scheduler, enable_chunked_prefill=chunked,
                            max_num_batched_tokens=budget if chunked else whole)
            engine = build(replace(config, scheduler=sched, spec=config.spec if speculating else SpecConfig(),
                                   max_model_len=whole, enable_prefix_caching=False))
            ids = [engine.add_request(p, params) for p in decode_prompts]
            for _ in range(arrive_after_steps):
                engine.step()
            newcomer = engine.add_request(long_prompt,
                                          SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
            engine.run_until_done()
            out[(chunked, speculating)] = {
                **decode_latency([engine.requests[i] for i in ids]),
                "long_ttft_s": request_metrics(engine.requests[newcomer])["ttft_s"]}
            if progress:
                print(f"  {len(out)} of 4 done: chunked prefill {'on' if chunked else 'off'}, speculation "
                      f"{'on' if speculating else 'off'}", flush=True)
    return out
