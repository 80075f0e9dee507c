"""Distil and ship minispec's own draft for the bundled target: ``python -m minispec.train``.

Speculation pays only when the draft agrees with the target (Leviathan et al. 2023, section 3.5),
and SmolLM2-135M is the smallest of its family, so minispec distils its own draft:
1. generate: the target answers the prompt files of data/train_prompts (greedy, and sampled) with
   minispec's engine; the top-k next-token log-probabilities of every decode step and the final
   hidden state of every token are cached in work-dir/data-NAME/gen/ (a rerun skips what is done).
2. train: ``--kind eagle`` (default) trains an EAGLE head, one decoder layer that reads the
   target's hidden states (Li et al. 2024; minispec.models.eagle, train/distill_eagle.py);
   ``--kind layers`` a standalone draft of copied target layers (train/distill.py). Both learn
   the target's next-token distribution (soft cross-entropy, i.e. KL up to a constant) plus a CE on
   its greedy token; the input embedding and LM head stay the target's own, frozen.
3. export: only the draft's own weights and vocabulary map go to data/draft/ (train/ship.py); the
   frozen parts are rebuilt from the target at load time (minispec.models.draft.load_draft).
The LM head covers the most frequent target tokens only (FR-Spec, Zhao et al. 2025); tokens outside
it get zero draft probability, so verification stays exact (core/drafters.py).
Invariant: a shipped draft loads only against the target it was distilled from (an embedding
fingerprint is checked). Taught in notebooks/04_speculative_decoding.ipynb; the shipped draft is
described in data/draft/MODEL_CARD.md.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

from minispec.core.support.stops import eos_ids
from minispec.models.draft import (build_draft, describe_mismatch, own_state, read_shipped_draft,
                                   weight_mismatch)
from minispec.models.llama import LlamaModel, ModelConfig
from minispec.models.loader import load_model
from minispec.models.eagle import build_eagle, check_feature_layers
from minispec.train.distill import choose_vocab, generate_data, own_parameters, train
from minispec.train.distill_eagle import (add_features, eagle_batch, eagle_loss, evaluate_eagle,
                                          expected_accepted)
from minispec.train.sharegpt import first_turn_prompts, load_or_label, read_conversations, split_conversations
from minispec.train.sharegpt import teacher_forced_records
from minispec.train.ship import export_draft
from minispec.tools.workload import load_prompts

REPO = Path(__file__).resolve().parents[2]
COMMAND = "python -m minispec.train"


# -- command line ---------------------------------------------------------------------------------
def tiny_target(seed: int = 0) -> LlamaModel:
    """The tiny random target of ``--tiny`` (CI): 4 layers, width 64, 512 tokens."""
    return LlamaModel.random(ModelConfig.tiny(512, num_layers=4), seed=seed).eval().requires_grad_(False)


def parse_source(spec: str, default_sampled: int,
                 default_temperature: float) -> tuple[str, int | None, float]:
    """"PATH[:NUM_SAMPLED[:TEMPERATURE]]" -> (path, prompts answered again with sampling (None: all),
    temperature). Raises: ValueError for a malformed entry."""
    path, *rest = spec.split(":")
    try:
        sampled = None if rest and rest[0] == "all" else int(rest[0]) if rest else default_sampled
        temperature = float(rest[1]) if len(rest) > 1 else default_temperature
    except ValueError:
        raise ValueError(f"--prompts entry {spec!r}: expected PATH[:NUM_SAMPLED|all[:TEMPERATURE]]") from None
    return path, sampled, temperature


def load_target(args):
    """(target, tokenizer, hf_config, sources): the real target and its prompt sources [(name, prompts,
    num_sampled, temperature)], or with --tiny a tiny random target and one source of random
    token-id prompts (CI: seconds, no model files)."""
    if args.tiny:
        target = tiny_target(args.seed)
        g = torch.Generator().manual_seed(args.seed)
        prompts = [torch.randint(3, target.cfg.vocab_size, (int(torch.randint(4, 12, (1,), generator=g)),),
                                 generator=g).tolist() for _ in range(12)]
        return target, None, None, [("tiny", prompts, args.num_sampled, args.temperature)]
    target, tokenizer, hf_config = load_model(args.target, torch.device("cpu"), torch.float32)
    sources = []
    for spec in args.prompts:
        path, sampled, temperature = parse_source(spec, args.num_sampled, args.temperature)
        prompts = load_prompts(path)
        sources.append((Path(path).stem, prompts, len(prompts) if sampled is None else sampled, temperature))
    return target, tokenizer, hf_config, sources


# defaults for the real run, then for --tiny
DEFAULTS = {"max_tokens": (128, 8), "num_sampled": (160, 4), "layers": ("0,1,2", "0,3"),
            "vocab_size": (8192, 128), "steps": (1100, 4), "batch_tokens": (1024, 64), "ckpt_every": (50, 2)}
PROMPTS = [str(REPO / "data" / "train_prompts" / "train.jsonl"),
           str(REPO / "data" / "train_prompts" / "train_extra.jsonl") + ":all:0.8",
           str(REPO / "data" / "train_prompts" / "train_more.jsonl") + ":all:0.8"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n")[0])
    p.add_argument("--target", default="smollm2-135m-instruct", help="target alias or directory")
    p.add_argument("--prompts", nargs="*", default=PROMPTS,
                   help="prompt files, each PATH[:NUM_SAMPLED|all[:TEMPERATURE]] (default: the three files "
                        "in data/train_prompts; all of the second and third answered again at temperature "
                        "0.8); give --prompts with no file to train on ShareGPT only")
    p.add_argument("--sharegpt", type=int, default=0,
                   help="(a) label the first exchange of this many ShareGPT conversations by teacher forcing "
                        "(needs requirements-train.txt; train/sharegpt.py)")
    p.add_argument("--sharegpt-answered", type=int, default=0,
                   help="(b) the target's greedy answers to this many more ShareGPT first turns (blocks of "
                        "700 taken backwards from the end of the training range)")
    p.add_argument("--sharegpt-validation", type=int, default=400,
                   help="the file's last conversations, held out; the target answers the first 96 of them "
                        "and those answers are the ShareGPT validation records")
    p.add_argument("--max-len", type=int, default=384,
                   help="teacher-forced sequence length cap (prompt <= 256)")
    p.add_argument("--kind", default="eagle", choices=["eagle", "layers"],
                   help="eagle: one layer reading the target's hidden states (Li et al. 2024); layers: a "
                        "standalone draft of copied target layers")
    p.add_argument("--init-layer", type=int, help="target layer the EAGLE head starts from (the last)")
    p.add_argument("--init-from",
                   help="--kind eagle: start from the own weights (fc, layer, norm) of this shipped head "
                        "folder instead of a copy of a target layer; the vocabulary is chosen anew unless "
                        "--keep-vocab")
    p.add_argument("--keep-vocab", action="store_true",
                   help="with --init-from: keep that head's draft vocabulary instead of choosing one from "
                        "this run's records (a short continuation would otherwise pick a smaller "
                        "vocabulary's worth of data)")
    p.add_argument("--unroll", type=int, default=3, help="EAGLE training-time-test steps")
    p.add_argument("--feature-layers", default="",
                   help="--kind eagle: target layers (comma-separated ids, increasing, below the last) the "
                        "head reads besides the final hidden state, projected by a learned fc3 (EAGLE-3, Li "
                        "et al. 2025); empty: the final hidden state only (EAGLE)")
    p.add_argument("--reg-weight", type=float, default=0.5,
                   help="weight of the Smooth-L1 pull of the first predicted feature toward the target's "
                        "(EAGLE, Li et al. 2024, section 3.2; EAGLE-3 drops it: 0)")
    p.add_argument("--work-dir", default=str(REPO / "runs" / "draft"),
                   help="cache and checkpoints (git-ignored)")
    p.add_argument("--out", default=str(REPO / "data" / "draft"), help="where the shipped draft is written")
    p.add_argument("--stage", default="all", choices=["generate", "all"],
                   help="stop after generating data, or not")
    p.add_argument("--max-tokens", type=int, help="target completion length (128)")
    p.add_argument("--num-sampled", type=int, help="prompts answered again with sampling (160)")
    p.add_argument("--temperature", type=float, default=0.7, help="for the sampled answers")
    p.add_argument("--layers", help="--kind layers: target layers the draft starts from (0,1,2)")
    p.add_argument("--vocab-size", type=int, help="draft LM-head size, most frequent tokens (8192)")
    p.add_argument("--steps", type=int, help="optimizer steps (1100)")
    p.add_argument("--batch-tokens", type=int, help="padded tokens per batch (1024)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (AdamW)")
    p.add_argument("--ce-weight", type=float, default=1.0,
                   help="weight of the CE on the target's greedy token")
    p.add_argument("--ckpt-every", type=int, help="steps between checkpoints and validations (50)")
    p.add_argument("--max-minutes", type=float, default=88.0,
                   help="stop training (keeping the best checkpoint) once this run, labelling included, has "
                        "taken this long; a run whose labelling used it all stops before training with "
                        "status 2 (the labels are cached: rerun to train)")
    p.add_argument("--resume", action="store_true", help="continue from work-dir/ckpt.pt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-threads", type=int, default=1,
                   help="torch threads; 1 is fastest on a shared 2-core machine (2 threads stall)")
    p.add_argument("--tiny", action="store_true", help="tiny random target, a few steps (CI)")
    args = p.parse_args(argv)
    for name, (real, tiny) in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, tiny if args.tiny else real)
    if args.tiny:
        args.target = "tiny-random"
    try:
        args.feature_layers = tuple(int(x) for x in args.feature_layers.split(",") if x.strip())
    except ValueError:
        p.error(f"--feature-layers {args.feature_layers!r}: expected comma-separated layer ids, e.g. 2,15")
    if args.feature_layers and args.kind != "eagle":
        p.error("--feature-layers needs --kind eagle")
    if args.keep_vocab and not args.init_from:
        p.error("--keep-vocab needs --init-from (the head whose vocabulary is kept)")
    return args



# -- the steps of a run ---------------------------------------------------------------------------
def generate_records(target, tokenizer, hf_config, sources, args, work: Path) -> list[dict]:
    """Step 1: the target's answers to every source's prompts (generate_data records), in source order."""
    records = []
    for name, prompts, num_sampled, temperature in sources:
        records += generate_data(target, tokenizer, hf_config, prompts, work / f"data-{name}",
                                 args.max_tokens, num_sampled, temperature, args.seed,
                                 capture_layers=args.feature_layers)
    return records


def answered_blocks(train_idx: list[int], count: int, block: int = 700) -> list[list[int]]:
    """The last ``count`` entries of ``train_idx`` in blocks of ``block``, going backwards from the
    end (the last block may be shorter): a larger count keeps every full block of a smaller one, so
    their cached answers are reused."""
    end = len(train_idx)
    count = min(count, end)
    return [train_idx[max(stop - block, end - count): stop] for stop in range(end, end - count, -block)]


def sharegpt_records(target, tokenizer, hf_config, args, work: Path) -> tuple[list[dict], list[dict]]:
    """(training, validation) records from ShareGPT (train/sharegpt.py): ``--sharegpt`` teacher-forced
    conversations (a), then the target's greedy answers to ``--sharegpt-answered`` further first
    turns (b); validation: the target's answers to 96 held-out first turns. With --tiny, random
    token sequences stand in for (a) and nothing else is read."""
    if args.tiny:
        g = torch.Generator().manual_seed(args.seed + 1)
        pairs = [(torch.randint(3, target.cfg.vocab_size, (5,), generator=g).tolist(),
                  torch.randint(3, target.cfg.vocab_size, (7,), generator=g).tolist())
                 for _ in range(args.sharegpt)]
        return teacher_forced_records(target, pairs, 256, capture=args.feature_layers), []
    found = read_conversations()
    print(f"ShareGPT: {len(found.conversations)} conversations read, {found.skipped} skipped (wrong shape), "
          f"file {'truncated: broken tail dropped' if found.truncated else 'complete'}")
    train_idx, val_idx = split_conversations(found, args.sharegpt_validation)
    records = load_or_label(target, tokenizer, found, train_idx[: args.sharegpt], work / "sharegpt-tf",
                            max_prompt=256, max_len=args.max_len,
                            capture=args.feature_layers) if args.sharegpt else []
    # (b) takes conversations from the end of the training range, in blocks of 700 going backwards,
    # (a) from its start in shards of 500: the two never overlap, and a larger count reuses every
    # finished block or shard of either
    for answered in answered_blocks(train_idx, args.sharegpt_answered):
        prompts = first_turn_prompts(found, answered, tokenizer, max_prompt=240)
        records += generate_data(target, tokenizer, hf_config, prompts,
                                 work / f"data-sharegpt-{answered[0]}-{len(answered)}",
                                 args.max_tokens, 0, args.temperature, args.seed,
                                 capture_layers=args.feature_layers)
    val_prompts = first_turn_prompts(found, val_idx, tokenizer, max_prompt=240)[:96]
    val = generate_data(target, tokenizer, hf_config, val_prompts, work / f"data-sharegpt-val-{val_idx[0]}",
                        args.max_tokens, 0, args.temperature, args.seed, capture_layers=args.feature_layers)
    return records, val


def draft_vocab(records: list[dict], target: LlamaModel,
                size: int, always) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft vocabulary: vocab_map [V_draft] (draft id -> target id) and its inverse to_draft
    [V_target] (target id -> draft id, -1 outside the draft vocabulary), both long."""
    vocab_map = choose_vocab(records, target.cfg.vocab_size, size, always)
    return vocab_map, target_to_draft(vocab_map, target.cfg.vocab_size)


