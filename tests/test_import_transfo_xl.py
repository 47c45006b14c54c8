"""`import transfo-xl` without `transformers`: a checkpoint directory laid out as `transformers` saves one, the
commands that accept the export it writes, safe loading (a malicious vocabulary pickle) and the one-line refusals."""

from __future__ import annotations

import collections
import json
import os
import pickle
import re
from pathlib import Path

import pytest
import safetensors.torch
import torch

from compressive_transformer.core.models import build_model
from compressive_transformer.runs.interop.safe_pickle import Opaque, load_plain
from compressive_transformer.runs.interop.transfo_xl import model_config, our_name
from tests.cli_helpers import assert_one_line_error, cli_run

CONFIG = dict(
    vocab_size=40, cutoffs=[10, 25], d_model=16, d_embed=16, n_head=2, d_head=8, d_inner=32, div_val=2, n_layer=1,
    mem_len=6, clamp_len=20, same_length=True, untie_r=True, dropout=0.0, tie_projs=[False, True, True],
    model_type="transfo-xl", architectures=["TransfoXLLMHeadModel"], transformers_version="4.37.2", init_std=0.02,
)  # fmt: skip
NAMES = (
    [f"transformer.word_emb.emb_layers.{i}.weight" for i in range(3)]
    + [f"transformer.word_emb.emb_projs.{i}" for i in range(3)]
    + [
        f"transformer.layers.0.{n}"
        for n in (
            "dec_attn.qkv_net.weight", "dec_attn.o_net.weight", "dec_attn.r_net.weight", "dec_attn.r_w_bias",
            "dec_attn.r_r_bias", "dec_attn.layer_norm.weight", "dec_attn.layer_norm.bias", "pos_ff.CoreNet.0.weight",
            "pos_ff.CoreNet.0.bias", "pos_ff.CoreNet.3.weight", "pos_ff.CoreNet.3.bias", "pos_ff.layer_norm.weight",
            "pos_ff.layer_norm.bias",
        )
    ]
    + [f"crit.out_layers.{i}.{w}" for i in range(3) for w in ("weight", "bias")]
    + ["crit.out_projs.0", "crit.cluster_weight", "crit.cluster_bias", "transformer.pos_emb.inv_freq"]
)  # fmt: skip
WORDS = ["<eos>", "<unk>"] + [f"w{i}" for i in range(38)]


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def write_checkpoint(src: Path, config: dict | None = None, *, vocab: object = None) -> Path:
    """A TransfoXLLMHeadModel directory: config.json, model.safetensors (tied tensors left out, as save_pretrained
    does) and vocab.pkl (the tokenizer's pickled __dict__, here with a regex and a payload that must not run)."""
    src.mkdir(parents=True, exist_ok=True)
    cfg = CONFIG if config is None else config
    (src / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    shapes = dict(build_model(model_config(CONFIG, seg_len=8)).state_dict())
    torch.manual_seed(0)
    tensors = {n: torch.randn(shapes[our_name(n)].shape) * 0.3 for n in NAMES if our_name(n) is not None}
    tensors["transformer.pos_emb.inv_freq"] = torch.ones(8)
    safetensors.torch.save_file(tensors, str(src / "model.safetensors"))
    if vocab is None:
        vocab = {
            "idx2sym": WORDS,
            "sym2idx": collections.OrderedDict((w, i) for i, w in enumerate(WORDS)),
            "counter": collections.Counter(WORDS),
            "punction_without_space_before_pattern": re.compile(r"[^\s][,.]"),
            "payload": _Evil(src.parent / "pwned"),
        }
    (src / "vocab.pkl").write_bytes(pickle.dumps(vocab))
    return src


def test_malicious_pickle_runs_nothing(tmp_path):
    path = tmp_path / "v.pkl"
    path.write_bytes(pickle.dumps({"idx2sym": ["<unk>"], "x": _Evil(tmp_path / "pwned")}, protocol=2))
    value = load_plain(path)
    assert not (tmp_path / "pwned").exists()
    assert value["idx2sym"] == ["<unk>"] and isinstance(value["x"], Opaque) and "system" in value["x"].name


def test_import_then_evaluate_generate_export(tmp_path, capsys):
    src = write_checkpoint(tmp_path / "src")
    out = tmp_path / "out"
    code, stdout, err = cli_run(capsys, "import", "transfo-xl", str(src), str(out), "--seg-len", "8")
    assert code == 0, err
    assert not (tmp_path / "pwned").exists()  # the vocabulary's payload did not run
    config = json.loads((out / "config.json").read_text())
    assert (
        config["memory"]["init"] == "zeros"
        and config["positions"]["same_length_self"]
        and config["adaptive"]["div_val"] == 2
    )
    text = tmp_path / "t.txt"
    text.write_text(" ".join(WORDS[2:30]) + " unseen\n", encoding="utf-8")
    code, stdout, err = cli_run(capsys, "evaluate", str(out), "--text", str(text), "--out", str(tmp_path / "e.json"))
    assert code == 0, err
    # the one word the vocabulary lacks is counted beside the score, which had no word of it
    assert "(1 of them, " in stdout and "<unk>" in stdout, stdout
    assert json.loads((tmp_path / "e.json").read_text())["unknown_tokens"] == 1
    corpus = tmp_path / "wikitext"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        (corpus / f"wiki.{split}.tokens").write_text(" = w3 = \n w4 w5 w6 w7 . \n", encoding="utf-8")
    code, stdout, err = cli_run(
        capsys, "evaluate", str(out), "--data", str(corpus), "--format", "wikitext", "--split", "test",
        "--set", "eval.mem_len=12", "--out", str(tmp_path / "w.json"),
    )  # fmt: skip
    assert code == 0, err
    code, stdout, err = cli_run(
        capsys, "generate", str(out), "--prompt", "w1 w2 w3", "--max-tokens", "5", "--temperature", "0"
    )
    assert code == 0, err
    code, stdout, err = cli_run(capsys, "export", str(out), str(tmp_path / "again"))
    assert code == 0, err
    assert (tmp_path / "again" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "change,fragment",
    [
        (dict(attn_type=1), "attn_type"),
        (dict(sample_softmax=100), "sample_softmax"),
        (dict(ext_len=16), "ext_len"),
        (dict(favourite_colour="red"), "favourite_colour"),
        (dict(model_type="gpt2"), "'gpt2'"),
        (dict(vocab_size=41), "vocabulary has 40 words"),
        (dict(d_inner=48), "shape"),
        (dict(div_val=32), "div_val"),
        (dict(tie_projs=[False, True]), "tie_projs"),
    ],
)
def test_refusals_are_one_line(tmp_path, capsys, change, fragment):
    src = write_checkpoint(tmp_path / "src", CONFIG | change)
    code, _, err = cli_run(capsys, "import", "transfo-xl", str(src), str(tmp_path / "out"))
    assert_one_line_error(code, err, fragment)
    assert not (tmp_path / "out").exists()


def test_missing_files_and_unreadable_vocabularies(tmp_path, capsys):
    src = write_checkpoint(tmp_path / "src", vocab={"idx2sym": "not a list"})
    code, _, err = cli_run(capsys, "import", "transfo-xl", str(src), str(tmp_path / "out"))
    assert_one_line_error(code, err, "--vocab FILE")
    (src / "vocab.pkl").unlink()
    code, _, err = cli_run(capsys, "import", "transfo-xl", str(src), str(tmp_path / "out"))
    assert_one_line_error(code, err, "no vocabulary")
    (tmp_path / "words.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    (src / "model.safetensors").unlink()
    code, _, err = cli_run(
        capsys, "import", "transfo-xl", str(src), str(tmp_path / "out"), "--vocab", str(tmp_path / "words.txt")
    )
    assert_one_line_error(code, err, "neither model.safetensors nor pytorch_model.bin")


@pytest.mark.parametrize(
    "damage,fragment",
    [
        (lambda src: (src / "config.json").write_text("[1, 2, 3]"), "not the object of a TransfoXLConfig"),
        (lambda src: (src / "config.json").write_text(json.dumps(CONFIG | {"cutoffs": 5})), "wrong type"),
        (lambda src: (src / "config.json").write_text(json.dumps(CONFIG | {"ext_len": "x"})), "wrong type"),
        (lambda src: (src / "model.safetensors").write_bytes(b"\x00garbage" * 10), "not a readable safetensors"),
        (
            lambda src: (src / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes()[:500]),
            "not a readable safetensors",
        ),
        (lambda src: (src / "vocab.txt").write_bytes(bytes(range(256)) * 4), "not UTF-8 text"),
    ],
    ids=["config-list", "cutoffs-number", "ext-len-string", "garbage-weights", "truncated-weights", "binary-vocab"],
)
def test_damaged_sources_are_one_line(tmp_path, capsys, damage, fragment):
    """A config.json that is a list, fields of the wrong type, garbage or truncated safetensors and a binary vocab.txt
    gave AttributeError, TypeError, SafetensorError and UnicodeDecodeError tracebacks."""
    src = write_checkpoint(tmp_path / "src")
    (src / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    damage(src)
    code, _, err = cli_run(capsys, "import", "transfo-xl", str(src), str(tmp_path / "out"))
    assert_one_line_error(code, err, fragment)
    assert not (tmp_path / "out").exists()
