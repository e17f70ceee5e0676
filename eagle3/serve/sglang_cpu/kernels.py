"""``sgl_kernel`` for SGLang 0.5.23 on this CPU: the speculative-decoding helpers, ported to torch.

Kernels ported to CPU so that SGLang's real serving stack runs here (see the package docstring);
pinned to the release in ``SGLANG_VERSION``, whose call sites fix every signature below. The shim
registers this module as ``sys.modules["sgl_kernel"]``, so it defines every name SGLang's CPU path
imports from ``sgl_kernel`` at module load. Each function is a transcription of the Triton kernel
SGLang keeps beside the call site for the same job (named in its docstring, under
``sglang/kernels/ops`` or ``sglang/srt``), writing the same outputs in place; unlike Triton's
parallel programs the ports run sequentially, which gives the same result because the programs write
disjoint slots. ``build_draft_decode_metadata_cpu`` has no Triton twin (CUDA builds kv-indices
instead) and follows the contract of the C++ kernel it replaces.

Scope: any batch size, chain (``topk`` 1) and tree (``topk`` > 1) drafts; the one tree-mask layout
Triton cannot build either (bit-packed) is refused. Index tensors are small, so the ports read
them into Python lists and loop where the kernel loops; data moves as whole tensor slices. Nothing
here imports SGLang: the unit tests run in the project's own interpreter.
"""

from __future__ import annotations

import ctypes

import torch


class NotPortedError(RuntimeError):
    """A case SGLang can ask for that the torch ports do not cover (named in the message)."""


# sglang.kernels.ops.speculative.spec_tree.TreeMaskMode
FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


def _ints(tensor: torch.Tensor) -> list[int]:
    return tensor.reshape(-1).tolist()


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """``copy_all_layer_kv_cache_tiled`` (kernels/ops/kvcache/cache_move.py): in every buffer, row
    ``src`` -> ``tgt``.

    ``data_ptrs`` holds each KV buffer's address (uint64) and ``strides`` its row size in bytes;
    rows are copied as bytes, so any dtype moves unchanged. All sources are read before any target
    is written (safe in place).
    """
    if tgt_loc.numel() == 0:
        return
    tgt, src = tgt_loc.reshape(-1).long(), src_loc.reshape(-1).long()
    rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for address, row_bytes in zip(_ints(data_ptrs), _ints(strides), strict=True):
        raw = (ctypes.c_uint8 * (rows * row_bytes)).from_address(address)
        # the buffer's first rows, shared
        buffer = torch.frombuffer(raw, dtype=torch.uint8).view(rows, row_bytes)
        buffer[tgt] = buffer[src]


def _segments(start_offset: torch.Tensor, end_offset: torch.Tensor) -> list[tuple[int, int, int]]:
    """(start, end, offset of the segment in the packed list) per request: the packed list is the
    concatenation."""
    out, offset = [], 0
    for start, end in zip(_ints(start_offset), _ints(end_offset), strict=True):
        out.append((start, end, offset))
        offset += end - start
    return out


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``assign_req_to_token_pool`` (srt/mem_cache/allocation.py): ``req_to_token[r, start:end] = ``
    the next slots.

    Request i owns the ``end - start`` slots of ``out_cache_loc`` that follow the requests before
    it.
    """
    table = req_to_token.view(-1, pool_len)
    for row, (start, end, offset) in zip(
        _ints(req_pool_indices), _segments(start_offset, end_offset), strict=True
    ):
        table[row, start:end] = out_cache_loc[offset : offset + end - start].to(table.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``assign_extend_cache_locs`` (kernels/ops/speculative/spec_tree.py): the inverse gather of
    the one above.

    ``out_cache_loc`` receives ``req_to_token[r, start:end]`` of each request, packed in batch
    order; the slots past the packed total are left as they are.
    """
    table = req_to_token.view(-1, pool_len)
    for row, (start, end, offset) in zip(
        _ints(req_pool_indices), _segments(start_offset, end_offset), strict=True
    ):
        out_cache_loc[offset : offset + end - start] = table[row, start:end].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_cols: int,
) -> None:
    """``assign_draft_cache_locs_contiguous`` (spec_tree.py): each request's ``topk * num_cols``
    slots from its length.

    Request i fills ``out_cache_loc[i * width : (i + 1) * width]`` (width ``topk * num_cols``) with
    ``req_to_token[r, seq_len : seq_len + width]``. Positions are not written: SGLang's CPU path
    asks for none.
    """
    table, width = req_to_token.view(-1, pool_len), topk * num_cols
    for i, (row, seq_len) in enumerate(zip(_ints(req_pool_indices), _ints(seq_lens), strict=True)):
        out_cache_loc[i * width : (i + 1) * width] = table[row, seq_len : seq_len + width].to(
            out_cache_loc.dtype
        )


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """``fill_accept_out_cache_loc`` (kernels/ops/speculative/eagle.py): the accepted tokens' slots,
    packed.

    Over ``accept_index`` flattened, every entry other than -1 sends ``out_cache_loc[entry]`` to the
    next free place of ``accept_out_cache_loc``; its tail past the accepted count is left as it is.
    """
    index = accept_index.reshape(-1).long()
    accepted = index[index != -1]
    accept_out_cache_loc[: accepted.numel()] = out_cache_loc[accepted].to(
        accept_out_cache_loc.dtype
    )


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """``fill_bonus_tokens`` (eagle.py): request i's last accepted token, ``accept_tokens[i * stride
    + len_i - 1]``."""
    lens = accept_lens.reshape(-1).long()
    flat = torch.arange(lens.numel(), dtype=torch.long) * accept_stride + lens - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[flat].to(bonus_tokens.dtype))


