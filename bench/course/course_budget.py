"""The course's budget: each notebook's run time and its kernel's peak memory, full and fast mode.

Executes every notebook (or those named) in a fresh Jupyter kernel through nbclient, the executor
nbconvert and nbmake use, once per mode: "full" (the defaults a learner runs) and "fast"
(MINISPEC_FAST=1, the small workloads CI runs). Explorers run once headless (MINISPEC_HEADLESS=1).
For each run it records:
- the wall time of the whole notebook and of its slowest cells;
- the kernel's peak resident memory (``ru_maxrss`` of the kernel process, read by one cell
  appended to the in-memory copy of the notebook);
- what the notebook recorded through ``course.record``: its headlines (the measured
  titles and verdicts) and each explorer's redraw time.
``--busy`` runs a second process spinning on one core for the whole run (a noisy laptop: another
program busy beside the course), so its headlines can be set beside a quiet run's. ``--isa avx2``
restricts PyTorch and oneDNN to AVX2 in the kernels (``ATEN_CPU_CAPABILITY=avx2``,
``ONEDNN_MAX_CPU_ISA=AVX2``: a student's laptop without AVX-512 or bfloat16 instructions, measured on
any x86 host), and records what the kernels' torch reports under it.
Each run also records what the kernel holds after the notebook's last cell (``course.memory.release``
prints it): ``after_release_mb``.
Prints a table and writes JSON (default bench/results/course_budget.json, or
course_budget_busy.json with --busy). The targets it reports against: every notebook under
150 s and 2 GiB in full mode, under 45 s in fast mode, all of them under 12 minutes; an explorer
redraw under 0.5 s. A benchmark script, not a test: run it with nothing else on the machine.

Usage: python -m bench course_budget [--modes full,fast] [--only 00,05] [--busy] [--isa avx2] [--json PATH]
       python -m bench course_budget --compare QUIET.json BUSY.json   # headlines side by side, flips marked
       python -m bench course_budget --headers bench/results/course_budget.json  # notebooks state those times
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from minispec.models.machine import machine_name

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
RESULTS = ROOT / "bench" / "results"
TARGETS = {"full_s": 150, "fast_s": 45, "rss_bytes": 2 * 2**30, "course_full_s": 12 * 60, "explorer_s": 0.5,
           "after_release_mb": 512}
ISA = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}
HELD = re.compile(r"the kernel now holds (\d+) MB")
PEAK_CELL = ("import resource, sys\n"
             "_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
             "print('__peak_rss_bytes__', _peak if sys.platform == 'darwin' else _peak * 1024)")


def run_notebook(path: Path, fast: bool, timeout_s: int = 1800, per_cell: bool = False) -> dict:
    """Execute one notebook in a fresh kernel. Returns seconds, peak RSS, slowest cells, records;
    with ``per_cell``, also the kernel's peak RSS after each code cell (``peak_after_cell``: a
    cell reading it is run after each, adding a little time).

    Raises: nbclient's CellExecutionError when a cell fails.
    """
    nb = nbformat.read(path, as_version=4)
    if per_cell:
        cells = []
        for i, cell in enumerate(nb.cells):
            cells.append(cell)
            if cell.cell_type == "code":
                cells.append(nbformat.v4.new_code_cell(PEAK_CELL.replace("__peak_rss_bytes__", f"__cell_{i}__")))
        nb.cells = cells
    nb.cells.append(nbformat.v4.new_code_cell(PEAK_CELL))
    with tempfile.NamedTemporaryFile("w+", suffix=".jsonl", delete=False) as rec:
        record_path = rec.name
    env = {"MINISPEC_HEADLESS": "1", "MINISPEC_RECORD": record_path}
    if fast:
        env["MINISPEC_FAST"] = "1"
    saved = {k: os.environ.get(k) for k in (*env, "MINISPEC_FAST")}
    os.environ.pop("MINISPEC_FAST", None)
    os.environ.update(env)  # the kernel inherits the environment of this process
    try:
        client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3", record_timing=True,
                                resources={"metadata": {"path": str(NOTEBOOKS)}})
        start = time.perf_counter()
        client.execute()
        seconds = time.perf_counter() - start
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    peak, after_cell, held = None, {}, None
    for cell in nb.cells:
        # a cell's stream may arrive in several outputs that split a line: join them first
        text = "".join(o["text"] for o in cell.get("outputs", [])
                       if o.get("name") == "stdout" and isinstance(o.get("text"), str))
        found = HELD.search(text)
        held = int(found.group(1)) if found else held
        for line in text.splitlines():
            if line.startswith("__peak_rss_bytes__"):
                peak = int(line.split()[1])
            elif line.startswith("__cell_"):
                after_cell[int(line.split()[0][7:-2])] = int(line.split()[1])
    nb.cells = [c for c in nb.cells if "__peak_rss_bytes__" not in c.source and "__cell_" not in c.source]
    cells = []
    for i, cell in enumerate(nb.cells):
        timing = cell.get("metadata", {}).get("execution", {})
        if cell.cell_type == "code" and "iopub.execute_input" in timing and "shell.execute_reply" in timing:
            cells.append((i, _elapsed(timing["iopub.execute_input"], timing["shell.execute_reply"])))
    records = [json.loads(line) for line in Path(record_path).read_text().splitlines() if line.strip()]
    Path(record_path).unlink(missing_ok=True)
    return {"seconds": round(seconds, 1), "peak_rss_bytes": peak, "after_release_mb": held,
            "slowest_cells": [{"cell": i, "seconds": round(s, 1)} for i, s in sorted(cells, key=lambda c: -c[1])[:4]],
            "headlines": [r["text"] for r in records if r["kind"] == "headline"],
            "explorer_s": [round(r["seconds"], 3) for r in records if r["kind"] == "explorer"],
            **({"peak_after_cell": after_cell} if per_cell else {})}


def _elapsed(start: str, end: str) -> float:
    """Seconds between two of Jupyter's ISO timestamps."""
    from datetime import datetime

    def parse(t: str) -> datetime:
        return datetime.fromisoformat(t.replace("Z", "+00:00"))

    return (parse(end) - parse(start)).total_seconds()


