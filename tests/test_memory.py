"""The memory contract of Algorithm 1, on the update function itself with states that encode their stream position."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compressive_transformer.core.compression import DilatedConvCompressor, MostUsedCompressor, PoolCompressor
from compressive_transformer.core.memory import KEY_ALIGN, LayerMemory, MemoryState, empty_layer, update_layer


def positions(start: int, T: int, B: int = 1, d: int = 3) -> torch.Tensor:
    """States whose every feature is the stream position (row r adds 1000 r), so memories are easy to read."""
    p = torch.arange(start, start + T, dtype=torch.float64)
    rows = torch.arange(B, dtype=torch.float64)[:, None] * 1000
    return (p[None, :] + rows)[..., None].expand(B, T, d).clone()


def run(seg_sizes, *, mem_len, cmem_len, c, extra=0, compressor=None, B=1):
    """Push positions 0..N-1 in segments; return the final state and every compressed slot produced, in order."""
    compressor = compressor or PoolCompressor(c, extra, "mean")
    state = empty_layer(
        B,
        3,
        mem_len=mem_len,
        cmem_len=cmem_len,
        compression_rate=c,
        window=compressor.window,
        track_usage=False,
        keep_windows=False,
        context=compressor.context,
        dtype=torch.float64,
    )
    produced, pos = [], 0
    for T in seg_sizes:
        x = positions(pos, T, B)
        state, ev = update_layer(
            state, x, torch.ones(B, T, dtype=torch.bool), compression_rate=c, extra_width=extra, compress=compressor
        )
        if ev is not None:
            produced.append(ev.compressed[0, :, 0])
        pos += T
    return state, (torch.cat(produced) if produced else torch.zeros(0, dtype=torch.float64)), pos


def valid(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return t[0][mask[0]][:, 0]


def test_algorithm1_exact_when_segments_are_multiples_of_c():
    # n_s = 4, n_m = 8, n_cm = 4, c = 2: after 5 segments (20 positions) memory holds 12..19, cmem the means of
    # the last four evicted pairs (4,5) (6,7) (8,9) (10,11); the first pairs were pushed out of the FIFO.
    state, produced, _ = run([4] * 5, mem_len=8, cmem_len=4, c=2)
    assert valid(state.mem, state.mem_mask).tolist() == list(range(12, 20))
    assert state.fill == 8
    assert valid(state.cmem, state.cmem_mask).tolist() == [4.5, 6.5, 8.5, 10.5]
    assert produced.tolist() == [0.5, 2.5, 4.5, 6.5, 8.5, 10.5]  # f_c of exactly the evicted slots, nothing else


def test_max_pool_compresses_the_evicted_span_not_the_whole_memory():
    state, _, _ = run([6, 6], mem_len=6, cmem_len=3, c=2, compressor=PoolCompressor(2, 0, "max"))
    assert valid(state.cmem, state.cmem_mask).tolist() == [1.0, 3.0, 5.0]  # max of (0,1) (2,3) (4,5)
    assert valid(state.mem, state.mem_mask).tolist() == list(range(6, 12))


@settings(max_examples=60, deadline=None)
@given(
    seg_sizes=st.lists(st.integers(1, 9), min_size=1, max_size=12),
    mem_len=st.integers(0, 10),
    c=st.integers(1, 5),
    extra=st.integers(0, 3),
)
def test_nothing_is_dropped_for_any_segmentation(seg_sizes, mem_len, c, extra):
    extra = min(extra, mem_len)
    state, produced, total = run(seg_sizes, mem_len=mem_len, cmem_len=64, c=c, extra=extra)
    n_groups = produced.numel()
    # every evicted state is compressed, in whole consecutive groups of c, oldest first
    expected = [sum(range(g * c, g * c + c + extra)) / (c + extra) for g in range(n_groups)]
    assert torch.allclose(produced, torch.tensor(expected, dtype=torch.float64))
    assert n_groups * c + state.fill == total
    assert state.fill - mem_len < c  # at most c - 1 states wait for their group
    assert valid(state.mem, state.mem_mask).tolist() == list(range(n_groups * c, total))


def test_one_token_at_a_time_compresses_every_c_steps():
    state, produced, total = run([1] * 23, mem_len=5, cmem_len=64, c=3)
    assert produced.tolist() == [1.0, 4.0, 7.0, 10.0, 13.0, 16.0]  # 6 groups of 3 = 18 states; 5 remain in memory
    assert state.fill == 5 and 6 * 3 + 5 == total


def test_transformer_xl_memory_discards_without_pending_slots():
    state = empty_layer(
        1, 3, mem_len=4, cmem_len=0, compression_rate=4, window=4, track_usage=False, keep_windows=False
    )
    assert state.capacity == 4
    for pos in range(0, 9, 3):
        state, ev = update_layer(
            state,
            positions(pos, 3).float(),
            torch.ones(1, 3, dtype=torch.bool),
            compression_rate=4,
            extra_width=0,
            compress=None,
        )
        assert ev is None
    assert valid(state.mem, state.mem_mask).tolist() == [5.0, 6.0, 7.0, 8.0]


def test_padding_is_never_valid_in_memory():
    state = empty_layer(
        2, 3, mem_len=6, cmem_len=2, compression_rate=2, window=2, track_usage=False, keep_windows=False
    )
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    state, _ = update_layer(
        state,
        positions(0, 4, B=2).float(),
        mask,
        compression_rate=2,
        extra_width=0,
        compress=PoolCompressor(2, 0, "mean"),
    )
    assert state.mem_mask[0, -4:].tolist() == [True, True, True, False]
    assert state.mem_mask[1, -4:].tolist() == [True] * 4
    assert state.mem[0, -1].abs().sum() == 0  # invalid slots hold zeros, not stale states


def test_reset_empties_only_the_given_rows():
    state, _, _ = run([4] * 4, mem_len=6, cmem_len=4, c=2, B=3)
    memory = MemoryState((state, state))
    for rows in (torch.tensor([False, True, False]), [1]):
        reset = memory.reset(rows)
        for layer, before in zip(reset.layers, memory.layers):
            assert not layer.mem_mask[1].any() and not layer.cmem_mask[1].any()
            assert layer.mem[1].abs().sum() == 0 and layer.cmem[1].abs().sum() == 0
            for r in (0, 2):
                assert torch.equal(layer.mem[r], before.mem[r]) and torch.equal(layer.cmem_mask[r], before.cmem_mask[r])
            assert layer.fill == before.fill


def test_most_used_keeps_the_most_attended_slots_in_time_order():
    windows = positions(0, 6)[:, :, :].view(1, 3, 2, 3)  # 3 groups of c=2 -> keep 3 of 6 slots
    usage = torch.tensor([[0.1, 0.9, 0.5, 0.0, 0.2, 0.8]], dtype=torch.float64)
    kept = MostUsedCompressor(2, 0)(windows, usage)
    assert kept[0, :, 0].tolist() == [1.0, 2.0, 5.0]


def test_usage_accumulates_while_in_memory():
    state = empty_layer(
        1,
        3,
        mem_len=4,
        cmem_len=2,
        compression_rate=2,
        window=2,
        track_usage=True,
        keep_windows=False,
        dtype=torch.float64,
    )
    ones = torch.ones(1, 4, dtype=torch.bool)
    kw = dict(compression_rate=2, extra_width=0, compress=MostUsedCompressor(2, 0))
    state, _ = update_layer(state, positions(0, 4), ones, **kw)
    # capacity 6 = 4 + c - 1, rounded up so that cmem + mem = 8 keys; right-aligned: slots 2..5 hold positions 0..3
    assert state.capacity == 6 and state.mem_mask[0].tolist() == [False, False, True, True, True, True]
    attention = torch.tensor([[0.0, 0.0, 0.9, 0.1, 0.4, 0.6]], dtype=torch.float64)
    state, ev = update_layer(state, positions(4, 4), ones, attn_usage=attention, **kw)
    # positions 0..3 were evicted: their usage [0.9, 0.1, 0.4, 0.6] keeps positions 0 and 3 (the top 2 of 4)
    assert ev.compressed[0, :, 0].tolist() == [0.0, 3.0]


@given(st.integers(0, 40), st.integers(0, 24), st.integers(1, 6))
def test_memory_keys_are_aligned_and_pending_room_is_at_least_c_minus_1(mem_len, cmem_len, c):
    state = empty_layer(
        1, 2, mem_len=mem_len, cmem_len=cmem_len, compression_rate=c, window=c, track_usage=False, keep_windows=False
    )
    if cmem_len == 0 or c == 1:  # Transformer-XL, or nothing ever waits for a group: exactly n_m slots
        assert state.capacity == mem_len
    else:
        assert state.capacity - mem_len >= c - 1 and (cmem_len + state.capacity) % KEY_ALIGN == 0
        assert state.capacity - mem_len < c - 1 + KEY_ALIGN


def test_memory_round_trips_through_tensors():
    state, _, _ = run([4] * 3, mem_len=6, cmem_len=4, c=2, B=2)
    memory = MemoryState((state,))
    back = MemoryState.from_tensors(memory.to_tensors())
    assert back.layers[0].fill == state.fill and back.layers[0].mem_len == state.mem_len
    assert torch.equal(back.layers[0].mem, state.mem) and torch.equal(back.layers[0].cmem_mask, state.cmem_mask)


def test_only_bptt_tracks_recent_compressed_slots_and_never_more_than_its_horizon():
    plain, _, _ = run([4] * 30, mem_len=8, cmem_len=4, c=2)
    assert plain.young == ()
    state = empty_layer(
        1,
        3,
        mem_len=8,
        cmem_len=4,
        compression_rate=2,
        window=2,
        track_usage=False,
        keep_windows=True,
        dtype=torch.float64,
    )
    for pos in range(0, 120, 4):
        state, _ = update_layer(
            state,
            positions(pos, 4),
            torch.ones(1, 4, dtype=torch.bool),
            compression_rate=2,
            extra_width=0,
            compress=PoolCompressor(2, 0, "mean"),
            bptt_horizon=3,
        )
    assert state.young == (2, 2, 2)


# --------------------------------------------------------------------------------------------------------------
# The dilated convolution over the evicted stream: its history of evicted states crosses segments.


def dilated(c: int, extra: int, dilations=(1, 2, 4)) -> DilatedConvCompressor:
    torch.manual_seed(0)
    return DilatedConvCompressor(3, c, extra, dilations).double()


def uncut(comp: DilatedConvCompressor, n_groups: int, c: int, extra: int) -> torch.Tensor:
    """The compressor over the whole stream of positions in one pass (causal zero padding before the first state)."""
    seq = torch.cat([torch.zeros(1, comp.context, 3, dtype=torch.float64), positions(0, n_groups * c + extra)], dim=1)
    return comp(seq.unfold(1, comp.window, c).transpose(2, 3))[0, :, 0]


@settings(max_examples=40, deadline=None)
@given(
    seg_sizes=st.lists(st.integers(1, 9), min_size=1, max_size=12),
    mem_len=st.integers(0, 8),
    c=st.integers(1, 4),
    extra=st.integers(0, 2),
    dilations=st.sampled_from([(1, 2, 4), (1,), (2, 3), (1, 2, 4, 8)]),
)
def test_dilated_stream_does_not_depend_on_how_the_stream_is_cut(seg_sizes, mem_len, c, extra, dilations):
    extra = min(extra, mem_len)
    comp = dilated(c, extra, dilations)
    with torch.no_grad():
        state, produced, total = run(seg_sizes, mem_len=mem_len, cmem_len=64, c=c, extra=extra, compressor=comp)
        n_groups = produced.numel()
        if n_groups:
            torch.testing.assert_close(produced, uncut(comp, n_groups, c, extra))
    h = comp.context
    evicted = n_groups * c
    assert state.history_mask[0].tolist() == [False] * max(h - evicted, 0) + [True] * min(h, evicted)
    expected = torch.tensor(
        [0.0] * max(h - evicted, 0) + list(range(max(evicted - h, 0), evicted)), dtype=torch.float64
    )
    assert state.history[0, :, 0].tolist() == expected.tolist()  # the last h evicted states, zeros before the first


def test_every_dilation_reads_real_states_once_memory_has_filled():
    c, comp = 2, dilated(2, 0)
    state, _, pos = run([4] * 6, mem_len=4, cmem_len=8, c=c, compressor=comp)
    assert comp.context == 7 and state.history_mask.all()  # 20 states evicted: the whole receptive field is real
    x = positions(pos, 4).requires_grad_()
    history = state.history.clone().requires_grad_()
    state = LayerMemory(**{**state.__dict__, "history": history})
    _, ev = update_layer(state, x, torch.ones(1, 4, dtype=torch.bool), compression_rate=c, extra_width=0, compress=comp)
    (grad,) = torch.autograd.grad(ev.compressed[0, 0].sum(), history)
    # The first new slot reads its group (2 states) and all 7 evicted before it: the oldest only through every layer
    # (1 + 2 + 4 = 7 steps back), so a non-zero gradient there means each dilation read a real state.
    assert grad[0].abs().sum(dim=-1).gt(0).all()


def test_reset_empties_the_history_of_its_rows_only():
    state, _, _ = run([4] * 4, mem_len=4, cmem_len=8, c=2, B=2, compressor=dilated(2, 0))
    reset = MemoryState((state,)).reset([0]).layers[0]
    assert not reset.history_mask[0].any() and reset.history[0].abs().sum() == 0
    assert torch.equal(reset.history[1], state.history[1]) and reset.history_mask[1].all()
    back = MemoryState.from_tensors(MemoryState((state,)).to_tensors()).layers[0]
    assert torch.equal(back.history, state.history) and torch.equal(back.history_mask, state.history_mask)


@settings(max_examples=30, deadline=None)
@given(
    seg_sizes=st.lists(st.integers(1, 7), min_size=1, max_size=6),
    mem_len=st.integers(2, 9),
    c=st.integers(1, 3),
    extra=st.integers(0, 2),
    dilations=st.sampled_from([None, (1, 2)]),
)
def test_one_plan_per_segment_moves_every_layer_as_its_own_update_would(seg_sizes, mem_len, c, extra, dilations):
    """The masks of an update are the same for every layer, so a model plans them once per segment
    (plan_update): the same next state and eviction, layer by layer, as each layer's own update (a padded first position, a context compressor, pending groups)."""
    from compressive_transformer.core.memory import plan_update

    torch.manual_seed(0)
    extra = min(extra, mem_len)
    comp = DilatedConvCompressor(3, c, extra, dilations) if dilations else PoolCompressor(c, extra, "max")
    comp = comp.double()
    layer = lambda: empty_layer(  # noqa: E731
        2, 3, mem_len=mem_len, cmem_len=3, compression_rate=c, window=comp.window, track_usage=False,
        keep_windows=False, context=comp.context, dtype=torch.float64,
    )  # fmt: skip
    states = [layer(), layer()]
    kw = dict(compression_rate=c, extra_width=extra, compress=comp)
    for i, T in enumerate(seg_sizes):
        x_mask = torch.ones(2, T, dtype=torch.bool)
        x_mask[1, 0] = i > 0  # row 1 starts with padding
        plan = plan_update(states[0], x_mask, compression_rate=c, extra_width=extra, compressing=True)
        for j, state in enumerate(states):
            x = torch.randn(2, T, 3, dtype=torch.float64)
            own, own_ev = update_layer(state, x, x_mask, **kw)
            shared, shared_ev = update_layer(state, x, x_mask, **kw, plan=plan)
            for name in ("mem", "mem_mask", "cmem", "cmem_mask", "history", "history_mask"):
                a, b = getattr(own, name), getattr(shared, name)
                assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), name
            assert own.fill == shared.fill and (own_ev is None) == (shared_ev is None)
            if own_ev is not None:
                assert torch.equal(own_ev.compressed, shared_ev.compressed)
                assert torch.equal(own_ev.group_mask, own_ev.old_mask & own_ev.compressed_mask.repeat_interleave(c, 1))
            states[j] = shared


def test_layers_share_their_masks_yet_a_checkpoint_stores_each_on_its_own():
    """A model's memory after a segment holds one mask tensor for all layers (planned once); safetensors refuses
    tensors that share memory, so to_tensors gives every entry its own."""
    import safetensors.torch

    from compressive_transformer import CompressiveTransformerLM, ModelConfig

    cfg = ModelConfig.from_raw(dict(vocab_size=16, d_model=8, n_layers=2, n_heads=2, d_ff=8, seg_len=4, mem_len=4,
                                    cmem_len=2, compression_rate=2, compression="max_pool", compression_loss="none"))  # fmt: skip
    model = CompressiveTransformerLM(cfg)
    memory = model(torch.randint(0, 16, (1, 4)), memory=model.init_memory(1)).memory
    assert memory.layers[0].mem_mask is memory.layers[1].mem_mask
    tensors = memory.to_tensors()
    storages = [t.untyped_storage().data_ptr() for t in tensors.values() if t.numel() > 0]
    assert len(storages) == len(set(storages))
    back = MemoryState.from_tensors(safetensors.torch.load(safetensors.torch.save(tensors)))
    assert all(torch.equal(a.mem_mask, b.mem_mask) for a, b in zip(back.layers, memory.layers))
