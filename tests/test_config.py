"""Bad configurations fail with one line that names the field; TOML and dotted overrides."""

from __future__ import annotations

import pytest
from conftest import tiny_config

from compressive_transformer import ConfigError, ModelConfig, temporal_range
from compressive_transformer.core.config import apply_overrides, from_dict, load_toml, parse_override

BAD = [
    (dict(compression_rate=0), "model.compression_rate"),
    (dict(n_heads=3), "model.n_heads"),
    (dict(mem_len=-1), "model.mem_len"),
    (dict(cmem_len=-4), "model.cmem_len"),
    (dict(seg_len=0), "model.seg_len"),
    (dict(compression="zip"), "model.compression"),
    (dict(compression_loss="magic"), "model.compression_loss"),
    (dict(compression="most_used", compression_loss="none", attn_impl="sdpa"), "model.attn_impl"),
    (dict(compression="max_pool", compression_loss="attention"), "model.compression_loss"),
    (dict(compression="conv", compression_loss="none"), "model.compression_loss"),
    (dict(compression_extra_width=9, mem_len=8), "model.compression_extra_width"),
    (dict(norm="middle"), "model.norm"),
    (dict(gating=True, norm="post"), "model.gating"),
    (dict(dropout=1.5), "model.dropout"),
    (dict(vocab_size=0, input_dim=0), "model.vocab_size"),
    (dict(tie_embeddings=True, input_dim=4), "model.tie_embeddings"),
    (dict(dilations=()), "model.dilations"),
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
    cfg = from_dict(ModelConfig, {"dilations": [1, 3], "dropout": 0}, "model")
    assert cfg.dilations == (1, 3) and cfg.dropout == 0.0


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
    ct = temporal_range(ModelConfig(n_layers=3, seg_len=3, mem_len=6, cmem_len=6, compression_rate=3))
    assert ct.max_range == 3 * (6 + 3 * 6) and ct.attention_cost == 3 * (3 + 12)
    txl = temporal_range(ModelConfig(n_layers=3, seg_len=3, mem_len=12, cmem_len=0))
    assert txl.max_range == 36 and txl.attention_cost == ct.attention_cost
    # n_cm = n_m = n/2 and c = 3: twice the range of Transformer-XL at the same cost (the paper's example)
    assert ct.max_range == 2 * txl.max_range
