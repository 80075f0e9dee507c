"""minispec's distilled draft: the shipped files load by alias, a vocabulary-subset draft keeps
speculation exact (greedy token for token; sampled within the chi-square tolerance of
tests/test_spec_exactness.py, false-failure odds 1e-4 per test), and the training script runs.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.build import build_engine
from minispec.models.draft import build_draft, load_draft, load_shipped_draft, to_target_vocab
from minispec.models.llama import LlamaModel
from minispec.models.loader import resolve_model
from minispec.core.request import SamplingParams
from minispec.core.sampling import logits_to_probs
from minispec.core.verify import verify_sampled
from minispec.models.eagle import EagleDraft, build_eagle
from minispec.train.command import tiny_target
from minispec.train.ship import export_draft

from conftest import tiny_config
from test_spec_exactness import P_FAIL, chi2_pvalue, exact_joint, run

# results depend on the kernels the engine runs: the fast-kernel pass of `make test` runs these (-m kernels)
pytestmark = pytest.mark.kernels

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "data" / "draft"


def test_shipped_files_are_small_and_documented():
    assert resolve_model("smollm2-135m-draft").path == str(SHIPPED)
    assert (SHIPPED / "model.safetensors").stat().st_size <= 25 * 2**20
    config = json.loads((SHIPPED / "draft_config.json").read_text())
    assert config["model_config"]["vocab_size"] < config["target_vocab_size"]
    assert "python -m minispec.train " in (SHIPPED / "MODEL_CARD.md").read_text()


def test_shipped_draft_loads_by_alias(bundled):
    target, tokenizer = bundled[0], bundled[1]
    draft, draft_tokenizer, vocab_map = load_draft("smollm2-135m-draft", target, torch.device("cpu"), torch.float32)
    assert isinstance(draft, LlamaModel) and draft_tokenizer is None
    assert draft.cfg.num_layers < target.cfg.num_layers
    assert vocab_map.shape == (draft.cfg.vocab_size,) and len(set(vocab_map.tolist())) == draft.cfg.vocab_size
    assert 0 <= int(vocab_map.min()) and int(vocab_map.max()) < target.cfg.vocab_size
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in set(vocab_map.tolist())
    # the frozen parts are the target's own: embedding rows for every target id, LM-head columns of the subset
    assert draft.embed_tokens.shape == target.embed_tokens.shape
    assert torch.equal(draft.lm_head, target.lm_head[:, vocab_map])


def test_shipped_draft_refuses_another_target():
    other = LlamaModel.random(tiny_config(), seed=0)
    with pytest.raises(ValueError, match="does not fit this target"):
        load_shipped_draft(SHIPPED, other, torch.device("cpu"), torch.float32)


def _keep_only_vocab_map(folder):
    from safetensors.torch import load_file, save_file
    save_file({"vocab_map": load_file(str(folder / "model.safetensors"))["vocab_map"]}, str(folder / "model.safetensors"))


def _rename_weights(folder):
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({k if k == "vocab_map" else f"x.{k}": v for k, v in tensors.items()}, str(folder / "model.safetensors"))


def _cut_weights(folder):
    raw = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(raw[: len(raw) // 3])


@pytest.mark.parametrize("damage, message", [
    # each loaded silently (an untrained head, acceptance 0) or raised a traceback before the checks
    (_keep_only_vocab_map, r"model.safetensors does not match .*missing \['fc"),
    (_rename_weights, r"missing .*; unexpected \['x\."),
    (_cut_weights, r"model.safetensors is not a readable safetensors file"),
    (lambda f: (f / "model.safetensors").write_bytes(b""), r"not a readable safetensors file"),
    (lambda f: (f / "model.safetensors").unlink(), r"model.safetensors is missing"),
    (lambda f: (f / "draft_config.json").write_text("{}"), r"draft_config.json lacks target_vocab_size"),
    (lambda f: (f / "draft_config.json").write_text(""), r"draft_config.json is not valid JSON"),
])
def test_damaged_draft_files_are_refused_naming_the_file(tmp_path, damage, message):
    target = tiny_target(0)
    export_draft(build_eagle(target, torch.arange(0, 128)), torch.arange(0, 128), target, tmp_path / "head",
                 {"kind": "eagle", "init_layer": 3})
    load_shipped_draft(tmp_path / "head", target, torch.device("cpu"), torch.float32)  # intact: loads
    damage(tmp_path / "head")
    with pytest.raises(ValueError, match=message):
        load_shipped_draft(tmp_path / "head", target, torch.device("cpu"), torch.float32)


def test_a_folder_with_no_model_is_refused_as_a_draft(tmp_path):
    with pytest.raises(ValueError, match="holds neither a minispec draft .* nor a Hugging Face model"):
        load_draft(str(tmp_path), tiny_target(0), torch.device("cpu"), torch.float32)


def test_greedy_with_shipped_draft_equals_plain_and_accepts(bundled):
    """--spec draft with no --draft picks the shipped draft for the bundled target."""
    target, tokenizer, hf_config = bundled
    prompts = [[{"role": "user", "content": "Name three animals that live in the Arctic."}],
               [{"role": "user", "content": "How do I make a paper boat?"}]]
    params = SamplingParams(max_tokens=24, temperature=0.0)
    outs = {}
    for method in ("off", "draft"):
        config = EngineConfig(device="cpu", dtype="float32", num_kv_blocks=64, max_model_len=256,
                              spec=SpecConfig(method=method, num_speculative_tokens=4))
        engine = build_engine(config, model=target, tokenizer=tokenizer, hf_config=hf_config)
        ids = [engine.add_request(p, params) for p in prompts]
        engine.run_until_done()
        outs[method] = [engine.requests[i].output_token_ids for i in ids]
        if method == "draft":
            reqs = [engine.requests[i] for i in ids]
            rate = sum(r.num_draft_accepted for r in reqs) / sum(r.num_draft_proposed for r in reqs)
            assert rate > 0.1, f"shipped draft acceptance rate {rate:.2f}: an untrained cut of the target gets ~0.02"
    assert outs["draft"] == outs["off"]


def test_shipped_draft_rejection_sampling_keeps_target_distribution(bundled):
    """The shipped draft's real proposal law (zero outside its vocabulary) through verify_sampled:
    the first emitted token follows the real target's law (chi-square, tolerance P_FAIL)."""
    target, tokenizer = bundled[0], bundled[1]
    draft, _, vocab_map = load_draft("smollm2-135m-draft", target, torch.device("cpu"), torch.float32)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Describe a quiet morning by a lake."}],
                                        add_generation_prompt=True)
    ids = torch.tensor([list(ids["input_ids"] if hasattr(ids, "keys") else ids)])
    params = SamplingParams(temperature=1.3, top_k=50)
    with torch.no_grad():
        target_probs = logits_to_probs(target.forward_dense(ids)[0, -1:], params).repeat(2, 1)   # [2, V]
        if isinstance(draft, EagleDraft):  # the head drafts x_n from (f_{n-2}, x_{n-1}), f with its target layers
            features = target.hidden_dense(ids, draft.feature_layers)[:, :-1]
            draft_logits = draft.forward_dense(ids[:, 1:], features)[0, -1:]
        else:
            draft_logits = draft.forward_dense(ids)[0, -1:]
        draft_probs = logits_to_probs(to_target_vocab(draft_logits, target.cfg.vocab_size, vocab_map), params)
    outside = torch.ones(target.cfg.vocab_size, dtype=torch.bool)
    outside[vocab_map] = False
    assert float(draft_probs[0, outside].sum()) == 0.0
    # verify_sampled's work grows with the vocabulary, so the 20,000 draws run on the tokens either law
    # gives mass plus 2,000 others with none in both (any draw of those fails the support check): the
    # same two laws, 49,152 -> about 2,100 entries, so the loop takes seconds, not a minute
    either = (target_probs[0] > 0) | (draft_probs[0] > 0)
    g = torch.Generator().manual_seed(0)
    neither = torch.nonzero(~either).flatten()
    keep = torch.cat([torch.nonzero(either).flatten(), neither[torch.randperm(len(neither), generator=g)[:2000]]])
    draft_probs, target_probs = draft_probs[:, keep], target_probs[:, keep]
    counts = torch.zeros(len(keep), dtype=torch.float64)
    n, accepted = 20000, 0
    for _ in range(n):
        proposal = int(torch.multinomial(draft_probs[0], 1, generator=g))
        emitted, num_accepted = verify_sampled([proposal], draft_probs, target_probs, g)
        counts[emitted[0]] += 1
        accepted += num_accepted
    assert 0.05 * n < accepted < 0.95 * n
    support = target_probs[0] > 0
    assert float(counts[~support].sum()) == 0.0
    assert chi2_pvalue(counts[support], target_probs[0, support].double() * n) > P_FAIL


