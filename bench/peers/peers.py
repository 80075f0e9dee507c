"""minispec beside its peers on the bundled GGUF file, in one run: transformers and llama.cpp.

Three scenarios, each run by every peer on the same prompt token ids (the chat template applied
once, by minispec's tokenizer), interleaved prompt by prompt with the order rotating, because a
shared machine drifts and only ratios from one run compare:
- decode: batch-1 greedy decode of ``--max-tokens`` tokens, EOS ignored. Reported as decode-only
  tokens/s (the time from the first to the last token over the tokens between them) and end to end.
- c8: ``--concurrency`` requests at once, prefill included: minispec's continuous batching,
  transformers' ``generate_batch`` (its continuous batching), and llama.cpp through
  llama-cpp-python's ``Llama``, which decodes one sequence at a time, so its requests run one
  after another (the table says so).
- ngram: copy prompts, prompt-lookup speculation with k = 4 draft tokens, stopping at EOS:
  minispec ``--spec ngram --k 4``, ``generate(prompt_lookup_num_tokens=4)``, and llama.cpp with
  ``LlamaPromptLookupDecoding(num_pred_tokens=4)``; each against its own plain decode.
What each peer reads: minispec runs its default weights (``--weights``, the engine's choice on
this CPU; ``--minispec`` adds variants), transformers the checkpoint dequantized to float32 (it
cannot run Q4_1 tensors on CPU), llama.cpp the Q4_1 file as it is.
llama.cpp runs in a child process per scenario: a crash there (the 0.3.36 build segfaulted on an
Intel Xeon when evaluating multi-token batches of this file) is reported with the version, the
setting and the signal, and the other peers' rows still come out. A missing llama-cpp-python is
reported the same way. Install it from source (not in requirements.txt; about 10 minutes on 2
cores): ``pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36``.

Writes bench/results/peers.json and prints a table. A benchmark script, not a test.
Usage: python -m bench peers [--quick] [--scenarios decode,c8,ngram] [--minispec default,float32]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import multiprocessing as mp
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from minispec.build import build_engine
from minispec.base.config import EngineConfig, SpecConfig
from minispec.core.support.metrics import request_metrics
from minispec.models.loader import BUNDLED_TARGET, from_hf, load_hf_model, load_tokenizer, resolve_model
from minispec.core.request import SamplingParams
from minispec.core.support.stops import eos_ids
from minispec.core.support.text import chat_template_ids
from minispec.tools.workload import load_prompts

RESULTS = Path(__file__).resolve().parents[1] / "results"
LLAMA_CPP_VERSION = "0.3.36"


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def rotated(names: list[str], i: int) -> list[str]:
    i %= len(names)
    return names[i:] + names[:i]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (None when equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# -- llama.cpp, in a child process -------------------------------------------------------------
def _llama_worker(task: dict, queue) -> None:
    """Run one llama.cpp scenario and put its result on ``queue`` (the parent reads a crash from
    the exit code)."""
    from llama_cpp import Llama

    kwargs = dict(model_path=task["model_path"], n_ctx=task["n_ctx"], n_threads=task["threads"],
                  n_threads_batch=task["threads"], n_batch=task["n_batch"], verbose=False, seed=0)
    if task.get("lookup"):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        kwargs["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=task["lookup"])
    llm = Llama(**kwargs)
    eos = llm.token_eos()
    results = []
    for ids in task["prompts"]:
        llm.reset()
        out, times = [], []
        start = time.perf_counter()
        for tok in llm.generate(ids, top_k=1, temp=0.0, reset=True):
            out.append(int(tok))
            times.append(time.perf_counter())
            if len(out) >= task["max_tokens"] or (task["stop_at_eos"] and tok == eos):
                break
        results.append({"tokens": out, "wall_s": times[-1] - start, "ttft_s": times[0] - start,
                        "decode_s": times[-1] - times[0]})
    queue.put(results)


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo ("" where there is none): ``platform.processor()`` is
    empty on Linux, and ratios from an AMD EPYC and an Intel Xeon differ by 2-3x."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")


def child_result(target, task: dict, timeout_s: float) -> tuple[object | None, int | None]:
    """Run ``target(task, queue)`` in a spawned child and return (what it put on the queue, or None;
    its exit code). A child that dies without a result (a segfault) is noticed within a second: it
    used to be waited on for the whole ``timeout_s`` (30 minutes lost per crashed setting)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(task, queue))
    proc.start()
    deadline, results = time.monotonic() + timeout_s, None
    while results is None and time.monotonic() < deadline:
        alive = proc.is_alive()
        try:  # one more wait after the child's exit: its result may still be in the pipe
            results = queue.get(timeout=1.0)
        except Exception:
            if not alive:
                break
    proc.join(10)
    code = proc.exitcode
    if proc.is_alive():  # hung past the timeout
        proc.kill()
    return results, code


