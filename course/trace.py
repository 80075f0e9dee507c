"""Show what a drafter proposed and what verification kept, step by step (notebook 04)."""

from __future__ import annotations

import html


class Timeline:
    """An engine observer that keeps, per step, (request_id, "prefill" | "decode" | "verify",
    tokens computed) for every scheduled request: ``timeline = engine.add_observer(Timeline())``,
    then ``timeline.steps`` (what ``plots.plot_timeline`` draws)."""

    def __init__(self):
        self.steps: list[list[tuple[str, str, int]]] = []

    def __call__(self, record) -> None:
        self.steps.append([(s.request.request_id,
                            "prefill" if s.is_prefill else ("verify" if s.draft_token_ids else "decode"),
                            s.num_query_tokens) for s in record.batch.scheduled])


def trace_speculation(engine, prompt, params, max_steps: int = 12) -> list[dict]:
    """Run one request step by step; per verify step return drafts, accepted count and emitted tokens.

    Reads each step's record (``Engine.add_observer``): the drafts are on the step's Batch, the
    accepted count and emitted tokens on its StepResult.
    """
    rid = engine.add_request(prompt, params)
    rows: list[dict] = []

    def record(step) -> None:
        for s, out in zip(step.batch.scheduled, step.result.outputs):
            if s.request.request_id == rid and out.token_ids and len(rows) < max_steps:
                rows.append({"drafts": list(s.draft_token_ids), "num_draft_accepted": out.num_draft_accepted,
                             "emitted": list(out.token_ids)})

    engine.add_observer(record)
    try:
        while engine.has_unfinished():
            engine.step()
    finally:
        engine.remove_observer(record)
    return rows


def trace_html(rows: list[dict], tokenizer) -> str:
    """Accepted drafts in green, rejected drafts struck through in red, the target's own token in blue."""
    def tok(t):
        return html.escape(tokenizer.decode([t])).replace(" ", "&nbsp;") or "&#9251;"

    lines = []
    for n, r in enumerate(rows, 1):
        a = r["num_draft_accepted"]
        parts = [f"<span style='background:#c8f7c5'>{tok(t)}</span>" for t in r["drafts"][:a]]
        parts += [f"<span style='background:#f7c5c5;text-decoration:line-through'>{tok(t)}</span>"
                  for t in r["drafts"][a:]]
        parts += [f"<span style='background:#c5d8f7'>{tok(t)}</span>" for t in r["emitted"][a:]]
        lines.append(f"<div style='font-family:monospace'>step {n}: {''.join(parts)} "
                     f"<small>({a}/{len(r['drafts'])} accepted, {len(r['emitted'])} emitted)</small></div>")
    legend = ("<div><span style='background:#c8f7c5'>accepted draft</span> "
              "<span style='background:#f7c5c5;text-decoration:line-through'>rejected draft</span> "
              "<span style='background:#c5d8f7'>target's token (correction or bonus)</span></div>")
    return legend + "".join(lines)
