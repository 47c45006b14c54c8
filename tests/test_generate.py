"""Generation: top-k / top-p filtering, greedy determinism, and O(1)-per-token decoding that matches a fresh
token-by-token run exactly (memory carried, compression every c tokens)."""

from __future__ import annotations

import sys

import pytest
import torch

from compressive_transformer.core.config import ConfigError, ModelConfig
from compressive_transformer.core.models import CompressiveTransformerLM
from compressive_transformer.core.models.decode import Decoder
from compressive_transformer.inference.generate import SamplingConfig, filter_logits, generate, sample_next

torch.set_num_threads(1)


def model(**kw) -> CompressiveTransformerLM:
    torch.manual_seed(0)
    cfg = dict(
        vocab_size=40,
        d_model=32,
        n_layers=2,
        n_heads=2,
        d_ff=64,
        seg_len=4,
        mem_len=6,
        cmem_len=4,
        compression_rate=2,
        dropout=0.1,
    )
    return CompressiveTransformerLM(ModelConfig.from_raw(cfg | kw))


def test_top_k_keeps_the_k_largest() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    out = filter_logits(logits, top_k=2)
    assert torch.isfinite(out).tolist() == [[False, True, False, True, False]]
    assert torch.equal(out[torch.isfinite(out)], torch.tensor([5.0, 4.0]))
    assert torch.equal(filter_logits(logits, top_k=0), logits)
    assert torch.equal(filter_logits(logits, top_k=10), logits)


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = torch.tensor([[0.5, 0.05, 0.3, 0.15]])
    logits = probs.log()
    keep = lambda p: torch.isfinite(filter_logits(logits, top_p=p)).tolist()[0]  # noqa: E731
    assert keep(0.5) == [True, False, False, False]  # the top token alone reaches 0.5
    assert keep(0.6) == [True, False, True, False]
    assert keep(0.85) == [True, False, True, True]
    assert keep(0.96) == [True, True, True, True]
    assert keep(1.0) == [True, True, True, True]
    assert keep(0.01) == [True, False, False, False]  # never empty


def test_top_k_and_top_p_combine_per_row() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0]])
    out = filter_logits(logits, top_k=3, top_p=0.7)
    assert torch.isfinite(out).tolist() == [[False, False, True, True], [True, True, False, False]]


def test_bad_sampling_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="top_p"):
        filter_logits(torch.zeros(1, 3), top_p=0.0)
    with pytest.raises(ConfigError, match="top_k"):
        filter_logits(torch.zeros(1, 3), top_k=-1)
    with pytest.raises(ConfigError, match="temperature"):
        sample_next(torch.zeros(1, 3), temperature=-1.0)
    with pytest.raises(ConfigError, match="prompt"):
        generate(model(), [], max_new_tokens=3)


def test_sampling_respects_the_filter_and_the_seed() -> None:
    logits = torch.tensor([[0.0, 0.1, 5.0, 4.9]]).repeat(200, 1)
    g = torch.Generator().manual_seed(0)
    draws = sample_next(logits, temperature=1.0, top_k=2, generator=g)
    assert set(draws.tolist()) == {2, 3}
    assert torch.equal(sample_next(torch.tensor([[0.0, 3.0, 1.0]]), temperature=0), torch.tensor([1]))
    a = generate(model(), [1, 2, 3], max_new_tokens=10, sampling=SamplingConfig(temperature=1.0), seed=5).tokens
    b = generate(model(), [1, 2, 3], max_new_tokens=10, sampling=SamplingConfig(temperature=1.0), seed=5).tokens
    assert a == b


def test_greedy_decoding_is_deterministic_and_leaves_train_mode_alone() -> None:
    m = model()
    m.train()
    a = generate(m, [3, 1, 4, 1, 5], max_new_tokens=15, sampling=SamplingConfig(temperature=0))
    b = generate(m, [3, 1, 4, 1, 5], max_new_tokens=15, sampling=SamplingConfig(temperature=0), seed=123)
    assert a.tokens == b.tokens and len(a.tokens) == 15
    assert m.training


