"""The ShareGPT reader (train/sharegpt.py): a truncated file, malformed records, and teacher-forced labels."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minispec.models.eagle import build_eagle
from minispec.train.command import answered_blocks, tiny_target, vocab_coverage, warm_start
from minispec.models.draft import own_state
from minispec.train.distill import TOP_K, own_parameters
from minispec.train.ship import export_draft
from minispec.train.sharegpt import clean_record, read_conversations, split_conversations, teacher_forced_records

ROOT = Path(__file__).resolve().parents[1]


def turn(who, text):
    return {"from": who, "value": text}


GOOD = {"id": "a", "conversations": [turn("human", "hi"), turn("gpt", "hello"), turn("human", "bye"), turn("gpt", "ok")]}


def test_truncated_file_keeps_complete_records_and_drops_the_tail(tmp_path):
    records = [GOOD, {"id": "b", "conversations": [turn("human", "q"), turn("gpt", "a")]}, GOOD]
    text = json.dumps(records, indent=2)
    cut = text.rindex('"hello"')  # inside the third record
    path = tmp_path / "sg.json"
    path.write_text(text[:cut])
    found = read_conversations(path)
    assert found.truncated and found.skipped == 0
    assert found.ids == ["a", "b"]
    assert found.conversations[1] == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    path.write_text(text)  # the whole array: nothing truncated, three records
    assert not read_conversations(path).truncated and len(read_conversations(path).conversations) == 3


def test_malformed_records_are_skipped_and_counted(tmp_path):
    bad = ["text", {"id": "x"}, {"id": "y", "conversations": "no"}, {"id": "z", "conversations": [turn("gpt", "a")]},
           {"id": "w", "conversations": [turn("human", "   "), turn("gpt", "a")]},
           {"id": "v", "conversations": [turn("system", "s"), turn("human", "q")]}]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(bad + [GOOD]))
    found = read_conversations(path)
    assert found.ids == ["a"] and found.skipped == len(bad) and not found.truncated


def test_clean_record_cuts_at_the_first_break_and_skips_an_opening_model_turn():
    rec = {"conversations": [turn("gpt", "intro"), turn("human", "q1"), turn("gpt", "a1"), turn("human", "q2"),
                             turn("human", "q3"), turn("gpt", "a3")]}
    assert [m["content"] for m in clean_record(rec)] == ["q1", "a1"]  # q2 q3 breaks alternation; odd tail dropped
    assert clean_record({"conversations": [turn("human", "q"), {"from": "gpt", "value": 3}]}) is None


def test_not_an_array_is_refused(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text('{"id": 1}')
    try:
        read_conversations(path)
    except ValueError as exc:
        assert "JSON array" in str(exc)
    else:
        raise AssertionError("a JSON object was accepted")


def test_validation_holds_out_whole_conversations_at_the_end(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([GOOD] * 10))
    train, val = split_conversations(read_conversations(path), 3)
    assert train == list(range(7)) and val == [7, 8, 9]


def test_teacher_forced_labels_are_the_targets_own_distribution():
    target = tiny_target(0)
    pairs = [([5, 6, 7], [8, 9, 10, 11]), ([20, 21], [22, 23, 24])]
    recs = teacher_forced_records(target, pairs, batch_tokens=64)
    for (prompt, answer), r in zip(pairs, recs):
        seq = torch.tensor([prompt + answer])
        logits = target.forward_dense(seq)[0]
        want = torch.log_softmax(logits[len(prompt) - 1: len(seq[0]) - 1], -1).topk(TOP_K, dim=-1)
        assert r["topk_ids"].shape == (len(answer), TOP_K)
        assert torch.equal(r["topk_ids"][:, 0].long(), want.indices[:, 0])
        assert torch.allclose(r["topk_logprobs"].float(), want.values, atol=2e-2)
        assert r["features"].shape == (len(prompt) + len(answer), target.cfg.hidden_size)


def test_train_command_with_teacher_forced_records_on_tiny_target(tmp_path):
    cmd = [sys.executable, "-m", "minispec.train", "--tiny", "--sharegpt", "6", "--work-dir", str(tmp_path / "w"),
           "--out", str(tmp_path / "draft"), "--steps", "2"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    config = json.loads((tmp_path / "draft" / "draft_config.json").read_text())
    training = config["training"]
    assert training["num_sequences"] > 12  # the tiny prompts' answers plus 6 teacher-forced
    # the totals include the validation records; the training counts leave them out
    assert 0 < training["num_training_sequences"] < training["num_sequences"]
    assert 0 < training["num_training_tokens"] < training["num_target_tokens"]
    assert f"{training['num_training_sequences']} training sequences ({training['num_training_tokens']} answer tokens)" \
        in run.stdout


def test_answered_blocks_grow_without_changing_the_blocks_already_answered():
    idx = list(range(100, 2100))
    small, large = answered_blocks(idx, 700), answered_blocks(idx, 1500)
    assert small == [list(range(1400, 2100))]
    assert large[0] == small[0] and large[1] == list(range(700, 1400)) and large[2] == list(range(600, 700))
    assert sum(map(len, answered_blocks(idx, 5000))) == len(idx) and answered_blocks(idx, 0) == []


def test_vocab_coverage_counts_held_out_greedy_tokens_inside_the_draft_vocabulary():
    def rec(ids):
        return {"output_ids": ids, "topk_ids": torch.tensor([[i] for i in ids], dtype=torch.int32),
                "topk_logprobs": torch.zeros(len(ids), 1)}
    train = [rec([1, 1, 1, 2, 2, 3])]
    val = [rec([1, 2, 3, 4])]  # 4 never occurs in training: only a vocabulary of all 8 tokens has it
    cover = vocab_coverage(train, val, 8, sizes=(1, 2, 3, 8, 16))
    assert cover == {"1": 0.25, "2": 0.5, "3": 0.75, "8": 1.0}


def test_warm_start_takes_a_shipped_heads_own_weights_under_a_new_vocabulary(tmp_path):
    target = tiny_target(0)
    source = build_eagle(target, torch.arange(0, 128))
    with torch.no_grad():
        for p in own_parameters(source):
            p.add_(torch.randn_like(p) * 0.1)
    export_draft(source, torch.arange(0, 128), target, tmp_path / "head", {"kind": "eagle", "init_layer": 3,
                                                                          "training": {"command": "cmd"}})
    head = build_eagle(target, torch.arange(64, 256))
    assert warm_start(head, target, tmp_path / "head") == {"init_from": "cmd"}
    for name, want in own_state(source).items():
        assert torch.allclose(own_state(head)[name], want, atol=1e-3), name  # shipped in float16
    assert torch.equal(head.lm_head, target.lm_head[:, 64:256])  # the new vocabulary's columns stay
    export_draft(source, torch.arange(0, 128), target, tmp_path / "layers", {"kind": "layers"})
    with pytest.raises(ValueError, match="expected an EAGLE head"):
        warm_start(head, target, tmp_path / "layers")
    from safetensors.torch import load_file, save_file
    weights = tmp_path / "head" / "model.safetensors"
    save_file({("x." + k if k.startswith("fc") else k): v for k, v in load_file(str(weights)).items()}, str(weights))
    with pytest.raises(ValueError, match=r"do not fit this head: missing \['fc.*unexpected \['x\.fc"):
        warm_start(head, target, tmp_path / "head")


def test_exported_draft_config_names_no_local_folder(tmp_path):
    target = tiny_target(0)
    target.cfg = dataclasses.replace(target.cfg, name=str(tmp_path / "site-packages" / "model"))
    head = build_eagle(target, torch.arange(0, 128))
    export_draft(head, torch.arange(0, 128), target, tmp_path / "out", {"target": "tiny", "kind": "eagle"})
    text = (tmp_path / "out" / "draft_config.json").read_text()
    assert str(tmp_path) not in text and json.loads(text)["model_config"]["name"] == "tiny-draft"