POSITIVE = ("faster", "higher", "ahead of", "wins", "more ")
NEGATIVE = ("slower", "lower", "loses", "fewer ")
UNSETTLED = ("too noisy", "not settled", "no measurable", "cannot rank", "within the noise", "one round")


def direction(headline: str) -> int:
    """+1, -1 or 0: what a headline claims, read from its words (0: no claim, or unsettled)."""
    text = headline.lower()
    if any(w in text for w in UNSETTLED):
        return 0
    pos, neg = any(w in text for w in POSITIVE), any(w in text for w in NEGATIVE)
    return 1 if pos and not neg else -1 if neg and not pos else 0


def _words(headline: str) -> str:
    """A headline with its numbers taken out: what is left is its verdict's wording."""
    return re.sub(r"[-+]?\d+(\.\d+)?", "#", headline)


def compare_runs(quiet: dict, busy: dict, mode: str = "full") -> list[dict]:
    """Each notebook's headlines of two course_budget runs side by side (the i-th headline of one
    beside the i-th of the other); ``flip`` marks a pair whose claims point opposite ways,
    ``changed`` one whose words differ once the numbers are taken out (a verdict that moved, e.g.
    "wins" to "about breaks even", though not to the opposite side)."""
    rows = []
    for stem in sorted(set(quiet["notebooks"]) | set(busy["notebooks"])):
        a = quiet["notebooks"].get(stem, {}).get(mode, {}).get("headlines", [])
        b = busy["notebooks"].get(stem, {}).get(mode, {}).get("headlines", [])
        for i in range(max(len(a), len(b))):
            qa, ba = (a[i] if i < len(a) else ""), (b[i] if i < len(b) else "")
            rows.append({"notebook": stem, "quiet": qa, "busy": ba, "flip": direction(qa) * direction(ba) < 0,
                         "changed": _words(qa) != _words(ba)})
    return rows


