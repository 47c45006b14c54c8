"""Import a Transformer-XL checkpoint saved by Hugging Face ``transformers`` (``TransfoXLLMHeadModel``) as an export
directory of this library (``config.json``, ``model.safetensors``, ``tokenizer.json``).

Every field of ``TransfoXLConfig`` is mapped, ignored because it cannot change a trained model's outputs (listed in
:data:`NO_EFFECT`), or refused in one line. Weights are read with safetensors or ``torch.load(weights_only=True)``;
the vocabulary from ``vocab.txt`` or, through :mod:`~compressive_transformer.interop.safe_pickle`, from the pickled
``vocab.pkl`` (plain containers and strings only). Where `transformers`' model behaves differently from this
library's defaults the importer sets the option that matches it (docs/fidelity.md lists them).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch

from compressive_transformer.core.config import (
    AdaptiveConfig,
    ConfigError,
    DataConfig,
    EvalConfig,
    MemoryConfig,
    ModelConfig,
    PositionsConfig,
    RunConfig,
    TrainConfig,
)
from compressive_transformer.core.models import build_model
from compressive_transformer.data.readers import UNK
from compressive_transformer.data.tokenizers import WordTokenizer
from compressive_transformer.runs.budget import IMPORT_BYTES, check_model_size
from compressive_transformer.runs.checkpoint import non_finite
from compressive_transformer.runs.export import write_export
from compressive_transformer.runs.interop.safe_pickle import load_plain
from compressive_transformer.runs.loading import Run

# Fields that only initialise a model, name it or shape `transformers`' outputs: a trained model's log-probabilities
# do not depend on them.
NO_EFFECT = frozenset(
    {
        "init", "init_range", "proj_init_std", "init_std", "eos_token_id", "bos_token_id", "pad_token_id",
        "architectures", "model_type", "transformers_version", "torch_dtype", "_name_or_path", "return_dict",
        "output_hidden_states", "output_attentions", "use_cache", "torchscript", "trainer_compatible", "id2label",
        "label2id", "problem_type", "finetuning_task", "tokenizer_class", "task_specific_params", "adaptive",
        "tgt_len", "ext_len", "proj_share_all_but_first",
    }
)  # fmt: skip
MAPPED = frozenset(
    {
        "vocab_size", "n_token", "cutoffs", "d_model", "d_embed", "n_head", "d_head", "d_inner", "div_val",
        "pre_lnorm", "n_layer", "mem_len", "clamp_len", "same_length", "tie_projs", "attn_type", "sample_softmax",
        "dropout", "dropatt", "untie_r", "layer_norm_epsilon", "tie_word_embeddings", "tie_weight",
    }
)  # fmt: skip
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
VOCAB_FILES = ("vocab.txt", "vocab.pkl", "vocab.bin")


def _refuse(field: str, message: str) -> ConfigError:
    return ConfigError(f"transfo-xl config.json: {field}: {message}")


def model_config(raw: dict[str, Any], *, seg_len: int, empty_memory: bool = False) -> ModelConfig:
    """The :class:`ModelConfig` of a ``TransfoXLConfig`` dict (``config.json``); a field of the wrong type (a string
    for a number, a number for a list) is a one-line error."""
    try:
        return _model_config(raw, seg_len=seg_len, empty_memory=empty_memory)
    except ConfigError:
        raise
    except (TypeError, ValueError, AttributeError) as e:
        raise ConfigError(
            f"transfo-xl config.json: a field has a value of the wrong type ({_first_line(e)}); give the config.json "
            "save_pretrained wrote"
        ) from None


def _model_config(raw: dict[str, Any], *, seg_len: int, empty_memory: bool) -> ModelConfig:
    unknown = sorted(set(raw) - MAPPED - NO_EFFECT)
    if unknown:
        raise _refuse(unknown[0], "not a TransfoXLConfig field this importer maps; remove it if it has no effect")
    get = lambda key, default: raw.get(key, default)  # noqa: E731 - TransfoXLConfig's defaults
    if get("attn_type", 0) != 0:
        raise _refuse("attn_type", f"{raw['attn_type']} is not the relative attention (0) this library implements")
    if get("ext_len", 0) > 0:
        raise _refuse("ext_len", "extended context (the original code's ext_len) is not supported; set it to 0")
    if get("sample_softmax", -1) > 0:
        raise _refuse("sample_softmax", "sampled softmax is not supported; set it to -1 (the full adaptive softmax)")
    vocab = get("vocab_size", get("n_token", 267735))
    d_model, div_val = get("d_model", 1024), get("div_val", 4)
    d_embed = get("d_embed", 1024)
    cutoffs = tuple(get("cutoffs", [20000, 40000, 200000]))
    ties = tuple(
        bool(t) for t in raw.get("tie_projs") or [False] + [get("proj_share_all_but_first", True)] * len(cutoffs)
    )
    if len(ties) != len(cutoffs) + 1:
        raise _refuse("tie_projs", f"has {len(ties)} flags for {len(cutoffs)} cutoffs; it needs {len(cutoffs) + 1}")
    has_proj = div_val > 1 or d_embed != d_model
    mem_len = get("mem_len", 1600)
    if get("same_length", True) and mem_len == 0:
        raise _refuse("same_length", "with mem_len = 0 the reference masks every key; set same_length false")
    try:
        return ModelConfig(
            vocab_size=vocab,
            d_model=d_model,
            n_layers=get("n_layer", 18),
            n_heads=get("n_head", 16),
            d_head=get("d_head", 64),
            d_ff=get("d_inner", 4096),
            seg_len=seg_len,
            memory=MemoryConfig(mem_len=mem_len, cmem_len=0, init="empty" if empty_memory else "zeros"),
            positions=PositionsConfig(
                clamp_len=max(get("clamp_len", 1000), 0),  # the original code's -1 means no clamping, as 0 does here
                same_length=get("same_length", True),
                same_length_self=True,
                share="none" if get("untie_r", True) else "biases",
            ),
            norm="pre" if get("pre_lnorm", False) else "post",
            final_norm=False,
            tie_embeddings=bool(get("tie_word_embeddings", get("tie_weight", True))),
            dropout=get("dropout", 0.1),
            attn_dropout=get("dropatt", 0.0),
            layer_norm_eps=get("layer_norm_epsilon", 1e-5),
            adaptive=AdaptiveConfig(
                cutoffs=cutoffs, div_val=div_val, d_embed=d_embed, tie_projs=ties if has_proj else ()
            ),
        )
    except ConfigError as e:
        raise ConfigError(f"transfo-xl config.json maps to an invalid model ({e})") from None


_RULES = [
    (r"transformer\.word_emb\.emb_layers\.(\d+)\.weight", r"input.adaptive.layers.\1.weight"),
    (r"transformer\.word_emb\.emb_projs\.(\d+)", r"input.adaptive.projs.\1"),
    (r"transformer\.r_w_bias", r"blocks.0.attn.u"),  # untie_r = False: one pair for all layers
    (r"transformer\.r_r_bias", r"blocks.0.attn.v"),
    (r"transformer\.layers\.(\d+)\.dec_attn\.qkv_net\.weight", r"blocks.\1.attn.qkv.weight"),
    (r"transformer\.layers\.(\d+)\.dec_attn\.r_net\.weight", r"blocks.\1.attn.pos.weight"),
    (r"transformer\.layers\.(\d+)\.dec_attn\.o_net\.weight", r"blocks.\1.attn.out.weight"),
    (r"transformer\.layers\.(\d+)\.dec_attn\.r_w_bias", r"blocks.\1.attn.u"),  # content bias
    (r"transformer\.layers\.(\d+)\.dec_attn\.r_r_bias", r"blocks.\1.attn.v"),  # position bias
    (r"transformer\.layers\.(\d+)\.dec_attn\.layer_norm\.(weight|bias)", r"blocks.\1.norm1.\2"),
    (r"transformer\.layers\.(\d+)\.pos_ff\.CoreNet\.0\.(weight|bias)", r"blocks.\1.ff.0.\2"),
    (r"transformer\.layers\.(\d+)\.pos_ff\.CoreNet\.3\.(weight|bias)", r"blocks.\1.ff.3.\2"),
    (r"transformer\.layers\.(\d+)\.pos_ff\.layer_norm\.(weight|bias)", r"blocks.\1.norm2.\2"),
    (r"crit\.out_layers\.(\d+)\.(weight|bias)", r"output.adaptive.layers.\1.\2"),
    (r"crit\.out_projs\.(\d+)", r"output.adaptive.projs.\1"),
    (r"crit\.cluster_(weight|bias)", r"output.adaptive.cluster_\1"),
]
_IGNORED = re.compile(r"transformer\.pos_emb\.inv_freq")  # the sinusoids' frequencies: the same formula here


def our_name(name: str) -> str | None:
    """This library's parameter name for a `transformers` one (None for a buffer both compute alike)."""
    if _IGNORED.fullmatch(name):
        return None
    for pattern, target in _RULES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, target, name)
    raise ConfigError(f"transfo-xl weights: {name} is not a TransfoXLLMHeadModel tensor this importer maps")