def target_to_draft(vocab_map: torch.Tensor, target_vocab_size: int) -> torch.Tensor:
    """The inverse of vocab_map [V_draft]: [V_target] long, target id -> draft id, -1 outside."""
    to_draft = torch.full((target_vocab_size,), -1, dtype=torch.long)
    to_draft[vocab_map] = torch.arange(len(vocab_map))
    return to_draft


def vocab_coverage(train_recs: list[dict], val_recs: list[dict], target_vocab_size: int,
                   sizes=(2048, 4096, 8192, 16384, 32768)) -> dict[str, float]:
    """FR-Spec's trade-off, measured: for each draft vocabulary size, the share of the target's
    greedy tokens in held-out answers that a vocabulary chosen from the training records contains
    (a token outside it can never be drafted). Returns {str(size): share in [0, 1]}."""
    ids = (torch.cat([torch.tensor(r["output_ids"]) for r in val_recs]) if val_recs
           else torch.zeros(0, dtype=torch.long))
    out = {}
    for size in sizes:
        if size > target_vocab_size or not len(ids):
            continue
        inside = torch.zeros(target_vocab_size, dtype=torch.bool)
        inside[choose_vocab(train_recs, target_vocab_size, size)] = True
        out[str(size)] = round(float(inside[ids].float().mean()), 4)
    return out