def llama_cpp(task: dict, timeout_s: float = 1800) -> dict:
    """Run ``task`` in a child process. Returns {"results": [...]} or {"error": why}."""
    if version("llama-cpp-python") is None:
        return {"error": "llama-cpp-python is not installed (see this script's doc for the command)"}
    results, code = child_result(_llama_worker, task, timeout_s)
    if results is None:
        setting = f"n_batch={task['n_batch']}" + (f", prompt lookup {task['lookup']}" if task.get("lookup") else "")
        return {"error": f"llama-cpp-python {version('llama-cpp-python')} crashed or hung "
                         f"(exit code {code}; a negative code is the signal) with {setting}"}
    return {"results": results}


# -- transformers and minispec ----------------------------------------------------------------
class Peers:
    def __init__(self, args):
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        self.source = resolve_model(BUNDLED_TARGET)
        self.hf = load_hf_model(self.source).eval()
        self.tokenizer = load_tokenizer(self.source)
        self.eos = sorted(eos_ids(self.tokenizer, self.hf.config))
        self.model = from_hf(self.hf, torch.float32, torch.device("cpu")).eval().requires_grad_(False)
        self.args = args

    def engine(self, variant: str, spec: SpecConfig | None = None):
        weights = None if variant == "default" else variant
        config = EngineConfig(model=BUNDLED_TARGET, device="cpu", max_model_len=2048, weights=weights,
                              spec=spec or SpecConfig())
        return build_engine(config, self.model, self.tokenizer, self.hf.config)

    @staticmethod
    def minispec_one(engine, ids, params) -> dict:
        rid = engine.add_request(ids, params)
        start = time.perf_counter()
        engine.run_until_done()
        wall = time.perf_counter() - start
        req = engine.release(rid)
        m = request_metrics(req)
        out = list(req.output_token_ids)
        return {"tokens": out, "wall_s": wall, "ttft_s": m["ttft_s"], "decode_s": m["tpot_s"] * (len(out) - 1)}

    @torch.inference_mode()
    def hf_one(self, ids, max_new_tokens: int, stop_at_eos: bool, **kwargs) -> dict:
        x = torch.tensor([ids])
        eos = self.eos if stop_at_eos else -1
        times = []

        class Clock:  # generate's streamer: a timestamp per new token (the prompt comes first)
            def put(self, value):
                times.append(time.perf_counter())

            def end(self):
                pass

        start = time.perf_counter()
        out = self.hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new_tokens,
                               eos_token_id=eos, pad_token_id=self.eos[0], streamer=Clock(), **kwargs)
        new = out[0, len(ids):].tolist()
        if stop_at_eos:
            new = new[: next((i + 1 for i, t in enumerate(new) if t in self.eos), len(new))]
        stamps = times[1:]  # the first put is the prompt
        wall = time.perf_counter() - start
        # with prompt lookup, generate streams several tokens at once: decode time over tokens
        return {"tokens": new, "wall_s": wall, "ttft_s": stamps[0] - start if stamps else wall,
                "decode_s": (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0}


def llama_task(peers: Peers, prompts, max_tokens, stop_at_eos, n_batch, lookup=0) -> dict:
    return {"model_path": str(Path(peers.source.path) / peers.source.gguf_file), "n_ctx": 2048,
            "threads": torch.get_num_threads(), "n_batch": n_batch, "prompts": prompts, "max_tokens": max_tokens,
            "stop_at_eos": stop_at_eos, "lookup": lookup}


def decode_rate(runs: list[dict]) -> float:
    """Decode-only tokens/s over runs: tokens after the first over the time after the first."""
    return sum(len(r["tokens"]) - 1 for r in runs) / sum(r["decode_s"] for r in runs)


def scenario_decode(peers: Peers, args) -> dict:
    prompts = [chat_template_ids(peers.tokenizer, m) for m in load_prompts("chat")[: args.num_prompts]]
    n = args.max_tokens
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    engines = {f"minispec/{v}": peers.engine(v) for v in args.minispec}
    for e in engines.values():
        peers.minispec_one(e, prompts[0], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    peers.hf_one(prompts[0], 4, stop_at_eos=False)
    runs = {name: [] for name in [*engines, "transformers"]}
    for i, ids in enumerate(prompts):
        for who in rotated(list(runs), i):
            runs[who].append(peers.minispec_one(engines[who], ids, params) if who in engines
                             else peers.hf_one(ids, n, stop_at_eos=False))
    # llama.cpp: prompts evaluated one token per batch (n_batch=1) and with its default batch
    llama = {}
    for n_batch in (1, 512):
        out = llama_cpp(llama_task(peers, prompts, n, False, n_batch))
        llama[f"llama.cpp/n_batch={n_batch}"] = out
        if "results" in out:
            runs[f"llama.cpp/n_batch={n_batch}"] = out["results"]
    rows = {who: {"decode_tok_s": decode_rate(r), "e2e_tok_s": sum(len(x["tokens"]) for x in r) / sum(x["wall_s"] for x in r),
                  "ttft_s": statistics.median(x["ttft_s"] for x in r)} for who, r in runs.items()}
    base = runs[next(iter(engines))]
    for who, r in runs.items():
        rows[who]["first_difference_vs_minispec"] = [first_difference(a["tokens"], b["tokens"]) for a, b in zip(r, base)]
    errors = {k: v["error"] for k, v in llama.items() if "error" in v}
    return {"num_prompts": len(prompts), "max_tokens": n, "rows": rows, "errors": errors}


def scenario_c8(peers: Peers, args) -> dict:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    chats = load_prompts("chat")
    prompts = [chat_template_ids(peers.tokenizer, chats[i % len(chats)]) for i in range(args.concurrency)]
    n = args.c8_max_tokens

    def minispec(v):
        engine = peers.engine(v)
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        for ids in prompts:
            engine.add_request(ids, params)
        engine.run_until_done()

    def hf():
        gen = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=-1, pad_token_id=peers.eos[0])
        cb = ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=256)
        with torch.inference_mode(), contextlib.redirect_stderr(io.StringIO()):
            peers.hf.generate_batch(inputs=prompts, generation_config=gen, continuous_batching_config=cb,
                                    progress_bar=False)

    jobs = {f"minispec/{v}": (lambda v=v: minispec(v)) for v in args.minispec}
    jobs["transformers"] = hf
    for job in jobs.values():
        job()  # warm-up
    wall = {who: [] for who in jobs}
    for rep in range(args.repeats):
        for who in rotated(list(jobs), rep):
            start = time.perf_counter()
            jobs[who]()
            wall[who].append(time.perf_counter() - start)
    rows = {who: {"tok_s": n * len(prompts) / statistics.median(w), "wall_s": w} for who, w in wall.items()}
    out = llama_cpp(llama_task(peers, prompts, n, False, 512))
    errors = {}
    if "results" in out:
        total = sum(r["wall_s"] for r in out["results"])
        rows["llama.cpp (one request at a time)"] = {"tok_s": n * len(prompts) / total, "wall_s": [total]}
    else:
        errors["llama.cpp"] = out["error"]
    return {"num_requests": len(prompts), "max_tokens": n, "rows": rows, "errors": errors}


