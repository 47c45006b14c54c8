"""The paper's analyses on tiny models whose attention (or loss) is known exactly."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import tiny_model

from compressive_transformer.analysis import (
    attention_by_region,
    bucket_attention,
    bucket_perplexity,
    compare_frequency,
    compressibility_over_training,
    curves_from_records,
    empirical_temporal_range,
    frequency_perplexity,
    held_out_compressibility,
    plots,
    token_words,
    word_counts,
)
from compressive_transformer.analysis.frequency import token_nll, word_nll
from compressive_transformer.analysis.regions import bucket_edges
from compressive_transformer.core.context import temporal_range
from compressive_transformer.data import ByteTokenizer, WordTokenizer


def uniform_attention(model):
    """Zero every query/key projection and bias: each query spreads its attention evenly over the keys it may read."""
    with torch.no_grad():
        for block in model.blocks:
            a = block.attn
            a.qkv.weight[: 2 * a.n_heads * a.d_head].zero_()
            for p in (a.pos.weight, a.u, a.v, getattr(a.cpos, "weight", None), a.cv):
                if p is not None:
                    p.zero_()
    return model


def assert_buckets(got: dict, want: dict) -> None:
    for region, vals in want.items():
        assert len(got[region]) == len(vals)
        for g, w in zip(got[region], vals):
            assert (g is None) == (w is None), (region, got[region], vals)
            if w is not None:
                assert g == pytest.approx(w, rel=1e-9)


def test_bucket_edges_cover_slots_in_order():
    assert bucket_edges(14, 6) == [(0, 3), (3, 6), (6, 8), (8, 10), (10, 12), (12, 14)]
    assert bucket_edges(4, 6)[-2:] == [(4, 4), (4, 4)]
    assert bucket_edges(0, 6) == []


def test_bucketing_hand_made_weights_counts_only_valid_slots():
    # one head, two queries, keys [c0 c1 | m0 m1 m2 | s0 s1]; invalid slots carry weight that must be ignored
    w = torch.tensor([[[[0.1, 0.2, 0.3, 0.05, 0.35, 0.0, 0.0], [0.0, 0.1, 0.6, 0.1, 0.1, 0.05, 0.05]]]])
    cmem_mask = torch.tensor([[False, True]])
    mem_mask = torch.tensor([[False, True, True]])
    r = bucket_attention([w], cmem_mask, mem_mask, buckets=2)
    assert r["average"]["compressed"] == [None, pytest.approx((0.2 + 0.1) / 2)]
    # memory buckets: [m0 m1] (only m1 valid) and [m2]
    assert r["average"]["memory"] == [pytest.approx((0.05 + 0.1) / 2), pytest.approx((0.35 + 0.1) / 2)]
    # segment: key s0 is read by both queries, s1 only by the second (causal)
    assert r["average"]["segment"] == [pytest.approx((0.0 + 0.05) / 2), pytest.approx(0.05)]
    assert r["layers"][0] == r["average"]


@pytest.mark.parametrize("variant", [dict(), dict(cmem_len=0, mem_len=12)], ids=["compressive", "transformer-xl"])
def test_attention_by_region_on_uniform_attention_is_exact(variant):
    model = uniform_attention(tiny_model(**variant))  # seg 8, mem 8, cmem 4, c 2 (or TXL mem 12)
    T, buckets = 8, 3
    tokens = torch.randint(0, 32, (64,))
    r = attention_by_region(model, tokens.numpy(), batch_size=1, max_segments=4, warmup_segments=0, buckets=buckets)
    # the stream is segments 0..3 of one document; average the brute-force expectation over them
    mem_state = model.init_memory(1)
    sums = None
    for s in range(4):
        layer = mem_state.layers[0]
        # pairs per bucket differ between segments: accumulate weight sums and pair counts, as the analysis does
        mem_state = model(tokens[None, s * T : (s + 1) * T], memory=mem_state).memory
        sums = _accumulate(sums, layer.cmem_mask[0].tolist(), layer.mem_mask[0].tolist(), T, buckets)
    expected = {k: [a / b if b else None for a, b in v] for k, v in sums.items()}
    assert_buckets(r["average"], expected)
    for layer in r["layers"]:
        assert_buckets(layer, expected)  # uniform attention is the same in every layer
    assert r["segments"] == 4 and r["buckets_per_region"] == buckets


def _accumulate(sums, cmem_valid, mem_valid, T, buckets):
    """Brute force for one segment under uniform attention: query i reads n_i = valid slots + i + 1 keys, each with
    weight 1 / n_i; add each bucket's weight sum and pair count to ``sums``."""
    n = [sum(cmem_valid) + sum(mem_valid) + i + 1 for i in range(T)]
    keys = {
        "compressed": [[1 / n[i] for i in range(T)] if v else [] for v in cmem_valid],
        "memory": [[1 / n[i] for i in range(T)] if v else [] for v in mem_valid],
        "segment": [[1 / n[i] for i in range(j, T)] for j in range(T)],
    }
    sums = sums or {k: [[0.0, 0] for _ in bucket_edges(len(v), buckets)] for k, v in keys.items()}
    for region, ks in keys.items():
        for b, (lo, hi) in enumerate(bucket_edges(len(ks), buckets)):
            pairs = [w for k in ks[lo:hi] for w in k]
            sums[region][b][0] += sum(pairs)
            sums[region][b][1] += len(pairs)
    return sums


