"""units: every reported number is the total NLL divided by the right count, checked by hand."""

from __future__ import annotations

import math

import pytest

from compressive_transformer.data.units import TextSize, has_words, summary_line, text_size, texts_size, units


def test_text_size_counts_characters_bytes_and_words() -> None:
    assert text_size("héllo wörld\n") == TextSize(chars=12, bytes=14, words=2)  # é, ö: two bytes each
    assert text_size(b"ab \xff cd") == TextSize(chars=7, bytes=7, words=3)  # not UTF-8: one character per byte
    assert texts_size(["ab", "c d"]) == TextSize(chars=5, bytes=5, words=3)


def test_units_by_hand_for_a_subword_run() -> None:
    size = TextSize(chars=1000, bytes=1100, words=200)
    u = units(700.0, 350, size, tokenizer_kind="bpe")  # 350 tokens, 700 nats in all
    assert u.loss == pytest.approx(2.0)
    assert u.bits_per_token == pytest.approx(2.0 / math.log(2))
    assert u.bits_per_char == pytest.approx(700.0 / 1000 / math.log(2))
    assert u.bits_per_byte == pytest.approx(700.0 / 1100 / math.log(2))
    assert u.word_ppl == pytest.approx(math.exp(700.0 / 200))
    assert u.ppl == pytest.approx(math.exp(2.0))


def test_a_byte_level_run_has_no_word_perplexity_and_bits_per_byte_is_bits_per_token() -> None:
    size = TextSize(chars=90, bytes=100, words=20)
    u = units(69.3, 99, size, tokenizer_kind="bytes")
    assert u.word_ppl is None and not has_words("bytes") and has_words("words") and has_words("bpe")
    assert u.bits_per_byte == pytest.approx(69.3 / 100 / math.log(2))
    assert "word ppl" not in summary_line(u) and "bits/char" in summary_line(u) and "bits/byte" in summary_line(u)


def test_a_partial_pass_has_no_per_text_units() -> None:
    u = units(10.0, 5, TextSize(100, 100, 20), tokenizer_kind="bpe", complete=False)
    assert u.bits_per_char is None and u.bits_per_byte is None and u.word_ppl is None and u.loss == 2.0