def scenario_ngram(peers: Peers, args) -> dict:
    prompts = [chat_template_ids(peers.tokenizer, m) for m in load_prompts("copy")[: args.num_copy_prompts]]
    n, k = args.copy_max_tokens, 4
    params = SamplingParams(max_tokens=n, temperature=0.0)
    engines = {}
    for v in args.minispec:
        engines[f"minispec/{v}/off"] = peers.engine(v)
        engines[f"minispec/{v}/ngram"] = peers.engine(v, SpecConfig(method="ngram", num_speculative_tokens=k))
    jobs = {**{name: (lambda ids, e=e: peers.minispec_one(e, ids, params)) for name, e in engines.items()},
            "transformers/off": lambda ids: peers.hf_one(ids, n, stop_at_eos=True),
            "transformers/ngram": lambda ids: peers.hf_one(ids, n, stop_at_eos=True, prompt_lookup_num_tokens=k)}
    for job in jobs.values():
        job(prompts[0][:64])  # warm-up
    runs = {who: [] for who in jobs}
    for i, ids in enumerate(prompts):
        for who in rotated(list(jobs), i):
            runs[who].append(jobs[who](ids))
    errors = {}
    for name, lookup in (("llama.cpp/off", 0), ("llama.cpp/ngram", k)):
        out = llama_cpp(llama_task(peers, prompts, n, True, 512, lookup))
        if "results" in out:
            runs[name] = out["results"]
        else:
            errors[name] = out["error"]
    rows = {who: {"e2e_tok_s": sum(len(x["tokens"]) for x in r) / sum(x["wall_s"] for x in r),
                  "num_tokens": sum(len(x["tokens"]) for x in r)} for who, r in runs.items()}
    for who in list(rows):
        if who.endswith("/ngram") and who.replace("/ngram", "/off") in rows:
            off = who.replace("/ngram", "/off")
            rows[who]["vs_own_off"] = rows[who]["e2e_tok_s"] / rows[off]["e2e_tok_s"]
            rows[who]["same_output_as_own_off"] = [a["tokens"] == b["tokens"] for a, b in zip(runs[who], runs[off])]
    return {"num_prompts": len(prompts), "max_tokens": n, "k": k, "rows": rows, "errors": errors}