TARGET = LlamaModel.random(tiny_config(), seed=0)
EVEN_IDS = torch.arange(0, TARGET.cfg.vocab_size, 2)  # a draft vocabulary of half the target's tokens


def subset_draft(vocab_map: torch.Tensor) -> tuple:
    """A 1-layer draft built from TARGET with an LM head over ``vocab_map`` only."""
    return build_draft(TARGET, [0], vocab_map), None, vocab_map


def test_vocab_subset_greedy_equals_plain():
    prompts = [[1, 2, 3], [7, 7, 7, 7, 9], list(range(20, 40))]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    plain, _, _ = run(TARGET, prompts, params)
    for k in (1, 3, 5):
        fast, engine, ids = run(TARGET, prompts, params, SpecConfig(method="draft", num_speculative_tokens=k),
                                subset_draft(EVEN_IDS))
        assert fast == plain
        assert sum(engine.requests[i].num_draft_proposed for i in ids) > 0


def test_vocab_subset_sampling_keeps_distribution():
    """Output tokens (1, 2) against the target's exact joint law; token 2 comes from a verify step
    whose draft cannot propose odd token ids at all, so the residual must supply them."""
    n, prompt = 3000, [1, 2, 3, 4]
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=6, seed=s, ignore_eos=True) for s in range(n)]
    sched = dict(num_kv_blocks=2 * n + 8, max_model_len=8, max_num_seqs=n, max_num_batched_tokens=8 * n)
    spec = SpecConfig(method="draft", num_speculative_tokens=1)
    outs, engine, ids = run(TARGET, [prompt] * n, params, spec, subset_draft(EVEN_IDS), **sched)
    accepted = sum(engine.requests[i].num_draft_accepted for i in ids)
    assert 0.05 * n < accepted < 0.95 * n  # both acceptance and rejection paths ran
    assert all(o[1] % 2 == 0 for o, i in zip(outs, ids) if engine.requests[i].num_draft_accepted)
    joint = exact_joint(TARGET, prompt, params[0])
    cells = sorted(joint)
    observed = torch.tensor([sum(tuple(o[:2]) == c for o in outs) for c in cells], dtype=torch.float64)
    assert observed.sum() == n
    assert any(c[1] % 2 for c in cells)  # odd tokens are in the target's support
    expected = torch.tensor([joint[c] for c in cells], dtype=torch.float64) * n
    assert chi2_pvalue(observed, expected) > P_FAIL


