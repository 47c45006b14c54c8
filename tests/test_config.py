"""Bad configurations fail with one line that names the field; TOML and dotted overrides."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_config
from hypothesis import given, settings
from hypothesis import strategies as st

from compressive_transformer import ConfigError, ModelConfig, temporal_range
from compressive_transformer.core.config import (
    MOVED_MODEL_KEYS,
    MemoryConfig,
    QLConfig,
    RunConfig,
    WaveNetConfig,
    apply_overrides,
    apply_run_overrides,
    from_dict,
    load_run_config,
    load_toml,
    parse_override,
)
from compressive_transformer.core.config_base import merge_tables

BAD = [
    (dict(compression_rate=0), "model.compression.rate"),
    (dict(n_heads=3), "model.n_heads"),
    (dict(mem_len=-1), "model.memory.mem_len"),
    (dict(cmem_len=-4), "model.memory.cmem_len"),
    (dict(seg_len=0), "model.seg_len"),
    (dict(compression="zip"), "model.compression.function"),
    (dict(compression_loss="magic"), "model.compression.loss"),
    (dict(compression="most_used", compression_loss="none", attn_impl="sdpa"), "model.attn_impl"),
    (dict(compression="max_pool", compression_loss="attention"), "model.compression.loss"),
    (dict(compression="conv", compression_loss="none"), "model.compression.loss"),
    (dict(compression_extra_width=9, mem_len=8), "model.compression.extra_width"),
    (dict(norm="middle"), "model.norm"),
    (dict(gating=True, norm="post"), "model.gating"),
    (dict(dropout=1.5), "model.dropout"),
    (dict(vocab_size=0, input_dim=0), "model.vocab_size"),
    (dict(tie_embeddings=True, input_dim=4), "model.tie_embeddings"),
    (dict(dilations=()), "model.compression.dilations"),
    (dict(attn_impl="flash9"), "model.attn_impl"),
]


@pytest.mark.parametrize("kwargs,key", BAD, ids=[k for _, k in BAD])
def test_bad_configuration_names_the_field(kwargs, key):
    with pytest.raises(ConfigError) as err:
        tiny_config(**kwargs)
    message = str(err.value)
    assert message.startswith(key + ":") and "\n" not in message


def test_compression_settings_are_ignored_without_compressed_memory():
    tiny_config(cmem_len=0, compression="max_pool", compression_loss="attention")  # Transformer-XL: no compressor


def test_from_dict_rejects_unknown_keys_and_wrong_types():
    with pytest.raises(ConfigError, match=r"^model\.d_modle: unknown key"):
        from_dict(ModelConfig, {"d_modle": 8}, "model")
    with pytest.raises(ConfigError, match=r"^model\.d_model: expected int"):
        from_dict(ModelConfig, {"d_model": "big"}, "model")
    cfg = from_dict(ModelConfig, {"compression": {"dilations": [1, 3]}, "dropout": 0}, "model")
    assert cfg.compression.dilations == (1, 3) and cfg.dropout == 0.0
    with pytest.raises(ConfigError, match=r"^model\.compression\.rat: unknown key"):
        ModelConfig.from_raw({"compression": {"rat": 2}})


def test_toml_and_dotted_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[model]\nd_model = 64\nn_heads = 4\n")
    raw = apply_overrides(
        load_toml(path), ["model.mem_len=256", "model.compression=mean_pool", "model.dilations=[1,2]"]
    )
    assert raw == {
        "model": {"d_model": 64, "n_heads": 4, "mem_len": 256, "compression": "mean_pool", "dilations": [1, 2]}
    }
    assert parse_override("train.lr=3e-4") == (["train", "lr"], 3e-4)
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("lr")
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("[model\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(tmp_path / "bad.toml")


def test_temporal_range_follows_section_3_3():
    ct = temporal_range(ModelConfig.from_raw(dict(n_layers=3, seg_len=3, mem_len=6, cmem_len=6, compression_rate=3)))
    assert ct.max_range == 3 * (6 + 3 * 6) and ct.attention_cost == 3 * (3 + 12)
    txl = temporal_range(ModelConfig.from_raw(dict(n_layers=3, seg_len=3, mem_len=12, cmem_len=0)))
    assert txl.max_range == 36 and txl.attention_cost == ct.attention_cost
    # n_cm = n_m = n/2 and c = 3: twice the range of Transformer-XL at the same cost (the paper's example)
    assert ct.max_range == 2 * txl.max_range


# --------------------------------------------------------------------------------------------------------------
# The sectioned [model] table and the flat keys of the earlier layout

FLAT_VALUES = {  # one valid value per flat key, different from its default
    "mem_len": 40,
    "cmem_len": 24,
    "compression_rate": 3,
    "compression": "dilated_conv",
    "compression_loss": "bptt",
    "dilations": [1, 3],
    "bptt_horizon": 3,
    "cmem_positions": "shared",
    "share_positions": "biases",
    "clamp_len": 100,
    "same_length": True,
    "same_length_self": True,
}


@settings(max_examples=60, deadline=None)
@given(st.sets(st.sampled_from(sorted(FLAT_VALUES))))
def test_every_flat_key_reads_into_its_section(keys):
    """Any set of the earlier layout's keys builds the config their sections build, from a table and as overrides."""
    flat = {k: FLAT_VALUES[k] for k in keys}
    nested: dict = {}
    for k, v in flat.items():
        sub, name = ("compression", "function") if k == "compression" else MOVED_MODEL_KEYS[k]
        nested.setdefault(sub, {})[name] = v
    assert ModelConfig.from_raw(flat) == ModelConfig.from_raw(nested)
    overrides = [f"model.{k}={json.dumps(v)}" for k, v in flat.items()]
    from_overrides = RunConfig.from_raw(apply_run_overrides({"model": {"compression": {"rate": 2}}}, overrides))
    expected = ModelConfig.from_raw(merge_tables({"compression": {"rate": 2}}, nested))
    assert from_overrides.model == expected