def table(results: dict) -> str:
    lines = []
    if "decode" in results:
        d = results["decode"]
        ours = [who for who in d["rows"] if who.startswith("minispec/")]
        lines.append(f"batch-1 greedy decode, {d['num_prompts']} prompts x {d['max_tokens']} tokens; last columns: the "
                     "peer's decode rate over each minispec row's")
        lines.append(f"  {'peer':<34} {'decode tok/s':>12} {'e2e tok/s':>10} {'TTFT ms':>8} "
                     + " ".join(f"{'/ ' + who.removeprefix('minispec/'):>10}" for who in ours))
        for who, r in d["rows"].items():
            lines.append(f"  {who:<34} {r['decode_tok_s']:>12.1f} {r['e2e_tok_s']:>10.1f} {1e3 * r['ttft_s']:>8.1f} "
                         + " ".join(f"{r['decode_tok_s'] / d['rows'][o]['decode_tok_s']:>9.2f}x" for o in ours))
        lines += [f"  {k}: {v}" for k, v in d["errors"].items()]
    if "c8" in results:
        c = results["c8"]
        lines.append(f"{c['num_requests']} requests at once, {c['max_tokens']} tokens each, prefill included")
        for who, r in c["rows"].items():
            lines.append(f"  {who:<34} {r['tok_s']:>12.1f} tok/s")
        lines += [f"  {k}: {v}" for k, v in c["errors"].items()]
    if "ngram" in results:
        g = results["ngram"]
        lines.append(f"copy prompts, prompt lookup k={g['k']}, up to {g['max_tokens']} tokens, stop at EOS")
        for who, r in g["rows"].items():
            extra = (f"  {r['vs_own_off']:.2f}x its own plain decode, same output {sum(r['same_output_as_own_off'])}"
                     f"/{len(r['same_output_as_own_off'])}") if "vs_own_off" in r else ""
            lines.append(f"  {who:<34} {r['e2e_tok_s']:>12.1f} tok/s{extra}")
        lines += [f"  {k}: {v}" for k, v in g["errors"].items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short smoke run")
    p.add_argument("--scenarios", default="decode,c8,ngram")
    p.add_argument("--minispec", default="default,float32",
                   help="minispec weight formats to run: 'default' (the engine's choice) and any --weights value")
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--c8-max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--num-copy-prompts", type=int, default=4)
    p.add_argument("--copy-max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="default bench/results/peers.json (--quick: peers_quick.json)")
    args = p.parse_args(argv)
    args.minispec = [v.strip() for v in args.minispec.split(",") if v.strip()]
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if not scenarios or set(scenarios) - {"decode", "c8", "ngram"}:
        p.error(f"--scenarios {args.scenarios!r}: choose from decode, c8, ngram")
    if args.quick:
        args.num_prompts, args.max_tokens, args.c8_max_tokens, args.repeats = 2, 16, 8, 1
        args.num_copy_prompts, args.copy_max_tokens = 2, 32
    if args.threads:
        torch.set_num_threads(args.threads)
    peers = Peers(args)
    results = {"machine": {"platform": platform.platform(), "processor": platform.processor(), "cpu": cpu_name(),
                           "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                           "torch": torch.__version__, "transformers": version("transformers"),
                           "llama_cpp_python": version("llama-cpp-python"), "threads": torch.get_num_threads(),
                           "minispec_default_weights": peers.engine("default").runner.weights,
                           "quick": args.quick}}
    for name in scenarios:
        start = time.perf_counter()
        results[name] = {"decode": scenario_decode, "c8": scenario_c8, "ngram": scenario_ngram}[name](peers, args)
        print(f"[peers] {name} done in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    print(table(results))
    path = Path(args.json) if args.json else RESULTS / ("peers_quick.json" if args.quick else "peers.json")
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"[peers] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