@pytest.mark.parametrize(
    "kw",
    [{}, {"cmem_len": 0}, {"compression": "mean_pool", "compression_loss": "none"}],
    ids=["compressive", "txl", "mean_pool"],
)
def test_generation_logits_equal_a_fresh_token_by_token_run(kw: dict) -> None:
    m = model(**kw)
    prompt = [5, 9, 2, 7, 7, 1, 3]  # two segments of seg_len 4 (the second partial)
    out = generate(
        m, prompt, max_new_tokens=14, sampling=SamplingConfig(temperature=0.9, top_k=20), seed=1, keep_logits=True
    )
    sequence = prompt + out.tokens
    m.eval()
    memory = m.init_memory(1)
    reference = []
    with torch.no_grad():
        for token in sequence[:-1]:
            step = m(torch.tensor([[token]]), memory=memory)
            memory = step.memory
            reference.append(step.logits[0, -1])
    for i, logits in enumerate(out.logits):  # token i of the continuation was drawn from position len(prompt)-1+i
        torch.testing.assert_close(logits, reference[len(prompt) - 1 + i], rtol=1e-4, atol=1e-5)


def test_each_generated_token_is_one_forward_of_length_one(monkeypatch: pytest.MonkeyPatch) -> None:
    m = model()
    lengths = []
    real = m.forward

    def counting(inputs, *a, **kw):
        lengths.append(inputs.shape[1])
        return real(inputs, *a, **kw)

    monkeypatch.setattr(m, "forward", counting)
    steps = []
    real_step = Decoder.step
    monkeypatch.setattr(Decoder, "step", lambda self, tokens: steps.append(tokens.shape) or real_step(self, tokens))
    generate(m, list(range(10)), max_new_tokens=6, sampling=SamplingConfig(temperature=0))
    assert lengths == [4, 4, 2]  # the prompt in segments
    assert steps == [torch.Size([1])] * 5  # then one decoder step of one token per new token after the first

    lengths.clear()  # a model without a ring-buffer decoder: one forward of length 1 per token instead
    monkeypatch.setattr(
        sys.modules["compressive_transformer.inference.generate"], "unsupported", lambda model: "forced"
    )
    generate(m, list(range(10)), max_new_tokens=6, sampling=SamplingConfig(temperature=0))
    assert lengths == [4, 4, 2] + [1] * 5


def test_sampling_refuses_logits_it_cannot_draw_from_in_one_line() -> None:
    sampling = SamplingConfig()
    assert sampling.sample(torch.tensor([[0.0, float("-inf")]])).tolist() == [0]  # -inf masks a token
    for logits, message in (
        (torch.zeros(2, 3, 5), r"expected shape \(B, V\).*got \(2, 3, 5\); take logits\[:, -1\]"),
        (torch.zeros(5), r"expected shape \(B, V\)"),
        (torch.zeros(2, 0), r"expected shape \(B, V\)"),
        (torch.tensor([[0.0, float("nan")]]), "1 of 2 are NaN"),
        (torch.full((1, 3), float("-inf")), "-inf everywhere"),
        (torch.zeros(1, 3, dtype=torch.long), "expected a floating tensor"),
        ([[0.0, 1.0]], "expected a floating tensor of shape"),
    ):
        with pytest.raises(ValueError, match=message):
            sampling.sample(logits)


def test_a_prompts_file_that_is_not_text_is_one_line(tmp_path) -> None:
    from compressive_transformer.inference.textgen import read_prompts

    (tmp_path / "binary").write_bytes(bytes(range(256)))
    (tmp_path / "nul").write_bytes(b"one\x00two\n")
    with pytest.raises(ConfigError, match="binary is not UTF-8 text"):
        read_prompts(tmp_path / "binary")
    with pytest.raises(ConfigError, match="nul is not text"):
        read_prompts(tmp_path / "nul")
