"""The torch ports of SGLang's ``sgl_kernel`` CPU helpers against what the Triton kernels compute.

Each reference below is a plain loop written from the Triton kernel named in the port's docstring,
over flat memory and pointer arithmetic as the kernel does, on small random inputs.
"""

from __future__ import annotations

import pytest
import torch

from eagle3.serve.sglang_cpu import kernels


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _table(gen: torch.Generator, rows: int = 5, pool_len: int = 24) -> torch.Tensor:
    return torch.randperm(rows * pool_len, generator=gen).to(torch.int32).view(rows, pool_len)


def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer_reading_before_writing(gen):
    buffers = [
        torch.randn(10, 2, 4, generator=gen),
        torch.randn(10, 3, generator=gen).to(torch.bfloat16),
    ]
    before = [b.clone() for b in buffers]
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in buffers])
    # 2 <-> 5 swap: all loads precede stores
    tgt, src = torch.tensor([2, 5, 9, 7]), torch.tensor([5, 2, 0, 7])

    kernels.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)

    for buffer, old in zip(buffers, before, strict=True):
        expected = old.clone()
        for t, s in zip(tgt.tolist(), src.tolist(), strict=True):
            expected[t] = old[s]
        assert torch.equal(buffer, expected)


def test_assign_req_to_token_pool_writes_each_requests_run_of_new_slots(gen):
    table = _table(gen)
    rows, start, end = torch.tensor([3, 0, 4]), torch.tensor([2, 0, 5]), torch.tensor([5, 4, 5])
    out_cache_loc = torch.randint(0, 999, (7,), generator=gen)
    expected = table.clone().view(-1)
    # assign_req_to_token_pool: out_offset = sum of the earlier requests' lengths
    for pid in range(3):
        offset = sum(int(end[j] - start[j]) for j in range(pid))
        for j in range(int(start[pid]), int(end[pid])):
            expected[int(rows[pid]) * 24 + j] = out_cache_loc[offset + j - int(start[pid])]

    kernels.assign_req_to_token_pool_cpu(rows, table, start, end, out_cache_loc, 24)

    assert torch.equal(table.view(-1), expected)


def test_assign_extend_cache_locs_gathers_each_requests_slots_packed(gen):
    table = _table(gen)
    rows, start, end = torch.tensor([1, 4]), torch.tensor([3, 10]), torch.tensor([6, 12])
    out = torch.full((8,), -7, dtype=torch.int64)
    expected = out.clone()
    flat = table.view(-1)
    for pid in range(2):
        offset = sum(int(end[j] - start[j]) for j in range(pid))
        for j in range(int(start[pid]), int(end[pid])):
            expected[offset + j - int(start[pid])] = flat[int(rows[pid]) * 24 + j]

    kernels.assign_extend_cache_locs_cpu(rows, table, start, end, out, 24)

    assert torch.equal(out, expected)


@pytest.mark.parametrize("topk", [1, 2])
def test_assign_draft_cache_locs_contiguous_copies_topk_times_steps_slots_from_each_length(
    gen, topk
):
    table, steps = _table(gen), 3
    rows, seq_lens = torch.tensor([2, 0, 3]), torch.tensor([4, 9, 1])
    out = torch.empty(3 * topk * steps, dtype=torch.int64)
    expected = torch.empty_like(out)
    for pid in range(3):
        for j in range(topk * steps):
            expected[pid * topk * steps + j] = table.view(-1)[
                int(rows[pid]) * 24 + int(seq_lens[pid]) + j
            ]

    kernels.assign_draft_cache_locs_contiguous_cpu(rows, table, seq_lens, out, 24, topk, steps)

    assert torch.equal(out, expected)


def test_fill_accept_out_cache_loc_packs_the_slots_of_accepted_entries(gen):
    accept_index = torch.tensor(
        [[0, 1, -1, -1], [4, -1, -1, -1], [8, 9, 10, 11]], dtype=torch.int32
    )
    out_cache_loc = torch.randint(0, 999, (12,), generator=gen)
    out = torch.zeros(12, dtype=torch.int64)
    expected = out.clone()
    flat = accept_index.view(-1)
    for pid in range(flat.numel()):  # dst = number of accepted entries before pid
        dst = int((flat[:pid] != -1).sum())
        if flat[pid] > -1:
            expected[dst] = out_cache_loc[flat[pid]]

    kernels.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, out)

    assert torch.equal(out, expected)


def test_fill_bonus_tokens_takes_each_requests_last_accepted_token(gen):
    accept_tokens = torch.randint(0, 2048, (3, 4), generator=gen)
    accept_lens = torch.tensor([1, 4, 2], dtype=torch.int32)
    bonus = torch.empty(3, dtype=torch.int32)

    kernels.fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus, 4)

    flat = accept_tokens.view(-1)
    assert bonus.tolist() == [int(flat[4 * pid + int(accept_lens[pid]) - 1]) for pid in range(3)]