@pytest.mark.parametrize("kind", ["eagle", "eagle-multi-layer", "layers"])
def test_train_command_runs_and_resumes_on_tiny_target(tmp_path, kind):
    extra = ["--feature-layers", "0,2", "--sharegpt", "4"] if kind == "eagle-multi-layer" else []
    kind, multi = kind.removesuffix("-multi-layer"), bool(extra)
    cmd = [sys.executable, "-m", "minispec.train", "--tiny", "--kind", kind, "--work-dir", str(tmp_path / "work"),
           "--out", str(tmp_path / "draft"), *extra, "--steps", "2"]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert (tmp_path / "work" / "ckpt.pt").exists()
    resumed = subprocess.run(cmd[:-1] + ["4", "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    log = resumed.stdout + resumed.stderr
    assert "step 2: validation" in log and "step 4: validation" in log
    config = json.loads((tmp_path / "draft" / "draft_config.json").read_text())
    assert config["training"]["steps"] == 4
    # the exported draft loads against the same tiny target and speculates exactly
    target = tiny_target(0)
    draft = load_shipped_draft(tmp_path / "draft", target, torch.device("cpu"), torch.float32)
    assert draft[0].cfg.vocab_size == 128 and draft[0].cfg.num_layers == (1 if kind == "eagle" else 2)
    assert isinstance(draft[0], EagleDraft) == (kind == "eagle")
    if kind == "eagle":
        assert config["feature_layers"] == ([0, 2] if multi else [])
        assert draft[0].feature_layers == ((0, 2) if multi else ()) and hasattr(draft[0], "fc3") == multi
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outs = {}
    for method in ("off", "draft"):
        config = EngineConfig(model="tiny", device="cpu", num_kv_blocks=64, block_size=4, max_model_len=128,
                              scheduler=SchedulerConfig(64), spec=SpecConfig(method=method, num_speculative_tokens=3))
        engine = build_engine(config, model=target, draft=draft if method == "draft" else None)
        ids = [engine.add_request(p, params) for p in ([5, 6, 7], [100, 3, 9, 200])]
        engine.run_until_done()
        outs[method] = [engine.requests[i].output_token_ids for i in ids]
    assert outs["draft"] == outs["off"]


def test_train_command_refuses_to_train_when_labelling_used_the_time_budget(tmp_path):
    """--max-minutes counts the whole run: when labelling used it all, the command used to train one
    step and export that head as if it were trained (it happened to a 47-minute labelling run with
    --max-minutes 28). Now it stops before training, says why, and exports nothing; the labels stay
    cached, so the same command with time left trains."""
    cmd = [sys.executable, "-m", "minispec.train", "--tiny", "--work-dir", str(tmp_path / "work"),
           "--out", str(tmp_path / "draft"), "--steps", "2", "--max-minutes", "0"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "--max-minutes 0 was used up before training began" in run.stderr and "rerun" in run.stderr
    assert not (tmp_path / "draft").exists() and not (tmp_path / "work" / "ckpt.pt").exists()
    again = subprocess.run(cmd[:-1] + ["5"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((tmp_path / "draft" / "draft_config.json").read_text())["training"]["steps"] == 2


def test_train_command_continues_a_last_state_head_with_more_layers(tmp_path):
    """``--init-from`` a last-state head with ``--feature-layers``: fc3 starts as [0; I], so step 0
    scores what the source head scores; ``--keep-vocab`` keeps the source's draft vocabulary.
    Bad layer ids stop the run before any labelling, naming them."""
    base = [sys.executable, "-m", "minispec.train", "--tiny", "--sharegpt", "4", "--steps", "2"]
    first = subprocess.run(base + ["--work-dir", str(tmp_path / "w1"), "--out", str(tmp_path / "last")],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    more = subprocess.run(base + ["--work-dir", str(tmp_path / "w2"), "--out", str(tmp_path / "multi"),
                                  "--init-from", str(tmp_path / "last"), "--feature-layers", "1", "--keep-vocab"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert more.returncode == 0, more.stderr[-2000:]
    scores = [json.loads((tmp_path / d / "draft_config.json").read_text())["training"] for d in ("last", "multi")]
    target = tiny_target(0)
    maps = [load_shipped_draft(tmp_path / d, target, torch.device("cpu"), torch.float32)[2] for d in ("last", "multi")]
    assert torch.equal(maps[0], maps[1])
    # the continuation's step 0 is the source head as exported (float16), on the same validation records
    step0 = float(re.search(r"step 0: validation score ([0-9.]+)", more.stdout + more.stderr).group(1))
    assert abs(step0 - scores[0]["val_expected_accepted_k4"]) < 0.01
    bad = subprocess.run(base + ["--work-dir", str(tmp_path / "w3"), "--out", str(tmp_path / "bad"),
                                 "--feature-layers", "3"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "feature layers [3]: must be increasing target layer ids in 0..2" in bad.stderr
    assert not (tmp_path / "w3").exists()
    no_init = subprocess.run(base + ["--keep-vocab"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert no_init.returncode == 2 and "--keep-vocab needs --init-from" in no_init.stderr