def rotate_input_ids_cpu(
    input_ids: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    topk_index: torch.Tensor,
    select_index: torch.Tensor | None,
) -> None:
    """``rotate_input_ids_kernel`` (kernels/ops/speculative/multi_layer_eagle.py): shift each
    segment left by one.

    Segment i (``input_ids[start : start + len]``) moves one place to the front, and the new token
    ``topk_index[i]`` goes to ``select_index[i]`` when given, else to the segment's last place.
    Multi-layer EAGLE only; the EAGLE-3 worker never calls it.
    """
    new_tokens = _ints(topk_index)
    targets = _ints(select_index) if select_index is not None else None
    for i, (start, length) in enumerate(
        zip(_ints(extend_start_loc), _ints(extend_seq_lens), strict=True)
    ):
        if length <= 0:
            continue
        input_ids[start : start + length - 1] = input_ids[start + 1 : start + length].clone()
        input_ids[targets[i] if targets is not None else start + length - 1] = new_tokens[i]


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """The draft decode's token table (srt/layers/attention/intel_amx_backend.py
    ``IntelAMXMultiStepDraftBackend``).

    A new ``[num_seqs * topk, pool_len]`` table: row ``i * topk + k`` holds request i's committed
    prefix ``req_to_token[r, :seq_len]`` followed by branch k's ``num_steps`` draft slots, which
    ``assign_draft_cache_locs_contiguous_cpu`` placed at ``seq_len + k * num_steps``. This is the
    CPU analogue of the kv-indices Triton's draft backend builds
    (``generate_draft_decode_kv_indices`` in spec_tree.py); only the first ``seq_len + num_steps``
    entries of a row are defined.
    """
    table = req_to_token.view(-1, pool_len)
    rows, lens = _ints(req_pool_indices), _ints(seq_lens)
    draft = torch.empty((len(rows) * topk, pool_len), dtype=req_to_token.dtype)
    for i, (row, seq_len) in enumerate(zip(rows, lens, strict=True)):
        for branch in range(topk):
            first = seq_len + branch * num_steps
            out = draft[i * topk + branch]
            out[:seq_len] = table[row, :seq_len]
            out[seq_len : seq_len + num_steps] = table[row, first : first + num_steps]
    return draft