@pytest.mark.parametrize("with_select", [False, True])
def test_rotate_input_ids_shifts_each_segment_and_places_the_new_token(gen, with_select):
    ids = torch.randint(0, 2048, (9,), generator=gen)
    starts, lens, new = (
        torch.tensor([0, 4, 6]),
        torch.tensor([4, 0, 3]),
        torch.tensor([[11], [22], [33]]),
    )
    select = torch.tensor([1, 5, 7]) if with_select else None
    expected = ids.clone()
    for pid in range(3):
        s, n = int(starts[pid]), int(lens[pid])
        for j in range(n - 1):
            expected[s + j] = ids[s + j + 1]
        if n > 0:
            expected[int(select[pid]) if with_select else s + n - 1] = new.view(-1)[pid]

    kernels.rotate_input_ids_cpu(ids, starts, lens, new, select)

    assert torch.equal(ids, expected)


@pytest.mark.parametrize("topk", [1, 2])
def test_build_draft_decode_metadata_gives_each_branch_the_prefix_then_its_draft_slots(gen, topk):
    table, steps = _table(gen, pool_len=30), 3
    rows, seq_lens = torch.tensor([4, 1]), torch.tensor([5, 11])

    draft = kernels.build_draft_decode_metadata_cpu(table, rows, seq_lens, topk, steps, 30)

    assert draft.shape == (2 * topk, 30) and draft.dtype == table.dtype
    for b in range(2):
        row, n = table[int(rows[b])], int(seq_lens[b])
        for k in range(topk):
            expected = row[:n].tolist() + row[n + k * steps : n + (k + 1) * steps].tolist()
            assert draft[b * topk + k, : n + steps].tolist() == expected


def _triton_build_tree(
    parent_list,
    selected,
    seq_lens,
    mask,
    positions,
    r_index,
    r_next,
    r_sibling,
    topk,
    depth,
    n,
    mode,
):
    """``sgl_build_tree_kernel_efficient_triton``, one program per request, on flat lists."""
    bs, par_stride, sel_stride = (
        len(seq_lens),
        len(parent_list) // len(seq_lens),
        len(selected) // len(seq_lens),
    )
    prefix_sums = [sum(seq_lens[:b]) for b in range(bs)]

    def find(b, token):
        return next((p for p in range(n - 1) if selected[b * sel_stride + p] == token), None)

    for b in range(bs):
        seq_len = seq_lens[b]
        positions[b * n] = seq_len
        for i in range(n - 1, 0, -1):
            r_index[b * n + i] = b * n + i
            parent_tb_idx = selected[b * sel_stride + i - 1] // topk
            if parent_tb_idx == 0:
                parent_position = 0
            else:
                found = find(b, parent_list[b * par_stride + parent_tb_idx])
                if found is None:
                    continue
                parent_position = found + 1
            next_tok = r_next[b * n + parent_position]
            r_next[b * n + parent_position] = i
            if next_tok != -1:
                r_sibling[b * n + i] = next_tok
        r_index[b * n] = b * n
        for x in range(n):
            if mode == kernels.FULL_MASK:
                idx = n * n * b + prefix_sums[b] * n + (seq_len + n) * x + seq_len + 1
            else:
                idx = n * n * b + n * x + 1
            mask[idx - 1] = True
            for i in range(n - 1):
                mask[idx + i] = False
            if x == 0:
                continue
            cur, position = x - 1, 0
            for _ in range(depth):
                position += 1
                mask[idx + cur] = True
                parent_tb_idx = selected[b * sel_stride + cur] // topk
                if parent_tb_idx == 0:
                    break
                cur = find(b, parent_list[b * par_stride + parent_tb_idx])
                if cur is None:
                    break
            positions[b * n + x] = position + seq_len


