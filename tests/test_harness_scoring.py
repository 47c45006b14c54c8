"""The harness's requests answered in token ids (no harness needed): a continuation's log-likelihood is the same
number whether its context is one segment or many, batched or alone; greedy means exactly "argmax at every scored
position"; a rolling document scores every token once; the (context, continuation) split follows the harness."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from harness_helpers import KINDS, TEXT, train_tiny
from hypothesis import given, settings
from hypothesis import strategies as st

from compressive_transformer import load_run
from compressive_transformer.data.tokenizers import ByteTokenizer
from compressive_transformer.harness.scoring import (
    continuation_loglikelihoods,
    encode_pair,
    padded_segments,
    rolling_loglikelihoods,
    stream_nll,
)
from compressive_transformer.inference.generate import SamplingConfig, generate

torch.set_num_threads(1)


@pytest.fixture(scope="module", params=sorted(KINDS))
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    return load_run(train_tiny(tmp_path_factory.mktemp(request.param), *KINDS[request.param]))


def test_a_continuation_scores_the_same_after_a_context_of_many_segments_batched_or_alone(run) -> None:
    ids = run.encode(TEXT)  # 282 bytes: the context spans many 16-token segments
    pairs = [(ids[:200], ids[200:230]), (ids[:37], ids[37:40]), (ids[:5], ids[5:60]), (ids[:1], ids[1:2])]
    batched = continuation_loglikelihoods(run, pairs, batch_size=3)
    alone = [continuation_loglikelihoods(run, [p], batch_size=1)[0] for p in pairs]
    for (ctx, cont), (ll, greedy), (ll1, greedy1) in zip(pairs, batched, alone):
        streamed = -(stream_nll(run, ctx + cont) - stream_nll(run, ctx))  # evaluate's pass, different segment cuts
        assert ll == pytest.approx(ll1, rel=1e-5, abs=1e-4) == pytest.approx(streamed, rel=1e-5, abs=1e-4)
        assert greedy == greedy1


def test_is_greedy_exactly_when_every_scored_token_is_the_argmax(run) -> None:
    ctx = run.encode(TEXT[:40])
    greedy = generate(
        run.model,
        ctx,
        max_new_tokens=6,
        sampling=SamplingConfig(temperature=0),
        mem_len=run.mem_len,
        cmem_len=run.cmem_len,
    )
    best = greedy.tokens
    other = best[:3] + [(best[3] + 1) % run.model.cfg.vocab_size] + best[4:]
    (_, g1), (_, g2), (_, g3) = continuation_loglikelihoods(run, [(ctx, best), (ctx, other), (ctx, [])], batch_size=3)
    assert (g1, g2, g3) == (True, False, True)


def test_rolling_is_evaluates_pass_every_token_after_a_prefix_and_all_but_the_first_without(run) -> None:
    docs = [run.encode(TEXT[:100]), run.encode(TEXT[:7]), run.encode(TEXT), run.encode("t"), []]
    prefix, two = run.encode("\n"), run.encode("\n\n")
    without = rolling_loglikelihoods(run, docs, batch_size=2)
    with_prefix = rolling_loglikelihoods(run, docs, prefix=prefix, batch_size=3)
    with_two = rolling_loglikelihoods(run, docs, prefix=two, batch_size=5)
    for i, ids in enumerate(docs):
        assert without[i] == pytest.approx(-stream_nll(run, ids), rel=1e-5, abs=1e-5)
        assert with_prefix[i] == pytest.approx(-stream_nll(run, prefix + ids), rel=1e-5, abs=1e-5)
        # a longer prefix: its own second token is not counted
        evaluated = stream_nll(run, two + ids) - stream_nll(run, two)
        assert with_two[i] == pytest.approx(-evaluated, rel=1e-5, abs=1e-4)
    assert without[3:] == [0.0, 0.0] and with_prefix[4] == 0.0 and with_prefix[3] < 0


def test_padding_never_enters_a_row_and_segments_have_full_length() -> None:
    segs = padded_segments([([1, 2, 3, 4, 5], 2), ([7, 8], 1)], seg_len=3)
    assert [tuple(s.tokens.shape) for s in segs] == [(2, 3), (2, 3)]
    tokens = torch.cat([s.tokens for s in segs], 1)
    targets = torch.cat([s.targets for s in segs], 1)
    mask = torch.cat([s.input_mask for s in segs], 1)
    assert tokens[0, :4].tolist() == [1, 2, 3, 4] and mask[0].tolist() == [True] * 4 + [False] * 2
    assert targets[0].tolist() == [-100, -100, 4, 5, -100, -100]
    assert mask[1].tolist() == [True] + [False] * 5 and targets[1].tolist() == [8] + [-100] * 5


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=12), st.text(max_size=12))
def test_a_pair_concatenates_back_to_the_text_and_context_spaces_move_to_the_continuation(ctx: str, cont: str) -> None:
    tok = ByteTokenizer()
    a, b = encode_pair(tok.encode, ctx, cont)
    assert a + b == tok.encode(ctx + cont)
    assert a == tok.encode(ctx.rstrip())


def test_word_pairs_keep_the_word_boundary() -> None:
    from compressive_transformer.data.tokenizers import WordTokenizer

    tok = WordTokenizer(["the", "cat", "mat.", "<unk>"])
    assert encode_pair(tok.encode, "the cat ", "mat.") == ([0, 1], [2])
    assert encode_pair(tok.encode, "the cat", "   ") == ([0, 1], [])


def test_eval_lengths_of_the_run_are_the_ones_used(run) -> None:
    ids = run.encode(TEXT)
    shorter = dataclasses.replace(
        run, config=dataclasses.replace(run.config, eval=dataclasses.replace(run.config.eval, mem_len=0, cmem_len=0))
    )
    assert rolling_loglikelihoods(shorter, [ids], batch_size=1) != pytest.approx(
        rolling_loglikelihoods(run, [ids], batch_size=1), rel=1e-6
    )


def test_a_row_with_nothing_to_score_beside_a_long_one_scores_zero(run) -> None:
    ids = run.encode(TEXT)
    (long, _), (empty, greedy) = continuation_loglikelihoods(
        run, [(ids[:100], ids[100:120]), (ids[:1], [])], batch_size=2
    )
    assert math.isfinite(long) and (empty, greedy) == (0.0, True)
