"""Record what a drafter proposed and what verification kept, step by step, for display."""

from __future__ import annotations

import html


class RecordingDrafter:
    """Wraps a drafter; remembers each step's proposals per request id."""

    def __init__(self, inner):
        self.inner = inner
        self.synthetic = getattr(inner, "synthetic", False)
        self.last: dict[str, list[int]] = {}

    def propose(self, scheduled) -> None:
        self.inner.propose(scheduled)
        self.last = {s.request.request_id: list(s.draft_token_ids) for s in scheduled}

    def free(self, request_ids) -> None:
        self.inner.free(request_ids)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def trace_speculation(engine, prompt, params, max_steps: int = 12) -> list[dict]:
    """Run one request step by step; per verify step return drafts, accepted count and emitted tokens."""
    recorder = RecordingDrafter(engine.executor.drafter)
    engine.executor.drafter = recorder
    try:
        rid = engine.add_request(prompt, params)
        req = engine.requests[rid]
        rows = []
        while engine.has_unfinished() and len(rows) < max_steps:
            recorder.last = {}
            before, accepted_before = req.num_output_tokens, req.num_draft_accepted
            engine.step()
            drafts = recorder.last.get(rid, [])
            emitted = req.output_token_ids[before:]
            if emitted:
                rows.append({"drafts": drafts, "num_accepted": req.num_draft_accepted - accepted_before,
                             "emitted": emitted})
        while engine.has_unfinished():
            engine.step()
        return rows
    finally:
        engine.executor.drafter = recorder.inner


def trace_html(rows: list[dict], tokenizer) -> str:
    """Accepted drafts in green, rejected drafts struck through in red, the target's own token in blue."""
    def tok(t):
        return html.escape(tokenizer.decode([t])).replace(" ", "&nbsp;") or "&#9251;"

    lines = []
    for n, r in enumerate(rows, 1):
        a = r["num_accepted"]
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