def test_partially_filled_memory_leaves_empty_buckets_out():
    model = uniform_attention(tiny_model())
    tokens = np.arange(16) % 32  # two segments: the first sees an empty memory, the second half a memory
    r = attention_by_region(model, tokens, batch_size=1, max_segments=1, warmup_segments=1, buckets=2)
    capacity = model.init_memory(1).layers[0].capacity  # 8 + c - 1 = 9 slots, 8 of them valid
    assert r["regions"][1]["slots"] == capacity
    assert r["average"]["compressed"] == [None, None]  # nothing compressed yet: no bucket is readable
    assert r["average"]["memory"][0] is not None and r["average"]["memory"][1] is not None
    assert sum(s for s in r["region_share"][0].values()) == pytest.approx(1.0)


def test_compressibility_over_training_reads_per_layer_series():
    records = [
        {"step": 5, "loss": 3.0, "aux_losses": [0.1, 0.2]},
        {"step": 5, "val_loss": 2.0},
        {"step": 10, "loss": 2.5, "aux_losses": [0.05, 0.3]},
    ]
    s = compressibility_over_training(records)
    assert s == {"steps": [5, 10], "per_layer": [[0.1, 0.05], [0.2, 0.3]]}


def test_held_out_compressibility_averages_compressing_segments_only():
    model = tiny_model(compression_loss="autoencoder")  # seg 8, mem 8, c 2: compresses from the second segment on
    tokens = torch.randint(0, 32, (40,))
    r = held_out_compressibility(model, tokens.numpy(), batch_size=1, max_segments=5)
    memory, expected = model.init_memory(1), [[] for _ in range(2)]
    for s in range(5):
        out = model(tokens[None, s * 8 : (s + 1) * 8], memory=memory)
        if s >= 1:
            for i in range(2):
                expected[i].append(float(out.aux_losses[i]))
        memory = out.memory
    assert r["segments"] == [4, 4]
    assert r["per_layer"] == pytest.approx([np.mean(e) for e in expected], rel=1e-9)
    assert all(v > 0 for v in r["per_layer"])
    assert held_out_compressibility(tiny_model(compression="mean_pool", compression_loss="none"), tokens.numpy())[
        "per_layer"
    ] == [None, None]


@pytest.mark.parametrize(
    "variant,reach",
    [(dict(cmem_len=0, mem_len=8), 2 * 8 + 7), (dict(cmem_len=0, mem_len=0), 7)],
    ids=["transformer-xl", "no-memory"],
)
def test_empirical_temporal_range_equals_the_theory_without_compression(variant, reach):
    model = tiny_model(**variant)
    r = empirical_temporal_range(model, length=48, distances=range(1, 48))
    assert r["theoretical_reach"] == reach == temporal_range(model.cfg).max_range + 7
    assert r["empirical_range"] == reach  # every input within reach matters, none beyond it does
    assert all(e == 0.0 for d, e in zip(r["distances"], r["effects"]) if d > reach)


def test_compressed_memory_reaches_further_than_memory_alone():
    ct = tiny_model(mem_len=4, cmem_len=4, compression_rate=2)
    txl = tiny_model(mem_len=8, cmem_len=0)  # the same attention cost
    r_ct = empirical_temporal_range(ct, length=64, distances=range(1, 64))
    r_txl = empirical_temporal_range(txl, length=64, distances=range(1, 64))
    assert r_txl["empirical_range"] == 23
    assert r_ct["empirical_range"] > r_txl["empirical_range"]
    # pending groups (up to c - 1 slots per layer) may add a little beyond l (n_m + c n_cm) + offset
    assert r_ct["theoretical_reach"] <= r_ct["empirical_range"] <= r_ct["theoretical_reach"] + 2 * (2 - 1) * 2


def test_word_and_byte_tokens_map_back_to_words():
    docs = ["the cat sat\non the mat", "a  cat"]
    words = WordTokenizer.train(docs)
    tw = token_words(words, docs)
    assert tw.words == ["the", "cat", "sat", "on", "the", "mat", "a", "cat"]
    assert tw.word_of_token.tolist() == list(range(8)) and tw.doc_offsets.tolist() == [0, 6, 8]
    tb = token_words(ByteTokenizer(), ["hé cat"])
    # bytes of "hé" (3) then the space and "cat": whitespace belongs to the next word
    assert tb.word_of_token.tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert tb.words == ["hé", "cat"]


