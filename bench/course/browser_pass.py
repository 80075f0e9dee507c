"""The course in a real browser: JupyterLab in headless Chromium, Run All on every notebook, every
explorer's widgets moved to their ends, each page screenshotted and checked.

    python -m bench browser_pass [--fast] [--only 00,05] [--out build/browser]

Needs Playwright (``pip install playwright``) and Debian's Chromium (``apt-get install chromium``).
Starts ``jupyter lab`` on a free local port (no token), opens each notebook as a learner would, runs
Run All Cells from the Run menu, waits until no cell is queued or running, then moves every slider
of the page to its first and last value and picks each dropdown's first and last option (each
explorer redraws), and checks what a learner would see:
- tracebacks: an output holding "Traceback" or an error name (a learner's code may fail on purpose in
  an exercise cell; those are listed apart: cells whose source raises NotImplementedError);
- clipped text: a printed line wider than its output area (the learner must scroll sideways);
- long silences: stretches over 20 s in which no output on the page changed (a progress line rewritten
  in place counts as a change).
Writes ``<out>/NN_name.png`` (the whole page) and ``<out>/browser_pass.json``; prints a table.
The notebooks on disk are not changed: autosave is off, each one is closed without saving, and any
file saved anyway is put back as the pass found it (an earlier pass left outputs in two notebooks).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# run in the page: what the learner sees in the output areas
CHECK_JS = """
() => {
  const cells = [...document.querySelectorAll('.jp-Notebook .jp-Cell')];
  const out = {tracebacks: [], clipped: [], running: 0};
  cells.forEach((cell, i) => {
    const prompt = cell.querySelector('.jp-InputPrompt');
    if (prompt && prompt.textContent.includes('*')) out.running += 1;
    const src = (cell.querySelector('.jp-InputArea-editor') || {}).textContent || '';
    cell.querySelectorAll('.jp-OutputArea-output').forEach(o => {
      const text = o.textContent || '';
      if (/Traceback|Error:|Exception/.test(text) && o.getAttribute('data-mime-type') !== 'text/html')
        out.tracebacks.push({cell: i, exercise: src.includes('NotImplementedError'), text: text.slice(0, 300)});
      o.querySelectorAll('pre').forEach(pre => {
        if (pre.scrollWidth > pre.clientWidth + 2) out.clipped.push({cell: i, text: pre.textContent.slice(0, 120)});
      });
    });
  });
  return out;
}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(port: int, fast: bool) -> subprocess.Popen:
    """JupyterLab at the repository root, as `make course` starts it, without a token."""
    settings = Path(tempfile.mkdtemp()) / "settings"
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text('{"windowingMode": "none"}')  # every cell in the page, so every output is checked
    docmanager = settings / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings"
    docmanager.parent.mkdir(parents=True)
    docmanager.write_text('{"autosave": false}')  # a long Run All would otherwise save outputs into the files
    env = dict(os.environ, MINISPEC_FAST="1" if fast else "0", JUPYTERLAB_SETTINGS_DIR=str(settings))
    env.pop("MINISPEC_HEADLESS", None)  # the explorers show their widgets, as for a learner
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ServerApp.token=",
           "--ServerApp.password=", f"--ServerApp.root_dir={ROOT}", "--ServerApp.disable_check_xsrf=True"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("jupyter lab did not start within 60 s")


def run_notebook(page, url: str, timeout_s: float) -> dict:
    """Open, Run All, wait, move the widgets; returns what the page showed."""
    t0 = time.time()
    page.goto(url)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)  # the kernel is up
    time.sleep(1)
    for _ in range(3):  # the menu sometimes swallows a click while it opens: retry until a cell is queued
        page.click(".lm-MenuBar-itemLabel:text-is('Run')")
        time.sleep(1)
        page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
        time.sleep(3)
        if any(p.strip()[1:-2] for p in page.locator(".jp-InputPrompt").all_text_contents() if p.strip()):
            break
    silent = []
    last_outputs, last_change = "", time.time()
    while time.time() - t0 < timeout_s:
        state = page.evaluate(CHECK_JS)
        outputs = "".join(page.locator(".jp-OutputArea-output").all_text_contents())  # a progress line rewritten counts
        if outputs != last_outputs:
            if time.time() - last_change > 20:
                silent.append(round(time.time() - last_change))
            last_outputs, last_change = outputs, time.time()
        if state["running"] == 0:
            break
        time.sleep(2)
    run_s = time.time() - t0
    moved = move_widgets(page)
    state = page.evaluate(CHECK_JS)
    return {"seconds": round(run_s, 1), "finished": state["running"] == 0, "widgets_moved": moved,
            "tracebacks": [t for t in state["tracebacks"] if not t["exercise"]],
            "exercise_errors": len([t for t in state["tracebacks"] if t["exercise"]]),
            "clipped": state["clipped"], "silent_stretches_s": silent}


