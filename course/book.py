"""The course as a static HTML book: every notebook executed, one page each, and an index.

    python -m course.book [--out build/book] [--fast] [--only 00,05]
    python -m course.book --check build/book     # open every page in headless Chromium

Built with nbconvert, the Jupyter project's converter (its ExecutePreprocessor runs a notebook in a
kernel, its HTMLExporter writes the page with every plot inlined). Explorers run once with their
starting values (MINISPEC_HEADLESS=1), so a page shows the plot a learner first sees. The
notebooks in the repository stay without outputs. Writes ``<out>/index.html``, one
``<out>/NN_name.html`` per notebook and ``<out>/timings.json`` (seconds per notebook, fast mode
or not, and the machine), the run times docs/teaching.md quotes.

``--check`` needs Playwright (``pip install playwright``) and a Chromium on the PATH (Debian:
``apt-get install chromium``); it loads each page and fails unless every page loads, has at least
one image and every image decodes.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter
from nbconvert.preprocessors import ExecutePreprocessor

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def notebook_summary(nb) -> tuple[str, list[str]]:
    """(title, learning goals) from a notebook's first markdown cell."""
    text = "".join(nb.cells[0].source) if nb.cells else ""
    lines = text.splitlines()
    title = next((ln.lstrip("# ").strip() for ln in lines if ln.startswith("#")), "untitled")
    goals = [ln.split(".", 1)[1].strip() for ln in lines if ln[:2].rstrip(".").isdigit() and "." in ln[:3]]
    return title, goals


def build(out: Path, only: list[str] | None = None, timeout_s: int = 1200) -> dict:
    """Execute the notebooks (those whose name starts with one of ``only``, default all) and write
    their pages, the index and timings.json. Returns {notebook name: seconds}.

    Raises: FileNotFoundError when ``only`` matches no notebook; nbconvert's CellExecutionError
    when a cell fails (the page is not written).
    """
    paths = sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if not only or p.name[:2] in only)
    if not paths:
        raise FileNotFoundError(f"no notebook in {NOTEBOOKS.name}/ starts with any of {only}")
    out.mkdir(parents=True, exist_ok=True)
    os.environ["MINISPEC_HEADLESS"] = "1"  # the kernels inherit it
    exporter = HTMLExporter(template_name="lab")
    timings, entries = {}, []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        ExecutePreprocessor(timeout=timeout_s, kernel_name="python3").preprocess(
            nb, {"metadata": {"path": str(NOTEBOOKS)}})
        timings[path.stem] = round(time.perf_counter() - start, 1)
        body, _ = exporter.from_notebook_node(nb)
        (out / f"{path.stem}.html").write_text(body, encoding="utf-8")
        entries.append((path.stem, *notebook_summary(nb)))
        print(f"{path.name}: {timings[path.stem]:.0f} s", flush=True)
    (out / "index.html").write_text(index_page(entries, timings), encoding="utf-8")
    (out / "timings.json").write_text(json.dumps({
        "seconds": timings, "fast": os.environ.get("MINISPEC_FAST") == "1",
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "python": sys.version.split()[0],
                    "date": time.strftime("%Y-%m-%d")}}, indent=1) + "\n")
    return timings


def index_page(entries: list[tuple[str, str, list[str]]], timings: dict) -> str:
    """The book's front page: one entry per notebook with its learning goals and run time."""
    items = []
    for stem, title, goals in entries:
        goal_list = "".join(f"<li>{html.escape(g)}</li>" for g in goals)
        items.append(f'<li><a href="{stem}.html">{html.escape(title)}</a> '
                     f"<small>(executed in {timings[stem]:.0f} s)</small><ul>{goal_list}</ul></li>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>minispec: the course</title></head>"
            "<body style='font-family: sans-serif; max-width: 50em; margin: 2em auto'>"
            "<h1>minispec: speculative decoding against continuous batching</h1>"
            "<p>Every notebook as executed once, plots and printed results included. The numbers are "
            "this build machine's; run the notebooks (<code>make course</code>) to measure your own. Quizzes "
            "and sliders need a running notebook: on these pages they stay empty or show their first "
            "position only.</p>"
            f"<ol>{''.join(items)}</ol></body></html>\n")


def check(out: Path) -> list[str]:
    """Open every page of a built book in headless Chromium. Returns one line per page; raises
    RuntimeError naming each page that failed to load, has no image, or has an image that did
    not decode."""
    from playwright.sync_api import sync_playwright  # optional: only this check needs a browser

    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    pages = [out / "index.html"] + sorted(out.glob("[0-9][0-9]_*.html"))
    lines, bad = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True)
        page = browser.new_page()
        for path in pages:
            response = page.goto(path.resolve().as_uri(), wait_until="load")
            images = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete "
                                                      "&& i.naturalWidth > 0)")
            ok = (response is not None and response.ok and all(images)
                  and (images or path.name == "index.html"))
            lines.append(f"{path.name}: {'ok' if ok else 'FAILED'}, "
                         f"{sum(images)}/{len(images)} images decoded")
            if not ok:
                bad.append(path.name)
        browser.close()
    if bad:
        raise RuntimeError(f"pages that failed: {', '.join(bad)}\n" + "\n".join(lines))
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="build/book", help="output folder (default build/book)")
    p.add_argument("--fast", action="store_true", help="MINISPEC_FAST=1: the small workloads CI runs")
    p.add_argument("--only", default=None, help="comma-separated notebook numbers, e.g. 00,05")
    p.add_argument("--check", metavar="DIR", default=None, help="check a built book in headless Chromium")
    args = p.parse_args(argv)
    if args.check:
        print("\n".join(check(Path(args.check))))
        return 0
    if args.fast:
        os.environ["MINISPEC_FAST"] = "1"
    build(Path(args.out), args.only.split(",") if args.only else None)
    print(f"open {Path(args.out) / 'index.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