def _draft_tree(gen, bs: int, topk: int, depth: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """parent_list and selected index shaped as EAGLE's ``organize_draft_results`` gives them
    (random choices)."""
    parents = [torch.arange(-1, topk).expand(bs, -1)]
    # each level expands topk of the previous level's topk * topk candidates
    for step in range(1, depth - 1):
        first = topk + (step - 1) * topk * topk
        parents.append(
            torch.stack(
                [torch.randperm(topk * topk, generator=gen)[:topk] + first for _ in range(bs)]
            )
        )
    width = topk + (depth - 1) * topk * topk
    selected = torch.stack(
        [torch.randperm(width, generator=gen)[: n - 1].sort().values for _ in range(bs)]
    )
    return torch.cat(parents, dim=1), selected


@pytest.mark.parametrize(
    ("topk", "depth", "n", "mode"), [(1, 3, 4, 0), (2, 3, 6, 0), (4, 4, 8, 0), (2, 3, 6, 1)]
)
def test_build_tree_kernel_efficient_matches_the_triton_kernel(gen, topk, depth, n, mode):
    bs, seq_lens = 3, torch.tensor([5, 2, 7])
    parent_list, selected = _draft_tree(gen, bs, topk, depth, n)
    size = int(seq_lens.sum()) * n + n * n * bs if mode == kernels.FULL_MASK else n * n * bs
    mask, positions = torch.ones(size, dtype=torch.bool), torch.empty(bs * n, dtype=torch.long)
    retrieve = torch.full((3, bs, n), -1, dtype=torch.long)
    expected = [mask.tolist(), positions.tolist(), *(r.reshape(-1).tolist() for r in retrieve)]
    _triton_build_tree(
        parent_list.reshape(-1).tolist(),
        selected.reshape(-1).tolist(),
        seq_lens.tolist(),
        *expected,
        topk,
        depth,
        n,
        mode,
    )

    kernels.build_tree_kernel_efficient_cpu(
        parent_list, selected, seq_lens, mask, positions, *retrieve, topk, depth, n, mode
    )

    got = [mask.tolist(), positions.tolist(), *(r.reshape(-1).tolist() for r in retrieve)]
    assert got == expected


def test_build_tree_of_a_chain_is_a_causal_chain_after_the_prefix():
    parent_list, selected, seq_lens = (
        torch.tensor([[-1, 0, 1]]),
        torch.tensor([[0, 1, 2]]),
        torch.tensor([2]),
    )
    mask, positions = torch.ones(2 * 4 + 16, dtype=torch.bool), torch.empty(4, dtype=torch.long)
    retrieve = torch.full((3, 1, 4), -1, dtype=torch.long)

    kernels.build_tree_kernel_efficient_cpu(
        parent_list, selected, seq_lens, mask, positions, *retrieve, 1, 3, 4, 0
    )

    assert positions.tolist() == [2, 3, 4, 5]
    assert retrieve.tolist() == [[[0, 1, 2, 3]], [[1, 2, 3, -1]], [[-1, -1, -1, -1]]]
    rows = mask.view(4, 6)  # each draft token sees the 2 prefix tokens, then the chain up to itself
    assert rows[:, :2].all() and torch.equal(rows[:, 2:], torch.ones(4, 4, dtype=torch.bool).tril())


def test_build_tree_refuses_the_bit_packed_mask():
    with pytest.raises(kernels.NotPortedError, match="bit-packed"):
        kernels.build_tree_kernel_efficient_cpu(
            *(torch.zeros(1, 4, dtype=torch.long),) * 2,
            torch.tensor([3]),
            torch.zeros(4, dtype=torch.uint8),
            torch.empty(4, dtype=torch.long),
            *torch.full((3, 1, 4), -1),
            1,
            3,
            4,
            kernels.QLEN_ONLY_BITPACKING,
        )


def _triton_verify(
    predicts, accept_index, accept_num, candidates, r_index, r_next, r_sibling, target, num_spec, n
):
    """``verify_tree_greedy_kernel_triton``, one program per request, on flat lists."""
    for bx in range(len(accept_num)):
        last = r_index[bx * n]
        accept_index[bx * num_spec] = last
        num_accept, cur = 0, 0
        for _ in range(1, num_spec):
            cur = r_next[bx * n + cur]
            target_token = target[last]
            found = 0
            for _ in range(n):
                if found != 0:
                    break
                if cur == -1:
                    found = -1
                    break
                draft_index, draft_token = r_index[bx * n + cur], candidates[bx * n + cur]
                if draft_token == target_token:
                    predicts[last] = target_token
                    num_accept += 1
                    accept_index[bx * num_spec + num_accept] = draft_index
                    last, found = draft_index, 1
                else:
                    cur = r_sibling[bx * n + cur]
            if found != 1:
                break
        accept_num[bx] = num_accept
        predicts[last] = target[last]


@pytest.mark.parametrize(("topk", "depth", "n"), [(1, 3, 4), (2, 3, 6), (4, 4, 8)])
def test_verify_tree_greedy_matches_the_triton_kernel(gen, topk, depth, n):
    bs, vocab = 4, 3  # a tiny vocabulary so that draft tokens often match the target's
    parent_list, selected = _draft_tree(gen, bs, topk, depth, n)
    seq_lens = torch.tensor([3, 1, 4, 2])
    mask = torch.ones(int(seq_lens.sum()) * n + n * n * bs, dtype=torch.bool)
    retrieve = torch.full((3, bs, n), -1, dtype=torch.long)
    kernels.build_tree_kernel_efficient_cpu(
        parent_list,
        selected,
        seq_lens,
        mask,
        torch.empty(bs * n, dtype=torch.long),
        *retrieve,
        topk,
        depth,
        n,
        0,
    )
    candidates = torch.randint(0, vocab, (bs, n), generator=gen)
    target = torch.randint(0, vocab, (bs, n), generator=gen)
    predicts = torch.full((bs * n,), -5, dtype=torch.int32)
    accept_index = torch.full((bs, depth + 1), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)
    expected = [predicts.tolist(), accept_index.view(-1).tolist(), accept_num.tolist()]
    _triton_verify(
        *expected,
        candidates.view(-1).tolist(),
        *(r.reshape(-1).tolist() for r in retrieve),
        target.view(-1).tolist(),
        depth + 1,
        n,
    )

    kernels.verify_tree_greedy_cpu(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_num,
        candidates=candidates,
        retrive_index=retrieve[0],
        retrive_next_token=retrieve[1],
        retrive_next_sibling=retrieve[2],
        target_predict=target,
    )

    assert [predicts.tolist(), accept_index.view(-1).tolist(), accept_num.tolist()] == expected
    assert accept_num.sum() > 0  # the draw exercises acceptance
