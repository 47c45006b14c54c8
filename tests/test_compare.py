"""`compare`: variants of one base config trained with the same budget, tabulated; finished runs reused."""

from __future__ import annotations

import json

import pytest

from compressive_transformer import ConfigError
from compressive_transformer.experiments.compare import compare, load_spec

SPEC = """
[base.model]
vocab_size = 256
d_model = 16
n_layers = 2
n_heads = 2
d_ff = 32
seg_len = 4
mem_len = 4
compression_rate = 2
dropout = 0.0

[base.data]
format = "pydoc"

[base.train]
steps = 3
batch_size = 2
log_every = 1
val_every = 0
val_batches = 2
progress = false
checkpoint_every = 0

[base.eval]
batch_size = 2
max_batches = 3

[variants.txl.model]
cmem_len = 0

[variants.ql.model]
cmem_len = 0
scales = [1, 1]
n_layers = 2
compression = "max_pool"
compression_loss = "none"
"""


def test_compare_trains_each_variant_and_tabulates(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    rows = compare(spec, tmp_path / "out", log=lambda s: None)
    assert [(r["variant"], r["model"], r["n_s/n_m/n_cm"], r["window"]) for r in rows] == [
        ("txl", "Transformer-XL", "04/04/-", 8),
        ("ql", "Transformer-QL", "04/04/-", 8),
    ]
    assert rows[0]["context_avg"] == 2 * 4 + 2  # l n_m, plus n_s / 2
    assert all(r["tokens_per_s"] > 0 and r["bits_per_token"] > 0 and r["parameters"] > 0 for r in rows)
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == json.loads(json.dumps(rows))
    provenance = rows[0]["provenance"]  # what made the row: code, the corpus's hash per split, the machine
    assert set(provenance) == {"code", "data", "machine"} and "commit" in provenance["code"]
    assert provenance["data"]["splits"]["train"]["sha256"] and provenance["data"] == rows[1]["provenance"]["data"]
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| Transformer-QL | 04/04/- | 8 |" in table
    before = (tmp_path / "out" / "txl" / "metrics.jsonl").read_text()
    compare(spec, tmp_path / "out", log=lambda s: None)  # finished runs are reused, never retrained or overwritten
    assert (tmp_path / "out" / "txl" / "metrics.jsonl").read_text().startswith(before)


def test_bad_specs_name_the_problem(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text("[base.model]\nd_model = 16\n")
    with pytest.raises(ConfigError, match="no \\[variants.NAME\\] tables"):
        load_spec(spec)
    spec.write_text("[oops]\n[variants.a.model]\ncmem_len = 0\n")
    with pytest.raises(ConfigError, match="unknown table \\[oops\\]"):
        load_spec(spec)
    spec.write_text("[variants.a.model]\nn_heads = 3\n")
    with pytest.raises(ConfigError, match="^variants.a: model.n_heads"):
        load_spec(spec)