HEADER = re.compile(r"\*\*Expected run time:\*\*[^\n]*")


def header_text(stem: str, modes: dict, date: str) -> str:
    """A notebook's "Expected run time" sentence from one course_budget run (full and fast mode)."""
    full = modes["full"]["seconds"]
    minutes = max(1.0, round(full / 30) / 2)  # to the half minute
    about = "under a minute" if full < 55 else "about a minute" if minutes == 1 else f"about {minutes:g} minutes"
    fast = f"; {modes['fast']['seconds']:.0f} s in fast mode, `MINISPEC_FAST=1`" if "fast" in modes else ""
    first = (", plus about 35 s the very first time, while the bundled model is converted and cached"
             if stem.startswith("00") else "")
    return (f"**Expected run time:** {about} on a quiet 2-core AMD EPYC ({full:.0f} s measured {date} with "
            f"`bench/course/course_budget.py`{fast}){first}; several times longer while other programs share the cores.")


def write_headers(budget: dict) -> list[str]:
    """Rewrite each measured notebook's "Expected run time" sentence in place (its first cell).
    Returns the notebooks changed. Raises ValueError when a notebook has no such sentence."""
    changed = []
    for stem, modes in budget["notebooks"].items():
        if "full" not in modes:
            continue
        path = NOTEBOOKS / f"{stem}.ipynb"
        nb = nbformat.read(path, as_version=4)
        intro = nb.cells[0].source
        if not HEADER.search(intro):
            raise ValueError(f"{path.name}: no '**Expected run time:**' sentence in its first cell")
        new = HEADER.sub(lambda _: header_text(stem, modes, budget["machine"]["date"]), intro, count=1)
        if new != intro:
            nb.cells[0].source = new
            nbformat.write(nb, path)  # nbformat's own layout, as nbconvert --clear-output writes it
            changed.append(path.name)
    return changed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="full,fast", help="full, fast or both (default full,fast)")
    p.add_argument("--only", default=None, help="comma-separated notebook numbers, e.g. 00,05")
    p.add_argument("--busy", action="store_true", help="spin a second process on one core during the run")
    p.add_argument("--per-cell", action="store_true", help="record the kernel's peak RSS after every code cell")
    p.add_argument("--isa", choices=sorted(ISA), default=None,
                   help="restrict PyTorch and oneDNN to this instruction set in the kernels (a laptop's)")
    p.add_argument("--json", default=None, help="output (default bench/results/course_budget[_busy].json)")
    p.add_argument("--compare", nargs=2, metavar=("QUIET", "BUSY"), default=None,
                   help="print two runs' headlines side by side (flips marked) and write bench/results/course_headlines.json")
    p.add_argument("--headers", metavar="JSON", default=None,
                   help="rewrite each notebook's 'Expected run time' sentence from a course_budget JSON, then exit")
    args = p.parse_args(argv)
    if args.headers:
        changed = write_headers(json.loads(Path(args.headers).read_text()))
        print(f"rewrote the run-time sentence of {len(changed)} notebooks: {', '.join(changed) or 'none'}")
        return 0
    if args.compare:
        quiet, busy = (json.loads(Path(f).read_text()) for f in args.compare)
        rows = compare_runs(quiet, busy, "full" if "full" in quiet.get("total_s", {}) else "fast")
        for r in rows:
            print(f"{'FLIP ' if r['flip'] else '     '}{r['notebook'][:2]} quiet: {r['quiet']}\n{'':8s}busy:  {r['busy']}")
        for r in rows:
            if r["changed"] and not r["flip"]:
                print(f"CHANGED {r['notebook'][:2]} quiet: {r['quiet']}\n{'':8s}busy:  {r['busy']}")
        print(f"{sum(r['flip'] for r in rows)} of {len(rows)} headlines flipped between the quiet and the busy run; "
              f"{sum(r['changed'] for r in rows)} changed their words (numbers aside)")
        mode = "full" if "full" in quiet.get("total_s", {}) else "fast"
        seconds = {stem: {"quiet": quiet["notebooks"].get(stem, {}).get(mode, {}).get("seconds"),
                          "busy": busy["notebooks"].get(stem, {}).get(mode, {}).get("seconds")}
                   for stem in sorted(set(quiet["notebooks"]) | set(busy["notebooks"]))}
        for stem, t in seconds.items():
            print(f"{stem:32s} quiet {t['quiet']} s, busy {t['busy']} s")
        out = RESULTS / "course_headlines.json"
        out.write_text(json.dumps({"quiet": Path(args.compare[0]).name, "busy": Path(args.compare[1]).name, "mode": mode,
                                   "seconds": seconds, "rows": rows}, indent=1) + "\n")
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("full", "fast")]
    if bad:
        p.error(f"--modes {args.modes!r}: each mode must be 'full' or 'fast'")
    only = args.only.split(",") if args.only else None
    paths = sorted(q for q in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if not only or q.name[:2] in only)
    if not paths:
        p.error(f"--only {args.only!r}: no notebook starts with those numbers")
    os.environ.update(ISA.get(args.isa, {}))  # the kernels inherit the restriction
    capability = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability(), "
         "bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))"], capture_output=True, text=True).stdout.split()
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    results: dict[str, dict] = {}
    try:
        for mode in modes:
            for path in paths:
                r = run_notebook(path, fast=mode == "fast", per_cell=args.per_cell)
                results.setdefault(path.stem, {})[mode] = r
                rss = f"{r['peak_rss_bytes'] / 2**30:.2f} GiB" if r["peak_rss_bytes"] else "?"
                print(f"{mode:4s} {path.stem:32s} {r['seconds']:7.1f} s  peak RSS {rss}", flush=True)
    finally:
        if hog is not None:
            hog.kill()
    print(f"\n{'notebook':32s} {'full s':>7s} {'fast s':>7s} {'peak GiB':>8s} {'explorer s':>11s} {'kept MB':>8s}"
          "  within targets")
    for stem, r in results.items():
        full, fast = r.get("full"), r.get("fast")
        peak = max((x["peak_rss_bytes"] or 0) for x in r.values())
        explorer = max((s for x in r.values() for s in x["explorer_s"]), default=None)
        kept = max((x["after_release_mb"] or 0 for x in r.values()), default=0)
        ok = ((full is None or full["seconds"] <= TARGETS["full_s"]) and (fast is None or fast["seconds"] <= TARGETS["fast_s"])
              and peak <= TARGETS["rss_bytes"] and (explorer is None or explorer <= TARGETS["explorer_s"])
              and kept <= TARGETS["after_release_mb"])
        print(f"{stem:32s} {full['seconds'] if full else float('nan'):7.1f} {fast['seconds'] if fast else float('nan'):7.1f} "
              f"{peak / 2**30:8.2f} {explorer if explorer is not None else float('nan'):11.2f} {kept:8d}"
              f"  {'yes' if ok else 'NO'}")
    totals = {m: round(sum(r[m]["seconds"] for r in results.values() if m in r), 1) for m in modes}
    print("all notebooks: " + ", ".join(f"{m} {s / 60:.1f} min" for m, s in totals.items()))
    out = {"notebooks": results, "total_s": totals, "targets": TARGETS, "busy": args.busy,
           "isa": args.isa, "capability": capability[0] if capability else None,
           "bf16_native": capability[1] == "True" if len(capability) > 1 else None,
           "machine": {"cpu": machine_name(), "platform": platform.platform(), "processor": platform.processor(),
                       "cpu_count": os.cpu_count(),
                       "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d")}}
    suffix = f"{'_busy' if args.busy else ''}{'_' + args.isa if args.isa else ''}"
    path = Path(args.json) if args.json else RESULTS / f"course_budget{suffix}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"[course_budget] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