def move_widgets(page) -> int:
    """Every slider to its first then last value (keyboard Home / End on its handle), every
    dropdown to its first then last option; waits for each redraw. Returns how many were moved."""
    moved = 0
    for handle in page.locator(".widget-slider .noUi-handle, .jupyter-widget-slider .noUi-handle").all():
        for key in ("Home", "End"):
            handle.focus()
            page.keyboard.press(key)
            time.sleep(1.5)
        moved += 1
    for select in page.locator(".widget-dropdown select, .jupyter-widget-dropdown select").all():
        options = select.locator("option").all_text_contents()
        for choice in (options[0], options[-1]) if options else ():
            select.select_option(label=choice)
            time.sleep(1.5)
        moved += 1
    return moved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", action="store_true", help="MINISPEC_FAST=1 (the small workloads CI runs)")
    ap.add_argument("--only", default="", help="notebook numbers, e.g. 00,05")
    ap.add_argument("--out", default=str(ROOT / "build" / "browser"))
    ap.add_argument("--timeout-s", type=float, default=1200, help="per notebook")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    only = [x.strip() for x in args.only.split(",") if x.strip()]
    paths = sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if not only or p.name[:2] in only)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    before = {p: p.read_bytes() for p in paths}  # the pass must leave the notebooks as it found them
    checkpoints = NOTEBOOKS / ".ipynb_checkpoints"  # and leave no copies of them behind
    had_checkpoints = checkpoints.exists()
    port = free_port()
    lab = start_lab(port, args.fast)
    results = {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS)
            for path in paths:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                # ?reset: a fresh workspace, so tabs left open by the notebook before do not hide this one's cells
                url = f"http://127.0.0.1:{port}/lab/tree/notebooks/{path.name}?reset"
                try:
                    results[path.stem] = run_notebook(page, url, args.timeout_s)
                except Exception as exc:  # keep going: one notebook's failure is a finding
                    results[path.stem] = {"error": f"{type(exc).__name__}: {exc}"}
                # the notebook scrolls inside its panel: a viewport as tall as the notebook shows all of it
                height = page.evaluate("() => (document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer') || "
                                       "document.body).scrollHeight")
                page.set_viewport_size({"width": 1280, "height": min(int(height) + 300, 32000)})
                page.evaluate("() => { const e = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer'); "
                              "if (e) e.scrollTop = 0; }")
                time.sleep(1)
                page.screenshot(path=str(out / f"{path.stem}.png"))
                page.close()
                print(f"{path.stem}: {json.dumps(results[path.stem])[:400]}", flush=True)
            browser.close()
    finally:
        lab.terminate()
        lab.wait(timeout=30)
        for p, data in before.items():
            if p.read_bytes() != data:
                p.write_bytes(data)
                print(f"{p.name} was saved during the pass; restored the copy it started from", flush=True)
        if checkpoints.exists() and not had_checkpoints:  # JupyterLab's copies of what it opened
            shutil.rmtree(checkpoints)
    summary = {"date": time.strftime("%Y-%m-%d"), "fast": args.fast, "notebooks": results}
    (out / "browser_pass.json").write_text(json.dumps(summary, indent=1) + "\n")
    bad = {k: v for k, v in results.items() if v.get("error") or v.get("tracebacks") or v.get("clipped")
           or not v.get("finished", False)}
    print(f"\n{len(results)} notebooks; {len(bad)} with a traceback, clipped output, an error or a cell still running")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