def load_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy `transformers`' tensors into ``model``; every parameter must be covered (tied ones by either name)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    done: set[int] = set()
    with torch.no_grad():
        for name, value in tensors.items():
            target = our_name(name)
            if target is None:
                continue
            if target not in params:
                raise ConfigError(f"transfo-xl weights: {name} has no counterpart ({target}) in the mapped model")
            p = params[target]
            if tuple(p.shape) != tuple(value.shape):
                raise ConfigError(
                    f"transfo-xl weights: {name} has shape {tuple(value.shape)}, config.json implies {tuple(p.shape)}"
                )
            p.copy_(value.to(p.dtype))
            done.add(id(p))
    missing = [n for n, p in params.items() if id(p) not in done]
    if missing:
        raise ConfigError(f"transfo-xl weights: nothing in the checkpoint for {missing[0]}; is it complete?")


# torch.load(weights_only=True) could be made to run code before torch 2.6 (CVE-2025-32434); older releases read
# only safetensors here
SAFE_TORCH_LOAD = (2, 6)


def read_tensors(src: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors: ``model.safetensors`` or ``pytorch_model.bin`` (tensors only, no code run)."""
    if (src / "model.safetensors").is_file():
        path = src / "model.safetensors"
        try:
            return safetensors.torch.load_file(str(path))
        except (safetensors.SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise ConfigError(
                f"transfo-xl weights: {path} is not a readable safetensors file ({_first_line(e)}); it is truncated "
                "or damaged: copy it again"
            ) from None
    if (src / "pytorch_model.bin").is_file():
        obj = _torch_load(src / "pytorch_model.bin", "transfo-xl weights")
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise ConfigError(f"transfo-xl weights: {src / 'pytorch_model.bin'} does not hold a state dict of tensors")
        return obj
    raise ConfigError(
        f"transfo-xl: {src} has neither {' nor '.join(WEIGHT_FILES)}; give the directory save_pretrained wrote "
        "(a sharded checkpoint: load it once in transformers and save_pretrained it with a larger max_shard_size)"
    )


def _torch_load(path: Path, what: str) -> Any:
    """A torch-saved file read with ``weights_only`` (tensors and plain containers; anything else is refused)."""
    if tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2]) < SAFE_TORCH_LOAD:
        raise ConfigError(
            f"{what}: {path} is a pickle, which torch {torch.__version__} cannot read without risking running code; "
            "convert it to safetensors (model.safetensors) or upgrade torch to >= 2.6"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses anything but tensors and plain containers
        raise ConfigError(f"{what}: {path} is not a plain file of tensors ({_first_line(e)})") from None


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:160]


def read_vocab(src: Path, vocab: Path | None = None) -> list[str]:
    """Words in id order from ``vocab`` or the first of :data:`VOCAB_FILES` in ``src``."""
    path = vocab or next((src / n for n in VOCAB_FILES if (src / n).is_file()), None)
    if path is None:
        raise ConfigError(
            f"transfo-xl: no vocabulary in {src} ({', '.join(VOCAB_FILES)}); pass --vocab FILE with one word per line "
            "in id order"
        )
    if path.suffix == ".txt":
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"transfo-xl: {path} is not UTF-8 text ({e.reason} at byte {e.start}); give one word per line in id order"
            ) from None
        words = [line.split()[0] for line in lines if line.strip()]
    else:
        if path.suffix == ".pkl":
            try:
                obj = load_plain(path)
            except Exception as e:  # noqa: BLE001  (a damaged pickle fails in many ways; none runs code)
                raise ConfigError(
                    f"transfo-xl: cannot read {path} safely ({_first_line(e)}); pass --vocab FILE with one word per "
                    "line in id order"
                ) from None
        else:
            obj = _torch_load(path, "transfo-xl vocabulary")  # vocab.bin: a torch-saved dict
        words = obj.get("idx2sym") if isinstance(obj, dict) else None
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise ConfigError(
                f"transfo-xl: {path} has no list of words (idx2sym); pass --vocab FILE with one word per line in id order"
            )
    if UNK not in words:
        raise ConfigError(f"transfo-xl: the vocabulary {path} has no {UNK}; this library maps unknown words to it")
    return words


def import_transfo_xl(
    src: str | Path,
    out: str | Path,
    *,
    seg_len: int = 128,
    data_path: str = "data/wikitext-103",
    vocab: str | Path | None = None,
    empty_memory: bool = False,
) -> Path:
    """Convert the ``transformers`` checkpoint directory ``src`` into the new export directory ``out``."""

    src = Path(src)
    path = src / "config.json"
    if not path.is_file():
        raise ConfigError(f"transfo-xl: {src} has no config.json; give the directory save_pretrained wrote")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"transfo-xl: {path} is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"transfo-xl: {path} holds a {type(raw).__name__}, not the object of a TransfoXLConfig")
    if raw.get("model_type", "transfo-xl") != "transfo-xl":
        raise ConfigError(f"transfo-xl: {path} describes a {raw['model_type']!r} model, not 'transfo-xl'")
    mcfg = model_config(raw, seg_len=seg_len, empty_memory=empty_memory)
    check_model_size(mcfg, device=torch.device("cpu"), bytes_per_parameter=IMPORT_BYTES, key=f"transfo-xl: {path}")
    words = read_vocab(src, Path(vocab) if vocab is not None else None)
    if len(words) != mcfg.vocab_size:
        raise ConfigError(f"transfo-xl: the vocabulary has {len(words)} words, config.json says {mcfg.vocab_size}")
    tensors = read_tensors(src)
    bad = non_finite(tensors)
    if bad is not None:
        raise ConfigError(
            f"transfo-xl weights: {bad} are NaN or infinite; the checkpoint is damaged or from a diverged run, and a "
            "model with them predicts nothing: import a good one"
        )
    model = build_model(mcfg)
    load_weights(model, tensors)
    model.eval()
    cfg = RunConfig(
        model=mcfg,
        data=DataConfig(format="wikitext", path=data_path, tokenizer="words"),
        train=TrainConfig(device="auto"),
        eval=EvalConfig(split="test"),
    )
    return write_export(Run(config=cfg, tokenizer=WordTokenizer(words), model=model), out)


__all__ = ["import_transfo_xl", "model_config", "load_weights", "read_vocab", "read_tensors", "NO_EFFECT"]
