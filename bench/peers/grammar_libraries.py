"""Grammar libraries side by side for minispec's structured output: llguidance, xgrammar, outlines-core.

minispec masks tokens with llguidance (minispec/structured/grammar.py). This script measures what the two
other common libraries would cost in its place, on the bundled tokenizer (SmolLM2, V = 49152) and
the 32 JSON schemas of the held-out JSON route (data/prompts/json_schemas.jsonl):
  setup      the library's view of the tokenizer, built once (llguidance ``hf.from_tokenizer``;
             xgrammar ``TokenizerInfo.from_huggingface`` and a ``GrammarCompiler``; outlines-core a
             byte-level ``Vocabulary``)
  compile    per schema, median and max: llguidance ``grammar_from_json_schema`` and an
             ``LLMatcher`` (its parser is built there, its lexer lazily while masking); xgrammar
             ``compile_json_schema`` (its cache off); outlines-core ``build_regex_from_schema`` and
             an ``Index`` (every state's allowed tokens, precomputed)
  matcher    a fresh matcher from the compiled grammar, per request (llguidance: an ``LLMatcher``
             from the grammar text, as minispec builds one per request; xgrammar ``GrammarMatcher``;
             outlines-core ``Guide``)
  fill       the next-token bitmask ([1, V/32] int32, each library's torch helper), per position
  accept     the token consumed (``consume_token`` / ``accept_token`` / ``advance``)
  rollback   after each position past the 4th: roll back 4 tokens, then accept them again; per token
Each schema's token sequence is one valid instance (every property, strings named after their key,
integer 12, number 3.25, true, two items per array, the first enum value) written as minispec
writes JSON (``json.dumps`` separators ", " and ": ", no other whitespace) and tokenised by the
tokenizer; every library walks the same sequence, each token checked against its mask before it
is accepted, and EOS checked at the end. Masks are compared bit for bit with llguidance's.
JSON options: llguidance as minispec (minispec/structured_output.JSON_OPTIONS), xgrammar
``any_whitespace=False, separators=(", ", ": ")`` (the same strings), outlines-core its default
whitespace pattern (an optional space around each separator and brace: it has no exact-separator
option), so its masks differ from the others' at those positions by design.

    python -m bench grammar_libraries                 # prints a table, writes bench/results/grammar_libraries.json
    python -m bench grammar_libraries --quick         # 4 schemas, 1 walk each (a smoke test)
    python -m bench grammar_libraries --libraries llguidance,xgrammar

A library that is not installed gets a "not installed" row, so it runs in minispec's own venv
(llguidance only). xgrammar and outlines-core are not minispec requirements; to compare all three,
install them into a separate venv that sees minispec's packages, never into minispec's:

    .venv/bin/python -m venv build/glvenv
    echo "$PWD/.venv/lib/python3.11/site-packages" > build/glvenv/lib/python3.11/site-packages/minispec_venv.pth
    build/glvenv/bin/pip install xgrammar outlines-core   # check it installs no other torch
    OMP_NUM_THREADS=1 build/glvenv/bin/python -m bench grammar_libraries

Timings are wall-clock, one thread (``--num-threads``: torch and xgrammar's compiler), garbage
collection off inside the timed loops. Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from minispec.models.loader import BUNDLED_TARGET, load_tokenizer, resolve_model  # noqa: E402

SCHEMAS = ROOT / "data" / "prompts" / "json_schemas.jsonl"
ROLLBACK = 4  # tokens rolled back and accepted again
LIBRARIES = ("llguidance", "xgrammar", "outlines-core")
SEPARATORS = (", ", ": ")  # minispec's JSON separators (minispec/structured_output.JSON_OPTIONS)


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def first_line(exc) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:200]


# -- the libraries, each behind the same few calls -----------------------------------------------
class Llguidance:
    name, package = "llguidance", "llguidance"

    def __init__(self, hf_tokenizer, vocab_size: int, num_threads: int):
        import llguidance
        import llguidance.hf
        import llguidance.torch

        from minispec.base.structured_output import JSON_OPTIONS

        self.ll, self.options = llguidance, JSON_OPTIONS
        self._fill = llguidance.torch.fill_next_token_bitmask
        self.tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer)

    def compile(self, schema: dict):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema, defaults=self.options)
        matcher = self.ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return grammar

    def matcher(self, grammar):
        return self.ll.LLMatcher(self.tokenizer, grammar, log_level=0)

    def fill(self, matcher, bitmask) -> None:
        self._fill(matcher, bitmask)

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)

    def rollback(self, matcher, n: int) -> bool:
        return matcher.rollback(n)

    def describe(self) -> dict:
        return {"json_options": self.options}


class Xgrammar:
    name, package = "xgrammar", "xgrammar"

    def __init__(self, hf_tokenizer, vocab_size: int, num_threads: int):
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=[hf_tokenizer.eos_token_id])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=num_threads, cache_enabled=False)
        self.num_threads = num_threads

    def compile(self, schema: dict):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=SEPARATORS)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher, bitmask) -> None:
        matcher.fill_next_token_bitmask(bitmask, 0)

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)

    def rollback(self, matcher, n: int) -> bool:
        matcher.rollback(n)
        return True

    def describe(self) -> dict:
        return {"any_whitespace": False, "separators": list(SEPARATORS), "max_threads": self.num_threads,
                "cache_enabled": False}


def byte_level_vocabulary(hf_tokenizer, vocab_size: int) -> tuple[int, dict[bytes, list[int]]]:
    """(EOS id, {token bytes: ids}) of a byte-level BPE tokenizer, special tokens left out (as
    outlines-core's ``Vocabulary.from_pretrained`` does; it takes no EOS in the map)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    decode = {c: b for b, c in bytes_to_unicode().items()}
    eos = hf_tokenizer.eos_token_id
    special = set(hf_tokenizer.all_special_ids) | set(getattr(hf_tokenizer, "added_tokens_decoder", {}))
    table: dict[bytes, list[int]] = {}
    for token, tid in hf_tokenizer.get_vocab().items():
        if tid in special or tid == eos or tid >= vocab_size:
            continue
        raw = bytes(decode[c] for c in token) if all(c in decode for c in token) else token.encode()
        table.setdefault(raw, []).append(tid)
    return eos, table


class OutlinesCore:
    name, package = "outlines-core", "outlines_core"

    def __init__(self, hf_tokenizer, vocab_size: int, num_threads: int):
        import outlines_core
        import outlines_core.kernels.torch

        self.oc = outlines_core
        self._fill = outlines_core.kernels.torch.fill_next_token_bitmask
        eos, table = byte_level_vocabulary(hf_tokenizer, vocab_size)
        self.vocabulary = outlines_core.Vocabulary(eos, table)

    def compile(self, schema: dict):
        from outlines_core.json_schema import build_regex_from_schema

        return self.oc.Index(build_regex_from_schema(json.dumps(schema)), self.vocabulary)

    def matcher(self, index):
        return self.oc.Guide(index, max_rollback=2 * ROLLBACK)

    def fill(self, guide, bitmask) -> None:
        self._fill(guide, bitmask)

    def accept(self, guide, token: int) -> bool:
        try:
            guide.advance(token, return_tokens=False)
        except ValueError:
            return False
        return True

    def rollback(self, guide, n: int) -> bool:
        guide.rollback_state(n)
        return True

    def describe(self) -> dict:
        return {"whitespace_pattern": "default (outlines_core.json_schema.WHITESPACE)"}


ADAPTERS = {"llguidance": Llguidance, "xgrammar": Xgrammar, "outlines-core": OutlinesCore}
DISTRIBUTIONS = {"llguidance": "llguidance", "xgrammar": "xgrammar", "outlines-core": "outlines-core"}


# -- the token sequences -------------------------------------------------------------------------
def instance(schema: dict, key: str = "value", i: int = 0):
    """One valid value of ``schema`` (the subset the route's schemas use)."""
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        return {k: instance(s, k) for k, s in schema.get("properties", {}).items()}
    if kind == "array":
        return [instance(schema.get("items", {}), key, j) for j in range(2)]
    return {"string": f"{key.replace('_', ' ').capitalize()} {'one two'.split()[i % 2]}", "integer": 12,
            "number": 3.25, "boolean": True, "null": None}[kind]


def token_sequences(tokenizer, schemas: list[dict]) -> list[list[int]]:
    texts = [json.dumps(instance(s), separators=SEPARATORS, ensure_ascii=False) for s in schemas]
    return [list(tokenizer.encode(t, add_special_tokens=False)) for t in texts]


# -- measuring -----------------------------------------------------------------------------------
SHIFTS = torch.arange(32, dtype=torch.int32)


def allows(bitmask: torch.Tensor, token: int) -> bool:
    return bool((int(bitmask[0, token >> 5]) >> (token & 31)) & 1)


def popcount(bitmask: torch.Tensor) -> int:
    return int(((bitmask[0].unsqueeze(-1) >> SHIFTS) & 1).sum())


def walk(lib, compiled, tokens: list[int], eos: int, bitmask, times: dict, reference: list | None,
         record: list | None) -> str | None:
    """Fill, check, accept each token of ``tokens`` with a fresh matcher, then the final mask (EOS
    allowed). Appends ns timings to ``times``; compares each mask with ``reference`` (counts into
    times["mask_equal"/"mask_compared"]) or appends copies to ``record``. Returns a mismatch or None."""
    clock = time.perf_counter_ns
    a = clock()
    matcher = lib.matcher(compiled)
    times["matcher"].append(clock() - a)
    for i in range(len(tokens) + 1):
        bitmask.fill_(-1)
        a = clock()
        lib.fill(matcher, bitmask)
        b = clock()
        times["fill"].append(b - a)
        if record is not None:
            record.append(bitmask.clone())
        if reference is not None and i < len(reference):
            times["mask_compared"] += 1
            if torch.equal(bitmask, reference[i]):
                times["mask_equal"] += 1
            elif times.get("first_mask_difference") is None:
                times["first_mask_difference"] = {"position": i, "allowed": popcount(bitmask),
                                                  "llguidance_allowed": popcount(reference[i])}
        if i == len(tokens):
            return None if allows(bitmask, eos) else "EOS not allowed after the whole sequence"
        token = tokens[i]
        if not allows(bitmask, token):
            return f"token {i} ({token}) not in the mask ({popcount(bitmask)} allowed)"
        a = clock()
        ok = lib.accept(matcher, token)
        b = clock()
        times["accept"].append(b - a)
        times["fill_accept"].append(times["fill"][-1] + b - a)
        if not ok:
            return f"token {i} ({token}) refused by accept"
    return None


def rollback_walk(lib, compiled, tokens: list[int], times: dict) -> str | None:
    """Accept ``tokens``; after each from the ROLLBACK-th on, roll back ROLLBACK tokens and accept
    them again. Appends per-token ns timings. Returns a failure or None."""
    clock = time.perf_counter_ns
    matcher = lib.matcher(compiled)
    for i, token in enumerate(tokens):
        if not lib.accept(matcher, token):
            return f"token {i} refused"
        if i + 1 < ROLLBACK:
            continue
        a = clock()
        ok = lib.rollback(matcher, ROLLBACK)
        b = clock()
        for t in tokens[i + 1 - ROLLBACK: i + 1]:
            ok = lib.accept(matcher, t) and ok
        c = clock()
        if not ok:
            return f"rollback at token {i} failed"
        times["rollback"].append((b - a) / ROLLBACK)
        times["rollback_reaccept"].append((c - a) / ROLLBACK)
    return None


def stats_us(ns: list, q: float | None = None) -> float | None:
    if not ns:
        return None
    return float(np.percentile(ns, q) if q is not None else np.median(ns)) / 1e3


def measure(name: str, tokenizer, vocab_size: int, schemas: list[dict], ids: list[str], sequences: list[list[int]],
            repeats: int, num_threads: int, reference: dict | None) -> tuple[dict, dict]:
    """One library's row and its per-schema details. ``reference``: llguidance's masks per schema id
    (filled here when ``name`` is llguidance)."""
    row = {"library": name, "version": version(DISTRIBUTIONS[name])}
    if row["version"] is None:
        return {**row, "status": "not installed"}, {}
    gc.collect()
    start = time.perf_counter()
    try:
        lib = ADAPTERS[name](tokenizer, vocab_size, num_threads)
    except Exception as exc:  # an import or setup failure: reported, the other rows still come out
        return {**row, "status": f"setup failed: {first_line(exc)}"}, {}
    row.update(status="ok", setup_s=time.perf_counter() - start, options=lib.describe())
    eos = tokenizer.eos_token_id
    bitmask = torch.full((1, (vocab_size + 31) // 32), -1, dtype=torch.int32)
    times = {k: [] for k in ("compile", "matcher", "fill", "accept", "fill_accept", "rollback", "rollback_reaccept")}
    times.update(mask_equal=0, mask_compared=0, first_mask_difference=None)
    details, rollback_supported = {}, True
    for sid, schema, tokens in zip(ids, schemas, sequences):
        d = details[sid] = {"tokens": len(tokens)}
        gc.collect()
        start = time.perf_counter_ns()
        try:
            compiled = lib.compile(schema)
        except Exception as exc:
            d["compile_error"] = first_line(exc)
            continue
        d["compile_ms"] = (time.perf_counter_ns() - start) / 1e6
        times["compile"].append(d["compile_ms"] * 1e6)
        before = dict(times, first_mask_difference=None)
        gc.disable()
        try:
            for r in range(repeats):
                record = [] if (reference is not None and name == "llguidance" and r == 0) else None
                ref = reference.get(sid) if (reference is not None and name != "llguidance" and r == 0) else None
                try:
                    why = walk(lib, compiled, tokens, eos, bitmask, times, ref, record)
                except Exception as exc:
                    why = f"walk raised {first_line(exc)}"
                if record is not None:
                    reference[sid] = record
                if why:
                    d["mismatch"] = why
                    break
            if "mismatch" not in d and rollback_supported:
                for _ in range(repeats):
                    try:
                        why = rollback_walk(lib, compiled, tokens, times)
                    except (AttributeError, NotImplementedError) as exc:
                        rollback_supported, why = False, None
                        row["rollback"] = f"unsupported: {first_line(exc)}"
                    except Exception as exc:
                        why = f"raised {first_line(exc)}"
                    if why:
                        d["rollback_error"] = why
                    if why or not rollback_supported:
                        break
        finally:
            gc.enable()
        if times["mask_compared"] > before["mask_compared"]:
            d["masks_equal_llguidance"] = (f"{times['mask_equal'] - before['mask_equal']}/"
                                           f"{times['mask_compared'] - before['mask_compared']}")
    n = len(schemas)
    row.update(
        compiled=f"{len(times['compile'])}/{n}",
        compile_ms_median=stats_us(times["compile"]) / 1e3 if times["compile"] else None,
        compile_ms_max=max(times["compile"]) / 1e6 if times["compile"] else None,
        matcher_us_median=stats_us(times["matcher"]),
        fill_us_median=stats_us(times["fill"]), fill_us_p90=stats_us(times["fill"], 90),
        fill_us_mean=float(np.mean(times["fill"])) / 1e3 if times["fill"] else None,
        accept_us_median=stats_us(times["accept"]),
        fill_accept_us_median=stats_us(times["fill_accept"]), fill_accept_us_p90=stats_us(times["fill_accept"], 90),
        rollback_us_per_token_median=stats_us(times["rollback"]),
        rollback_reaccept_us_per_token_median=stats_us(times["rollback_reaccept"]),
        num_fills=len(times["fill"]), num_rollbacks=len(times["rollback"]),
        sequences_accepted=f"{sum(1 for d in details.values() if 'compile_ms' in d and 'mismatch' not in d)}/{n}",
        mismatches={sid: d["mismatch"] for sid, d in details.items() if "mismatch" in d},
        compile_errors={sid: d["compile_error"] for sid, d in details.items() if "compile_error" in d},
        rollback_errors={sid: d["rollback_error"] for sid, d in details.items() if "rollback_error" in d},
    )
    if name != "llguidance" and times["mask_compared"]:
        row["masks_equal_llguidance"] = f"{times['mask_equal']}/{times['mask_compared']}"
        row["first_mask_difference"] = times["first_mask_difference"]
    return row, details


def format_table(rows: list[dict]) -> str:
    def f(x, fmt):
        return "-" if x is None else format(x, fmt)

    lines = ["| library | version | setup s | compiled | compile ms median / max | matcher us | fill us median / p90 | "
             "accept us | fill+accept us/token | rollback us/token | rollback+re-accept us/token | accepted | "
             "masks = llguidance |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['library']} | {r.get('version') or '-'} | {r['status']} |" + " - |" * 10)
            continue
        lines.append(f"| {r['library']} | {r['version']} | {r['setup_s']:.2f} | {r['compiled']} | "
                     f"{f(r['compile_ms_median'], '.1f')} / {f(r['compile_ms_max'], '.1f')} | "
                     f"{f(r['matcher_us_median'], '.0f')} | {f(r['fill_us_median'], '.1f')} / {f(r['fill_us_p90'], '.1f')} | "
                     f"{f(r['accept_us_median'], '.1f')} | {f(r['fill_accept_us_median'], '.1f')} | "
                     f"{f(r['rollback_us_per_token_median'], '.2f')} | {f(r['rollback_reaccept_us_per_token_median'], '.1f')} | "
                     f"{r['sequences_accepted']} | {r.get('masks_equal_llguidance', '-')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--libraries", default=",".join(LIBRARIES), help=f"any of {', '.join(LIBRARIES)}")
    p.add_argument("--num-schemas", type=int, default=32, help="the first N schemas of data/prompts/json_schemas.jsonl")
    p.add_argument("--repeats", type=int, default=3, help="walks of each sequence per library (fresh matcher each)")
    p.add_argument("--num-threads", type=int, default=1, help="torch threads and xgrammar's compiler threads")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "grammar_libraries.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.num_schemas, args.repeats = 4, 1
        if args.out == p.get_default("out"):
            args.out = str(ROOT / "bench" / "results" / "grammar_libraries_quick.json")
    libraries = [n.strip() for n in args.libraries.split(",") if n.strip()]
    unknown = [n for n in libraries if n not in LIBRARIES]
    if unknown:
        p.error(f"--libraries: unknown {', '.join(unknown)}; choose from {', '.join(LIBRARIES)}")
    torch.set_num_threads(args.num_threads)
    t0 = time.time()
    tokenizer = load_tokenizer(resolve_model(BUNDLED_TARGET))
    vocab_size = len(tokenizer)
    lines = [json.loads(line) for line in SCHEMAS.read_text().splitlines() if line.strip()][: args.num_schemas]
    ids, schemas = [d["id"] for d in lines], [d["schema"] for d in lines]
    sequences = token_sequences(tokenizer, schemas)
    result = {"platform": platform.platform(), "processor": platform.processor(), "python": platform.python_version(),
              "torch": torch.__version__, "transformers": version("transformers"),
              "versions": {n: version(DISTRIBUTIONS[n]) for n in LIBRARIES},
              "num_threads": args.num_threads, "torch_threads": torch.get_num_threads(),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "tokenizer": BUNDLED_TARGET,
              "vocab_size": vocab_size, "eos": tokenizer.eos_token_id, "num_schemas": len(schemas),
              "repeats": args.repeats, "rollback_tokens": ROLLBACK,
              "sequence_tokens": {"mean": float(np.mean([len(s) for s in sequences])),
                                  "min": min(map(len, sequences)), "max": max(map(len, sequences))},
              "rows": [], "per_schema": {}}
    # llguidance first: its masks are the reference the others are compared with
    reference: dict | None = {} if "llguidance" in libraries and version("llguidance") else None
    for name in sorted(libraries, key=LIBRARIES.index):
        row, details = measure(name, tokenizer, vocab_size, schemas, ids, sequences, args.repeats,
                               args.num_threads, reference)
        result["rows"].append(row)
        result["per_schema"][name] = details
        print(format_table([row]).splitlines()[-1], flush=True)
    result["wall_s"] = time.time() - t0
    print(format_table(result["rows"]))
    for row in result["rows"]:
        for key in ("compile_errors", "mismatches", "rollback_errors"):
            for sid, why in (row.get(key) or {}).items():
                print(f"{row['library']} {key[:-1].replace('_', ' ')} {sid}: {why}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
