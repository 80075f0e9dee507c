"""Workloads for benchmarks: prompt sets, closed-loop clients and Poisson arrivals.

Closed loop: C clients, each sends its next request when its previous one finishes, so exactly C
are in flight (the "concurrency" axis of the course). Poisson: requests arrive at a given rate
(QPS) whatever the engine does. Both drive any Engine (real or simulated clock) through
add_request / step only. Taught in notebooks/02_continuous_batching.ipynb.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Callable

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
PROMPT_SETS = {name: DATA_DIR / "prompts" / f"{name}.jsonl"
               for name in ("chat", "copy", "json", "long", "shared")}


def load_prompts(path_or_name: str | Path) -> list:
    """Prompts from a JSONL file (``"prompt"``: text, or ``"messages"``: chat list) or a bundled
    set name (chat, copy, json, long, shared; data/prompts/README.md). Returns a list of strings /
    message lists.

    Raises: ValueError for a missing file, a line that is not a JSON object (naming the file and
        its line), or a line with neither field.
    """
    path = PROMPT_SETS.get(str(path_or_name), Path(path_or_name))
    if not path.exists():
        raise ValueError(f"prompts file {str(path_or_name)!r} not found: give a JSONL path or one of "
                         f"{', '.join(PROMPT_SETS)}")
    prompts = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg} at column {exc.colno}); each line "
                             "must be one object like {\"prompt\": \"...\"}") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: expected a JSON object with a 'prompt' or a 'messages' field")
        if "messages" in row:
            prompts.append(row["messages"])
        elif "prompt" in row:
            prompts.append(row["prompt"])
        else:
            raise ValueError(f"{path}:{n}: each line needs a 'prompt' or a 'messages' field")
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


def parse_lanes(text: str) -> float:
    """"interactive=0.15" (or "bulk=0.85") -> the share of requests in the interactive lane.
    Raises: ValueError for another lane, a share outside [0, 1], or two shares that do not sum to 1."""
    shares = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        lane, _, value = part.partition("=")
        try:
            share = float(value)
        except ValueError:
            raise ValueError(f"lanes {text!r}: write interactive=SHARE (or bulk=SHARE), "
                             "e.g. interactive=0.15") from None
        if lane not in ("interactive", "bulk") or not 0.0 <= share <= 1.0:
            raise ValueError(f"lanes {text!r}: name the interactive or the bulk lane with a share in [0, 1], "
                             "e.g. interactive=0.15")
        shares[lane] = share
    if not shares:
        raise ValueError(f"lanes {text!r}: give interactive=SHARE, e.g. interactive=0.15")
    if len(shares) == 2 and abs(sum(shares.values()) - 1.0) > 1e-9:
        raise ValueError(f"lanes {text!r}: the two shares must sum to 1")
    return shares["interactive"] if "interactive" in shares else 1.0 - shares["bulk"]


def lanes_by_share(share: float) -> Callable[[int], str]:
    """``lane_of(i)`` putting a ``share`` of the requests in the interactive lane, spread evenly (request i
    is interactive when floor((i + 1) share) > floor(i share): 3 of every 20 for 0.15), the rest bulk."""
    return lambda i: "interactive" if int((i + 1) * share + 1e-9) > int(i * share + 1e-9) else "bulk"


def check_prompts(engine, prompts: list, num_requests: int, params_of: Callable, lane_of: Callable) -> None:
    """Check each prompt a run would send, with the parameters and lane of its first use
    (``engine.check_request``: ValueError naming the bad prompt's index), before it sends any, so a
    bad prompt file leaves no request queued."""
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    for i in range(min(len(prompts), num_requests)):
        try:
            engine.check_request(prompts[i % len(prompts)], params_of(i), lane_of(i))
        except ValueError as exc:
            raise ValueError(f"prompt {i % len(prompts)}: {exc}") from None


def run_closed_loop(engine, prompts: list, concurrency: int, num_requests: int, params,
                    lane_of: Callable[[int], str] = lambda i: "interactive",
                    progress=None) -> tuple[list, float]:
    """Keep ``concurrency`` requests in flight until ``num_requests`` have finished.

    Args:
        prompts: token id lists (or anything ``engine.add_request`` takes), used round-robin.
        params: a SamplingParams, or a function i -> SamplingParams.
    Returns: (the run's Request objects, wall time in seconds on the engine's clock).
    """
    if concurrency < 1 or num_requests < 1:
        raise ValueError(f"concurrency={concurrency}, num_requests={num_requests}: both must be >= 1")
    params_of = params if callable(params) else (lambda i: params)
    check_prompts(engine, prompts, num_requests, params_of, lane_of)
    start = engine.clock()
    ids, sent, in_flight = [], 0, 0
    while sent < num_requests or in_flight:
        while in_flight < concurrency and sent < num_requests:
            ids.append(engine.add_request(prompts[sent % len(prompts)], params_of(sent), lane=lane_of(sent)))
            sent += 1
            in_flight += 1
        for out in engine.step():
            if out.finished:
                in_flight -= 1
                if progress is not None:
                    progress.update(1)
    return [engine.requests[i] for i in ids], engine.clock() - start


def poisson_arrivals(qps: float, num_requests: int, seed: int = 0) -> list[float]:
    """Arrival offsets in seconds of a Poisson process with rate ``qps`` (exponential gaps)."""
    if qps <= 0:
        raise ValueError(f"qps={qps}: must be > 0")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(num_requests):
        t += rng.expovariate(qps)
        out.append(t)
    return out


def run_poisson(engine, prompts: list, qps: float, num_requests: int, params, seed: int = 0,
                lane_of: Callable[[int], str] = lambda i: "interactive", progress=None,
                wait_until: Callable[[float], None] | None = None) -> tuple[list, float]:
    """Open-loop arrivals at ``qps`` requests/s. ``wait_until(t)`` idles the clock to time t
    (a real sleep by default; the simulator advances its virtual clock instead)."""
    params_of = params if callable(params) else (lambda i: params)
    wait_until = wait_until or (lambda t: time.sleep(max(0.0, t - engine.clock())))
    check_prompts(engine, prompts, num_requests, params_of, lane_of)
    start = engine.clock()
    arrivals = [start + a for a in poisson_arrivals(qps, num_requests, seed)]
    ids, sent = [], 0
    while sent < num_requests or engine.has_unfinished():
        now = engine.clock()
        while sent < num_requests and arrivals[sent] <= now:
            ids.append(engine.add_request(prompts[sent % len(prompts)], params_of(sent), lane=lane_of(sent),
                                          arrival_time_s=arrivals[sent]))
            sent += 1
        if not engine.has_unfinished():
            wait_until(arrivals[sent])
            continue
        for out in engine.step():
            if out.finished and progress is not None:
                progress.update(1)
    return [engine.requests[i] for i in ids], engine.clock() - start
