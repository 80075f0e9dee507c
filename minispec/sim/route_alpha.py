"""A JSON route's acceptance as measured with the engine, for the simulator.

``bench/course/json_routes.py`` runs the held-out JSON prompts (data/prompts/json.jsonl, each with its
schema) through the engine on the bundled model, per drafter, with the grammar off and on, and
commits the per-position acceptance alpha it measured to bench/results/json_routes.json. The
simulator takes its JSON route's alpha from there (``simulate --routes chat=0.8:3,json=measured:1``,
``measured_json_alpha``) instead of a number typed in. The measurement is a 135M target's with
its own drafters, carried to a simulated pair as the route's predictability.
"""

from __future__ import annotations

import json
from pathlib import Path

JSON_ROUTES_RESULT = Path(__file__).resolve().parents[2] / "bench" / "results" / "json_routes.json"
MEASURED = "measured"
"""The word a route's alpha takes in ``--routes`` to be read from the measurement."""


def measured_json_alpha(drafter: str = "eagle", arm: str = "grammar+jump",
                        path: Path | str | None = None) -> float:
    """The JSON route's per-position acceptance alpha (0..1) measured by bench/course/json_routes.py.

    Args:
        drafter: a drafter row of the run: "eagle" (the shipped draft, an EAGLE head), "eagle-tree",
            "ngram" or "ngram-tree".
        arm: "free" (the prompt asks for JSON), "grammar" (the schema enforced) or "grammar+jump"
            (forced tokens drafted free, the engine's default with a schema); the head drafters
            also have "unmasked" and "unmasked+jump".
        path: the results file (default bench/results/json_routes.json).
    Raises: ValueError naming the drafter or arm the file lacks, and what it has; a missing file
        names the command that writes it.
    """
    path = Path(path or JSON_ROUTES_RESULT)
    if not path.is_file():
        raise ValueError(f"no JSON route measurement at {path.name}: run python -m bench json_routes")
    rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    have = {(r["drafter"], r["arm"]): r["alpha"] for r in rows if r.get("alpha") is not None}
    if (drafter, arm) not in have:
        cells = ", ".join(f"{d}/{a}" for d, a in have)
        raise ValueError(f"drafter={drafter!r} arm={arm!r}: not measured in {path.name}; it has {cells}")
    return float(have[(drafter, arm)])


def resolve_measured_routes(routes: str, drafter: str = "eagle", path: Path | str | None = None) -> str:
    """``routes`` ("chat=0.8:3,json=measured:1") with each ``measured`` alpha replaced by
    ``measured_json_alpha(drafter)`` (rounded to 3 places). Only a route named json may take it:
    the measurement is of JSON prompts. Raises: ValueError naming the route."""
    parts = []
    for part in (p.strip() for p in routes.split(",") if p.strip()):
        name, eq, rest = part.partition("=")
        alpha_text, colon, weight = rest.partition(":")
        if eq and alpha_text.strip() == MEASURED:
            if name.strip() != "json":
                raise ValueError(f"route {part!r}: only the json route has a measured alpha "
                                 f"(bench/course/json_routes.py); give {name.strip()!r} a number")
            part = f"{name}={measured_json_alpha(drafter, path=path):.3f}{colon}{weight}"
        parts.append(part)
    return ",".join(parts)