def test_subword_tokens_map_back_through_offsets():
    from compressive_transformer.data import SubwordTokenizer

    text = "the quick brown fox jumps over the lazy dog\n" * 20
    tok = SubwordTokenizer.train([text], kind="bpe", vocab_size=270)
    tw = token_words(tok, ["the lazy fox\nover"])
    assert tw.words == ["the", "lazy", "fox", "over"]
    pieces = {}
    for i, w in zip(tw.ids.tolist(), tw.word_of_token.tolist()):
        pieces.setdefault(w, []).append(i)
    assert [tok.decode(pieces[w]).strip() for w in range(4)] == tw.words
    assert tok.encode("the lazy fox\nover") == tw.ids.tolist()


def test_word_nll_sums_pieces_and_skips_unpredicted_words():
    docs = ["ab c", "d"]
    tw = token_words(ByteTokenizer(), docs)  # a b ' ' c | d
    nll = np.array([np.nan, 1.0, 0.5, 0.25, np.nan])
    per_word = word_nll(tw, nll)
    assert np.isnan(per_word[0]) and per_word[1] == 0.75 and np.isnan(per_word[2])


def test_bucket_perplexity_and_comparison():
    words = ["a", "b", "c", "d"]
    counts = Counter({"a": 20_000, "b": 5_000, "c": 500, "d": 3})
    nll = np.log(np.array([2.0, 4.0, 8.0, 16.0]))
    b = bucket_perplexity(words, nll, counts)
    assert [b[k]["ppl"] for k in (">10K", "1K-10K", "100-1K", "<100")] == pytest.approx([2, 4, 8, 16])
    assert b["all"]["ppl"] == pytest.approx(math.exp(np.log([2, 4, 8, 16]).mean()))
    better = bucket_perplexity(words, nll - np.log(2), counts)
    cmp = compare_frequency({"txl": {"buckets": b}, "ct": {"buckets": better}})
    assert cmp["relative_gain"]["<100"] == pytest.approx(0.5) and cmp["gain_of"] == "ct over txl"


def test_frequency_perplexity_matches_the_streamed_loss():
    model = tiny_model(vocab_size=256, cmem_len=0)
    docs = ["to be or not to be that is the question " * 3]
    counts = word_counts(["to be or not to be", "the"])
    r = frequency_perplexity(model, ByteTokenizer(), docs, counts, batch_size=1)
    tw = token_words(ByteTokenizer(), docs)
    nll = token_nll(model, tw, batch_size=1)
    per_word = word_nll(tw, nll)
    ok = ~np.isnan(per_word)
    assert r["buckets"]["all"]["words"] == int(ok.sum()) == len(tw.words) - 1  # only the first word is unpredicted
    assert r["buckets"]["all"]["nll"] == pytest.approx(float(per_word[ok].mean()))
    complete_tokens = np.isin(tw.word_of_token, np.flatnonzero(ok))
    assert np.nansum(per_word) == pytest.approx(nll[complete_tokens].sum())  # word NLLs add up to the tokens' NLL


def test_curves_and_plots_write_pngs(tmp_path):
    records = [{"step": 1, "loss": 3.0, "lr": 1e-3}, {"step": 2, "loss": 2.0, "lr": 1e-3}, {"step": 2, "val_loss": 2.5}]
    c = curves_from_records(records)
    assert c["step"] == [1, 2] and c["loss"] == [3.0, 2.0] and c["val_step"] == [2] and c["val_loss"] == [2.5]
    assert plots.plot_training_curves({"a": c, "b": c}, tmp_path / "c.png").stat().st_size > 0
    model = tiny_model()
    r = attention_by_region(model, np.arange(64) % 32, batch_size=1, max_segments=2)
    assert plots.plot_attention_regions(r, tmp_path / "r.png").stat().st_size > 0
    t = empirical_temporal_range(tiny_model(cmem_len=0), length=32, distances=[1, 10, 30])
    assert plots.plot_temporal_range(t, tmp_path / "t.png").stat().st_size > 0


def test_a_stream_batcher_gives_the_same_result_as_the_token_array():
    from compressive_transformer.data import StreamBatcher

    model = tiny_model()
    tokens = np.random.default_rng(0).integers(0, 32, size=80)
    offsets = np.array([0, 50, 80])  # two documents: memory is reset at the second
    doc = type("Doc", (), {"tokens": tokens, "doc_offsets": offsets})
    a = attention_by_region(model, doc, batch_size=2, max_segments=3, warmup_segments=1)
    b = attention_by_region(
        model, StreamBatcher(tokens, offsets, batch_size=2, seg_len=8), batch_size=2, max_segments=3, warmup_segments=1
    )
    assert a["average"] == b["average"] and a["pairs_counted"] == b["pairs_counted"]