def _parent_slot(selected: list[int], parents: list[int], slot: int, topk: int) -> int | None:
    """The slot of draft slot ``slot``'s parent, -1 for the root (the bonus token), None when it is
    not selected."""
    parent_tb_idx = selected[slot] // topk
    if parent_tb_idx == 0:
        return -1
    parent_token = parents[parent_tb_idx]
    return next((cp for cp, token in enumerate(selected) if token == parent_token), None)


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """``sgl_build_tree_kernel_efficient_triton`` (kernels/ops/speculative/spec_tree.py): the verify
    tree.

    Node 0 of request i is its bonus token, node j > 0 the draft token ``selected_index[i, j - 1]``.
    Writes ``retrieve_index`` (each node's flat index), links each node under its parent in
    ``retrieve_next_token`` / ``retrieve_next_sibling`` (which the caller fills with -1; a later
    node becomes the first child), each node's position (prefix length + depth), and each node's row
    of the tree mask: its ancestors and itself, in the ``FULL_MASK`` layout (rows of prefix + draft
    columns, the prefix columns left as the caller filled them) or ``QLEN_ONLY`` (draft columns
    only). ``QLEN_ONLY_BITPACKING`` is refused, as by the Triton kernel.
    """
    if int(tree_mask_mode) not in (FULL_MASK, QLEN_ONLY):
        raise NotPortedError(
            f"tree mask mode {int(tree_mask_mode)} (bit-packed) is not ported to CPU; Triton lacks it too"
        )
    n, bs = draft_token_num, verified_seq_len.numel()
    parents, selected = (
        parent_list.reshape(bs, -1).tolist(),
        selected_index.reshape(bs, -1).tolist(),
    )
    next_token, next_sibling = retrieve_next_token.tolist(), retrieve_next_sibling.tolist()
    mask, pos = tree_mask.view(-1), positions.view(-1)
    prefix_sum = 0
    for b, seq_len in enumerate(_ints(verified_seq_len)):
        sel, par = selected[b][: n - 1], parents[b]
        for node in range(n - 1, 0, -1):
            parent = _parent_slot(sel, par, node - 1, topk)
            if parent is not None:
                first_child = next_token[b][parent + 1]
                next_token[b][parent + 1] = node
                if first_child != -1:
                    next_sibling[b][node] = first_child
        for node in range(n):
            row = [1] + [0] * (n - 1)  # the node's draft columns: root, then slots 1..n-1
            slot, steps = node - 1, 0
            while node > 0 and steps < depth:
                steps += 1
                row[slot + 1] = 1
                slot = _parent_slot(sel, par, slot, topk)
                if slot is None or slot == -1:
                    break
            pos[b * n + node] = seq_len + steps
            if int(tree_mask_mode) == FULL_MASK:
                start = n * n * b + prefix_sum * n + (seq_len + n) * node + seq_len
            else:
                start = n * n * b + n * node
            mask[start : start + n] = torch.tensor(row, dtype=mask.dtype)
        prefix_sum += seq_len
    retrieve_index.copy_(
        torch.arange(bs * n, dtype=retrieve_index.dtype).view(retrieve_index.shape)
    )
    retrieve_next_token.copy_(torch.tensor(next_token, dtype=retrieve_next_token.dtype))
    retrieve_next_sibling.copy_(torch.tensor(next_sibling, dtype=retrieve_next_sibling.dtype))


def verify_tree_greedy_cpu(
    *,
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """``verify_tree_greedy_kernel_triton`` (spec_tree.py): walk each request's tree along the
    target's argmax.

    From the root, at each level the first child (then its siblings) whose draft token equals the
    target's token at the last accepted node is accepted; the walk stops at a level with no match or
    after ``accept_index.shape[1] - 1`` levels. Writes ``accept_index[i, :1 + accepted]`` (flat node
    indices, the rest left as the caller filled them), ``accept_token_num[i]`` (accepted drafts,
    bonus excluded) and, at each accepted node and the last one, ``predicts[node] =
    target_predict[node]``. Keyword names as SGLang's call (``retrive_*``).
    """
    num_spec = accept_index.shape[1]
    tokens, target = candidates.tolist(), _ints(target_predict)
    index, first, sibling = (
        retrive_index.tolist(),
        retrive_next_token.tolist(),
        retrive_next_sibling.tolist(),
    )
    flat_predicts = predicts.view(-1)
    for b in range(candidates.shape[0]):
        last, node, accepted = index[b][0], 0, [index[b][0]]
        for _ in range(1, num_spec):
            node = first[b][node]
            while node != -1 and tokens[b][node] != target[last]:
                node = sibling[b][node]
            if node == -1:
                break
            flat_predicts[last] = target[last]
            last = index[b][node]
            accepted.append(last)
        accept_index[b, : len(accepted)] = torch.tensor(accepted, dtype=accept_index.dtype)
        accept_token_num[b] = len(accepted) - 1
        flat_predicts[last] = target[last]
