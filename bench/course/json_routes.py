"""JSON routes measured, not assumed: grammar-constrained decoding composed with speculation, per drafter.

The held-out JSON prompts (data/prompts/json.jsonl), each with its schema
(data/prompts/json_schemas.jsonl), through the bundled target at one concurrency (default 8),
closed loop, greedy. Per drafter (n-gram, the shipped draft: an EAGLE head, that head drafting a
tree, n-gram tries) and per arm:
  free                   no grammar (the prompt asks for JSON; whether the model writes it is counted)
  grammar                the request's JSON schema, jump-forward off
  grammar+jump           the schema, jump-forward on (forced tokens drafted free)
  unmasked, unmasked+jump  the same two with the head drafting unmasked (``SpecConfig.mask_draft``
                         off; head drafters only: an n-gram draft has no distribution to mask)
and spec off with and without the grammar (a plain decode step's cost). Each row: acceptance rate
(accepted / proposed drafts), the per-position alpha estimated from runs (accepted / (accepted +
first rejections): what the simulator's synthetic drafter takes), the acceptance rate without the
forced drafts (what the drafter itself earned), tokens per verify step (mean accepted length,
bonus included), forced drafts per verify step,
tokens per step, mean step time, tokens/s, the grammar's seconds per step (masks, consume,
rollback: ``StructuredOutputManager.grammar_time_s``) as a share of the step, and how many outputs
parse and validate against their schema. The mask cost target of issue 43 reads from the
"grammar seconds per step / decode step" column of spec off with the grammar (at most 10% at c=8).

    python -m bench json_routes            # prints a table, writes bench/results/json_routes.json
    python -m bench json_routes --quick    # 4 prompts, c=2, two drafters (a smoke test)

Run it with nothing else on the machine: timings are of one run each, arms in the order listed.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from minispec.build import build_engine  # noqa: E402
from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig  # noqa: E402
from minispec.models.draft import load_draft  # noqa: E402
from minispec.models.loader import BUNDLED_TARGET, load_model  # noqa: E402
from course.json_lab import json_route, measure_json_route  # noqa: E402

DRAFT = "smollm2-135m-draft"
# drafter -> SpecConfig keyword arguments
DRAFTERS = {
    "off": dict(method="off"),
    "ngram": dict(method="ngram", num_speculative_tokens=4),
    "eagle": dict(method="draft", num_speculative_tokens=4, draft_model=DRAFT),
    "eagle-tree": dict(method="draft", num_speculative_tokens=4, draft_topk=2, num_draft_tokens=8, draft_model=DRAFT),
    "ngram-tree": dict(method="ngram", num_speculative_tokens=4, draft_topk=2, num_draft_tokens=8),
}
# arm -> (grammar on, jump_forward, mask_draft)
ARMS = {"free": (False, True, True), "grammar": (True, False, True), "grammar+jump": (True, True, True),
        "unmasked": (True, False, False), "unmasked+jump": (True, True, False)}


def arms_of(drafter: str) -> list[str]:
    """The arms a drafter runs: spec off has no drafts to jump or mask; only a head has a draft to mask."""
    if drafter == "off":
        return ["free", "grammar"]
    return list(ARMS) if drafter.startswith("eagle") else ["free", "grammar", "grammar+jump"]


def make_engine(loaded, draft, drafter: str, arm: str, concurrency: int, max_model_len: int):
    model, tokenizer, hf_config = loaded
    gc.collect()  # the previous engine's KV cache goes before the next is built
    _, jump_forward, mask_draft = ARMS[arm]
    spec = SpecConfig(jump_forward=jump_forward, mask_draft=mask_draft, **DRAFTERS[drafter])
    config = EngineConfig(model=BUNDLED_TARGET, device="cpu", dtype="float32", num_kv_blocks=64 * concurrency,
                          max_model_len=max_model_len, scheduler=SchedulerConfig(1024, max_num_seqs=concurrency),
                          spec=spec)
    return build_engine(config, model=model, tokenizer=tokenizer, hf_config=hf_config,
                        draft=draft if spec.method == "draft" else None)


def run_arm(loaded, draft, drafter: str, arm: str, route, concurrency: int, max_tokens: int) -> dict:
    """One closed-loop run of the route under one drafter and arm (``measure_json_route``). Returns its row."""
    engine = make_engine(loaded, draft, drafter, arm, concurrency, max_model_len=1024)
    m = measure_json_route(engine, route, concurrency, max_tokens, grammar=ARMS[arm][0])
    return {"drafter": drafter, "arm": arm, "concurrency": concurrency, **m,
            "grammar_share_of_step": m["grammar_s"] / m["step_s"]}


def format_table(rows: list[dict]) -> str:
    def f(x, fmt):
        return "-" if x is None else format(x, fmt)

    lines = ["| drafter | arm | acc rate | alpha | acc rate w/o forced | tokens / verify | forced / verify | tokens / step | "
             "step ms | tok/s | grammar ms / step | grammar share | valid JSON |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['drafter']} | {r['arm']} | {f(r['acceptance_rate'], '.3f')} | {f(r.get('alpha'), '.3f')} | "
                     f"{f(r['acceptance_rate_without_forced'], '.3f')} | {f(r['mean_accepted_length'], '.2f')} | "
                     f"{f(r['forced_per_verify_step'], '.2f')} | {r['tokens_per_step']:.2f} | "
                     f"{r['step_s'] * 1e3:.1f} | {r['throughput_tok_s']:.1f} | {r['grammar_s'] * 1e3:.2f} | "
                     f"{r['grammar_share_of_step']:.1%} | {r['num_valid_json']}/{r['num_requests']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--drafters", default=",".join(DRAFTERS), help=f"any of {', '.join(DRAFTERS)}")
    p.add_argument("--arms", default=",".join(ARMS), help=f"any of {', '.join(ARMS)} (each drafter runs those it has)")
    p.add_argument("--num-prompts", type=int, default=32, help="held-out JSON prompts (at most 32)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--num-threads", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "json_routes.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.drafters, args.num_prompts, args.concurrency, args.max_tokens = "off,ngram,eagle", 4, 2, 64
        if args.out == p.get_default("out"):
            args.out = str(ROOT / "bench" / "results" / "json_routes_quick.json")
    drafters, arms = args.drafters.split(","), args.arms.split(",")
    for flag, names, known in (("--drafters", drafters, DRAFTERS), ("--arms", arms, ARMS)):
        unknown = [n for n in names if n not in known]
        if unknown:
            p.error(f"{flag}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    torch.set_num_threads(args.num_threads)
    t0 = time.time()
    loaded = load_model(BUNDLED_TARGET, torch.device("cpu"), torch.float32)
    draft = load_draft(DRAFT, loaded[0], torch.device("cpu"), torch.float32)
    route = json_route(args.num_prompts)
    result = {"platform": platform.platform(), "torch": torch.__version__, "num_threads": args.num_threads,
              "concurrency": args.concurrency, "max_tokens": args.max_tokens, "num_prompts": len(route), "rows": []}
    for drafter in drafters:
        for arm in [a for a in arms_of(drafter) if a in arms]:
            row = run_arm(loaded, draft, drafter, arm, route, args.concurrency, args.max_tokens)
            result["rows"].append(row)
            print(format_table([row]).splitlines()[-1], flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")  # keep what is measured so far
    result["wall_s"] = time.time() - t0
    print(format_table(result["rows"]))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