def split_validation(records: list[dict], seed: int) -> tuple[list[dict], list[dict]]:
    """(training records, validation records). Validation holds out whole prompts, 1 in 25, with all
    their answers (greedy and sampled): the draft is scored on prompts it never trained on."""
    prompts = sorted({tuple(r["prompt_ids"]) for r in records})
    random.Random(seed).shuffle(prompts)
    held_out = set(prompts[: max(1, len(prompts) // 25)])
    val_recs = [r for r in records if tuple(r["prompt_ids"]) in held_out]
    train_recs = [r for r in records if tuple(r["prompt_ids"]) not in held_out]
    return train_recs, val_recs


def draft_init_layer(target: LlamaModel, init_layer: int | None) -> int:
    """The target layer an EAGLE head starts from: ``init_layer``, else the last."""
    return target.cfg.num_layers - 1 if init_layer is None else init_layer


def warm_start(head, target: LlamaModel, path: Path) -> dict:
    """Load the own weights of the shipped EAGLE head in ``path`` into ``head`` (fc, the layer, the
    output norm: none depends on the draft vocabulary, so a head with another vocab_map starts from
    them). A multi-layer head may start from a last-state head: its fc3 keeps its [0; ...; 0; I]
    start, so it first computes what the source head computes. Returns {"init_from": the source's
    training command} for draft_config.json.
    Raises: ValueError when ``path`` holds no EAGLE head for ``target`` or its shapes differ."""
    config, tensors, _ = read_shipped_draft(path, target)
    if config.get("kind") != "eagle":
        raise ValueError(f"--init-from {path}: kind {config.get('kind')!r}, expected an EAGLE head ('eagle')")
    mismatch = weight_mismatch(own_state(head), tensors)
    if mismatch.get("missing") == ["fc3"]:
        del mismatch["missing"]  # a last-state source for a multi-layer head: fc3 keeps its start
    if mismatch:
        raise ValueError(f"--init-from {path}: weights do not fit this head: {describe_mismatch(mismatch)}")
    head.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=False)
    return {"init_from": config.get("training", {}).get("command", str(path))}


def build_trainee(args, target: LlamaModel, records: list[dict], vocab_map: torch.Tensor,
                  to_draft: torch.Tensor, work: Path):
    """Step 2's draft, its own parameters set to train: (draft, init metadata for draft_config.json,
    loss_fn, eval_fn); loss_fn and eval_fn are None for a layer draft (distill.train's defaults)."""
    if args.kind == "eagle":
        layers = "".join(f"-L{i}" for i in args.feature_layers)
        add_features(target, records, work / f"features-{len(records)}{layers}.pt",
                     capture=args.feature_layers)
        draft = build_eagle(target, vocab_map, args.init_layer, args.feature_layers)
        init = {"init_layer": draft_init_layer(target, args.init_layer),
                "feature_layers": list(args.feature_layers)}
        if args.init_from:
            init |= warm_start(draft, target, Path(args.init_from))

        def loss_fn(model, recs, idx):
            loss, agree = eagle_loss(model, eagle_batch(recs, idx, to_draft), args.ce_weight, args.unroll,
                                     args.reg_weight)
            return loss, agree[0]

        def eval_fn(model, recs):  # expected accepted draft tokens at k = 4, from per-step agreement
            return expected_accepted(evaluate_eagle(model, recs, to_draft, args.batch_tokens, args.unroll), 4)
    else:
        layer_ids = [int(x) for x in args.layers.split(",")]
        draft = build_draft(target, layer_ids, vocab_map)
        init = {"init_layers": layer_ids}
        loss_fn = eval_fn = None
    for p in own_parameters(draft):
        p.requires_grad_(True)
    return draft, init, loss_fn, eval_fn


def answer_tokens(records: list[dict]) -> int:
    """Target answer tokens in these records (their ``output_ids``)."""
    return sum(len(r["output_ids"]) for r in records)


def training_summary(args, argv, draft, records: list[dict], train_recs: list[dict], val_recs: list[dict],
                     to_draft: torch.Tensor, result: dict, generate_s: float) -> dict:
    """The ``training`` entry of draft_config.json: the command, the data, and the validation scores."""
    num_target_tokens = answer_tokens(records)
    covered = sum(int((to_draft[torch.tensor(r["output_ids"])] >= 0).sum()) for r in records)
    training = {"command": f"{COMMAND} " + " ".join(argv if argv is not None else sys.argv[1:]),
                "num_sequences": len(records), "num_target_tokens": num_target_tokens,  # validation included
                "num_training_sequences": len(train_recs), "num_training_tokens": answer_tokens(train_recs),
                "vocab_coverage_of_target_tokens": covered / num_target_tokens, "steps": result["steps"],
                "best_step": result["step"], "generate_s": round(generate_s),
                "train_s": round(result["train_s"]), "seed": args.seed}
    training["val_greedy_coverage_by_vocab_size"] = vocab_coverage(train_recs, val_recs, to_draft.numel())
    if args.kind == "eagle":
        agree = evaluate_eagle(draft, val_recs, to_draft, args.batch_tokens, args.unroll)
        training |= {"val_agreement_by_step": agree, "val_expected_accepted_k4": result["val_agreement"]}
    else:
        training["val_top1_agreement"] = result["val_agreement"]
    return training


def main(argv=None) -> int:
    """Run the command (generate, train, export); returns the exit status."""
    args = parse_args(argv)
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    start = time.time()
    args.deadline = start + 60 * args.max_minutes
    work = Path(args.work_dir)
    target, tokenizer, hf_config, sources = load_target(args)
    try:
        check_feature_layers(target.cfg, args.feature_layers)  # before hours of labelling, not after
    except ValueError as e:
        print(f"--feature-layers: {e}", file=sys.stderr)
        return 2
    records = generate_records(target, tokenizer, hf_config, sources, args, work)
    print(f"{len(records)} sequences, {answer_tokens(records)} target tokens, {time.time() - start:.0f} s")
    train_recs, val_recs = split_validation(records, args.seed) if records else ([], [])
    if args.sharegpt or args.sharegpt_answered:
        sg_train, sg_val = sharegpt_records(target, tokenizer, hf_config, args, work)
        train_recs, val_recs = train_recs + sg_train, val_recs + sg_val
        records = records + sg_train + sg_val
        print(f"with ShareGPT: {len(train_recs)} training sequences ({answer_tokens(train_recs)} answer "
              f"tokens), {len(val_recs)} validation sequences ({answer_tokens(val_recs)} answer tokens)")
    if args.stage == "generate":
        return 0
    if time.time() >= args.deadline:  # training would stop after one step and export an untrained head
        print(f"--max-minutes {args.max_minutes:g} was used up before training began "
              f"({(time.time() - start) / 60:.1f} min of labelling and loading); the labels are cached in "
              f"{work}: rerun the same command to train, or give a larger --max-minutes", file=sys.stderr)
        return 2
    generate_s = time.time() - start
    # the vocabulary comes from the training records only: validation answers stay unseen
    if args.keep_vocab:
        vocab_map = read_shipped_draft(Path(args.init_from), target)[2]
        to_draft = target_to_draft(vocab_map, target.cfg.vocab_size)
    else:
        vocab_map, to_draft = draft_vocab(train_recs, target, args.vocab_size, eos_ids(tokenizer, hf_config))
    draft, init, loss_fn, eval_fn = build_trainee(args, target, records, vocab_map, to_draft, work)
    result = train(draft, train_recs, val_recs, to_draft, args, work, loss_fn, eval_fn)
    draft.load_state_dict(result["state"], strict=False)
    training = training_summary(args, argv, draft, records, train_recs, val_recs,
                                to_draft, result, generate_s)
    export_draft(draft, vocab_map, target, Path(args.out),
                 {"target": args.target, "kind": args.kind, **init, "training": training})
    print(f"wrote {args.out}: best step {result['step']}, validation score {result['val_agreement']:.3f}, "
          f"total {time.time() - start:.0f} s")
    return 0

