"""The external oracle: `transformers` 4.37.2's TransfoXLLMHeadModel (the `[transfo-xl]` extra). Small random
TransfoXL models are saved as `transformers` saves them, imported, and must give the same log-probabilities over
consecutive segments with memory carried, and the same greedy continuations."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="the Transformer-XL parity tests need the [transfo-xl] extra (transformers==4.37.2)"
)
if not hasattr(transformers, "TransfoXLLMHeadModel"):  # removed in 5.0; 4.38-4.57 raise in its forward
    pytest.skip("the parity tests need transformers==4.37.2 (the [transfo-xl] extra)", allow_module_level=True)

from compressive_transformer import SamplingConfig, generate  # noqa: E402
from compressive_transformer.runs.interop.transfo_xl import import_transfo_xl  # noqa: E402
from compressive_transformer.runs.loading import from_pretrained  # noqa: E402

SEG, SEGMENTS, VOCAB = 5, 4, 60
BASE = dict(
    vocab_size=VOCAB, cutoffs=[10, 30], d_model=16, d_embed=16, n_head=2, d_head=8, d_inner=32, div_val=2,
    n_layer=2, mem_len=6, clamp_len=0, same_length=False, untie_r=True, dropout=0.0,
)  # fmt: skip


def reference(seed: int, **changes) -> torch.nn.Module:
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.TransfoXLLMHeadModel(transformers.TransfoXLConfig(**(BASE | changes))).eval()
    with torch.no_grad():
        for p in model.parameters():  # larger than the initialisation, so that every term matters
            p.normal_(0, 0.3)
    return model


def imported(ref: torch.nn.Module, tmp: Path, *, empty_memory: bool = False, safe: bool = True) -> torch.nn.Module:
    ref.save_pretrained(tmp / "src", safe_serialization=safe)
    words = ["<unk>"] + [f"w{i}" for i in range(ref.config.vocab_size - 1)]
    (tmp / "src" / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    import_transfo_xl(tmp / "src", tmp / "out", seg_len=SEG, empty_memory=empty_memory)
    return from_pretrained(tmp / "out", device="cpu").model


def max_difference(ref: torch.nn.Module, ours: torch.nn.Module, seed: int) -> list[float]:
    """Per segment, the largest |log p_ref - log p_ours| over batch, positions and the vocabulary."""
    tokens = torch.randint(0, VOCAB, (2, SEG * SEGMENTS), generator=torch.Generator().manual_seed(seed))
    mems, memory, worst = None, None, []
    with torch.no_grad():
        for s in range(SEGMENTS):
            seg = tokens[:, s * SEG : (s + 1) * SEG]
            out_ref = ref(seg, mems=mems)
            out = ours(seg, memory)
            mems, memory = out_ref.mems, out.memory
            worst.append((out_ref.prediction_scores - out.logits).abs().max().item())
    return worst


CASES = [
    pytest.param(0, {}, id="adaptive-div4"),
    pytest.param(1, dict(div_val=1), id="adaptive-div1"),
    pytest.param(2, dict(div_val=1, d_embed=12), id="adaptive-div1-proj"),
    pytest.param(3, dict(cutoffs=[], div_val=1), id="full-softmax"),
    pytest.param(4, dict(cutoffs=[], div_val=1, d_embed=8, tie_word_embeddings=False), id="full-softmax-proj-untied"),
    pytest.param(5, dict(same_length=True), id="same-length"),
    pytest.param(6, dict(same_length=True, clamp_len=4), id="same-length-clamp"),
    pytest.param(7, dict(clamp_len=3, untie_r=False), id="clamp-shared-r"),
    pytest.param(8, dict(untie_r=False, div_val=4, d_embed=64, cutoffs=[10, 20, 40]), id="div4-3-tails"),
    pytest.param(9, dict(pre_lnorm=True, same_length=True), id="pre-lnorm"),
    pytest.param(10, dict(mem_len=3), id="memory-shorter-than-a-segment"),
]


@pytest.mark.parametrize("seed,changes", CASES)
def test_log_probs_equal_transformers_over_segments(tmp_path, seed, changes):
    ref = reference(seed, **changes)
    ours = imported(ref, tmp_path, safe=seed % 2 == 0)  # model.safetensors and pytorch_model.bin
    worst = max_difference(ref, ours, seed)
    assert max(worst) <= 1e-5, worst


@pytest.mark.parametrize(
    "changes,option",
    [(dict(same_length=False), "empty_memory"), (dict(same_length=True), "same_length_self")],
)
def test_the_reference_options_are_needed(tmp_path, changes, option):
    """Without the option the importer sets, the first segments differ: the parity above is not vacuous."""
    import dataclasses

    ref = reference(11, **changes)
    if option == "empty_memory":
        ours = imported(ref, tmp_path, empty_memory=True)
    else:
        ours = imported(ref, tmp_path)
        ours.cfg = dataclasses.replace(
            ours.cfg, positions=dataclasses.replace(ours.cfg.positions, same_length_self=False)
        )
    assert max_difference(ref, ours, 11)[0] > 1e-3


@pytest.mark.parametrize(
    "changes", [dict(same_length=False), dict(same_length=True, clamp_len=4)], ids=["decoder", "forward"]
)
def test_greedy_continuations_equal(tmp_path, changes):
    ref = reference(12, **changes)
    ours = imported(ref, tmp_path)
    prompt = torch.randint(0, VOCAB, (1, 2 * SEG + 2), generator=torch.Generator().manual_seed(3))
    mems, expected = None, []
    with torch.no_grad():
        for start in range(0, prompt.shape[1], SEG):  # the prompt in segments, as ours reads it
            out = ref(prompt[:, start : start + SEG], mems=mems)
            mems = out.mems
        for _ in range(12):
            token = out.prediction_scores[:, -1].argmax(-1, keepdim=True)  # (1, 1)
            expected.append(int(token))
            out = ref(token, mems=mems)
            mems = out.mems
    got = generate(ours, prompt[0].tolist(), max_new_tokens=12, sampling=SamplingConfig(temperature=0))
    assert got.tokens == expected