def test_kind_sections_and_their_flat_keys(tmp_path):
    ql = ModelConfig.from_raw(
        dict(scales=[1, 1], n_layers=2, cmem_len=0, compression="max_pool", compression_loss="none", droppath=0.1)
    )
    assert ql.is_ql and ql.ql == QLConfig(scales=(1, 1), output_layers=0, droppath=0.1)
    wn = ModelConfig.from_raw(dict(wavenet_dilations=[1, 2], n_layers=2, mem_len=0, cmem_len=0))
    assert wn.is_wavenet and wn.wavenet == WaveNetConfig(dilations=(1, 2))
    # a run saved by the earlier layout wrote every key, the kinds it was not as empty lists
    saved = dict(scales=[], output_layers=0, droppath=0.0, wavenet_dilations=[], compression_rate=2, compression="conv")
    plain = ModelConfig.from_raw(saved)
    assert not plain.is_ql and not plain.is_wavenet and plain.compression.rate == 2
    with pytest.raises(ConfigError, match=r"^model\.ql\.scales: give the Transformer-XL layers"):
        ModelConfig.from_raw({"ql": {}, "cmem_len": 0, "compression": {"function": "max_pool", "loss": "none"}})
    with pytest.raises(ConfigError, match=r"^model\.wavenet\.dilations: give one dilation per layer"):
        ModelConfig.from_raw({"wavenet": {"dilations": []}, "mem_len": 0, "cmem_len": 0})


def test_a_transformer_xl_import_option_reads_from_its_flat_key():
    cfg = ModelConfig.from_raw(dict(mem_len=16, cmem_len=0, memory_init="zeros"))
    assert cfg.memory == MemoryConfig(mem_len=16, cmem_len=0, init="zeros")
    with pytest.raises(ConfigError, match=r"^model\.memory\.init: zero-filled memory is a Transformer-XL import"):
        ModelConfig.from_raw(dict(mem_len=16, cmem_len=8, memory_init="zeros"))


def test_a_key_given_both_ways_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_raw({"compression_rate": 2, "compression": {"rate": 4}})
    assert str(e.value) == (
        "model.compression_rate: is the old name of model.compression.rate, which is also set; "
        "keep only model.compression.rate"
    )
    assert ModelConfig.from_raw({"compression_rate": 4, "compression": {"rate": 4}}).compression.rate == 4


def test_a_flat_file_and_its_sectioned_rewrite_load_the_same_run(tmp_path):
    flat, nested = tmp_path / "flat.toml", tmp_path / "nested.toml"
    flat.write_text('[model]\nd_model = 32\ncompression = "mean_pool"\ncompression_loss = "none"\nclamp_len = 9\n')
    nested.write_text(
        '[model]\nd_model = 32\n[model.compression]\nfunction = "mean_pool"\nloss = "none"\n'
        "[model.positions]\nclamp_len = 9\n"
    )
    a, b = load_run_config(flat), load_run_config(nested)
    assert a == b and b.model.compression.function == "mean_pool" and b.model.positions.clamp_len == 9
    # an old string override over a sectioned file sets the function and keeps the section's other keys
    c = load_run_config(nested, ["model.compression=max_pool", "model.compression_rate=2"])
    assert (c.model.compression.function, c.model.compression.loss, c.model.compression.rate) == ("max_pool", "none", 2)
