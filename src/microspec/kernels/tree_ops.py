"""A draft tree's verify inputs, its rows' paths and its acceptance, each one launch on the device (Triton) instead
of a few small tensor operations each (every one a kernel launch on a GPU, where a small model's step is mostly a
count of them).

- :func:`verify_inputs`: from the tree's tensors (tokens [N], depths [N], the ancestor-or-self matrix [N, N]) and
  the root (the last committed token, at cache position ``start``), the verify pass's ids [N + 1] (the root, then
  the nodes), positions [N + 1] (``start`` plus each row's depth) and attention mask [N + 1, N + 1] (every row
  sees the root, a node its ancestors and itself); eight operations in plain torch.
- :func:`paths`: each verify row's path as ids [N + 1, N] (-1 padding), the history beyond the committed tokens
  that the processors (the repetition penalty) see at that row; three operations in plain torch.
- :func:`accept`: from the target's choice at every verify row (``chosen`` [N + 1]: row 0 the root's, row i + 1
  node i's), which nodes are accepted: node i is where it and each of its ancestors is its parent row's choice (and
  a real node, ``valid``); written with the choices (and, for a tree whose host lists were never read, its tokens,
  parents and valid flags) into one int64 buffer, the step's one read to the host; nine operations in plain torch.
- :func:`committed`: from that buffer, before the host reads it, what the step commits as the device sees it, padded
  to the most a step commits (the tree's depth + 1): the verify rows of the root and the accepted nodes, the
  committed tokens (the accepted nodes', then the bonus token: the choice at the deepest accepted row) and their
  number less one; what a model drafter's next draft, launched before the read, starts from; twelve operations in
  plain torch.

The plain-torch references (:func:`verify_inputs_reference`, :func:`paths_reference`, :func:`accept_reference`,
:func:`committed_reference`) are the code the device walk ran before these kernels (the last: the code written
beside it), and run wherever Triton does not (a CPU without the interpreter).  Each kernel but the last is a grid of
programs over blocks of rows, each walking the columns in blocks; the last one program walking the nodes in blocks:
any tree size, no read back, the sizes not specialised on (one compilation for every tree).  tests/test_kernels.py
runs them under ``TRITON_INTERPRET=1`` against the references over the device-tree tests' trees and chains
(tests/verify_checks.py); tests/test_cuda.py runs the same checks compiled.
"""

from __future__ import annotations

import torch

BLOCK_R = 16  # verify rows a program takes
BLOCK_C = 64  # columns a program reads at a time


def applies(t: torch.Tensor) -> bool:
    """Whether the kernels take tensors on ``t``'s device: one the fused kernels
    :func:`~microspec.kernels.triton_env.runs` on."""
    from . import triton_env

    return triton_env.runs(t.device)


def verify_inputs_reference(root: int, start: int, tokens: torch.Tensor, depths: torch.Tensor, anc: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What :func:`verify_inputs` computes, in plain torch."""
    n, dev = tokens.numel(), tokens.device
    ids = torch.cat([torch.full((1,), root, dtype=torch.long, device=dev), tokens])
    positions = torch.cat([depths.new_zeros(1), depths]) + start
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool, device=dev)
    mask[:, 0] = True
    mask[1:, 1:] = anc
    return ids, positions, mask


def paths_reference(tokens: torch.Tensor, anc: torch.Tensor) -> torch.Tensor:
    """What :func:`paths` computes, in plain torch."""
    rows = torch.where(anc, tokens[None, :], -1)
    return torch.cat([rows.new_full((1, tokens.numel()), -1), rows])


def accept_reference(chosen: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, anc: torch.Tensor,
                     valid: torch.Tensor, lazy: bool) -> torch.Tensor:
    """What :func:`accept` computes, in plain torch."""
    match = (chosen[parents + 1] == tokens) & valid  # padding nodes are never accepted
    ok = ~(anc & ~match[None, :]).any(dim=1)
    return torch.cat([ok.long(), chosen] + ([tokens, parents, valid.long()] if lazy else []))


def committed_reference(acceptance: torch.Tensor, tokens: torch.Tensor, depths: torch.Tensor, r: int) -> torch.Tensor:
    """What :func:`committed` computes, in plain torch."""
    n, dev = tokens.numel(), tokens.device
    accepted = acceptance[:n] != 0
    count = accepted.sum()
    # at most one accepted node a depth (1 to count): node i's row (i + 1) goes to its depth's place, the rest to a
    # spare one
    rows = torch.zeros(r + 1, dtype=torch.long, device=dev)
    rows.scatter_(0, torch.where(accepted, depths, r), torch.arange(1, n + 1, device=dev))
    rows = rows[:r]
    bonus = acceptance[n : 2 * n + 1].gather(0, rows.gather(0, count[None]))  # the choice at the deepest accepted row
    j = torch.arange(r, device=dev)
    drafted = tokens[(torch.cat([rows[1:], rows[:1]]) - 1).clamp(min=0)]  # place j: the token of row j + 1
    return torch.cat([rows, torch.where(j < count, drafted, torch.where(j == count, bonus, -1)), count[None]])


def _define(triton, tl):
    @triton.jit(do_not_specialize=["root", "start", "n"])
    def verify_inputs_kernel(tokens_ptr, depths_ptr, anc_ptr, ids_ptr, pos_ptr, mask_ptr, root, start, n, s_a0,
                             s_a1, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # verify rows: 0 the root, r node r - 1
        in_rows = rows <= n
        is_node = (rows >= 1) & in_rows
        node = tl.where(is_node, rows - 1, 0)
        tok = tl.load(tokens_ptr + node, mask=is_node, other=0)
        dep = tl.load(depths_ptr + node, mask=is_node, other=0)
        tl.store(ids_ptr + rows, tl.where(is_node, tok, root), mask=in_rows)
        tl.store(pos_ptr + rows, dep + start, mask=in_rows)
        for c0 in range(0, n + 1, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            in_cols = cols <= n
            col_node = tl.where(cols >= 1, cols - 1, 0)
            a = tl.load(anc_ptr + node[:, None] * s_a0 + col_node[None, :] * s_a1,
                        mask=is_node[:, None] & ((cols >= 1) & in_cols)[None, :], other=0)
            seen = (cols[None, :] == 0) | (a != 0)
            tl.store(mask_ptr + rows[:, None] * (n + 1) + cols[None, :], seen.to(tl.uint8),
                     mask=in_rows[:, None] & in_cols[None, :])

    @triton.jit(do_not_specialize=["n"])
    def paths_kernel(tokens_ptr, anc_ptr, out_ptr, n, s_a0, s_a1, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # verify rows: 0 the root, r node r - 1
        in_rows = rows <= n
        is_node = (rows >= 1) & in_rows
        node = tl.where(is_node, rows - 1, 0)
        for c0 in range(0, n, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            in_cols = cols < n
            tok = tl.load(tokens_ptr + cols, mask=in_cols, other=0)
            a = tl.load(anc_ptr + node[:, None] * s_a0 + cols[None, :] * s_a1,
                        mask=is_node[:, None] & in_cols[None, :], other=0)
            tl.store(out_ptr + rows[:, None] * n + cols[None, :], tl.where(a != 0, tok[None, :], -1),
                     mask=in_rows[:, None] & in_cols[None, :])

    @triton.jit(do_not_specialize=["n"])
    def accept_kernel(chosen_ptr, tokens_ptr, parents_ptr, anc_ptr, valid_ptr, out_ptr, n, s_a0, s_a1,
                      LAZY: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # node i's acceptance; verify row i's choice
        is_node = rows < n
        bad = tl.zeros([BLOCK_R], dtype=tl.int32)  # an ancestor-or-self that is not its parent row's choice
        for c0 in range(0, n, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            in_cols = cols < n
            tok = tl.load(tokens_ptr + cols, mask=in_cols, other=0)
            par = tl.load(parents_ptr + cols, mask=in_cols, other=0)
            val = tl.load(valid_ptr + cols, mask=in_cols, other=0)
            choice = tl.load(chosen_ptr + par + 1, mask=in_cols, other=0)
            miss = ((choice != tok) | (val == 0)) & in_cols
            a = tl.load(anc_ptr + rows[:, None] * s_a0 + cols[None, :] * s_a1,
                        mask=is_node[:, None] & in_cols[None, :], other=0)
            bad = tl.maximum(bad, tl.max(((a != 0) & miss[None, :]).to(tl.int32), axis=1))
        tl.store(out_ptr + rows, (1 - bad).to(tl.int64), mask=is_node)
        in_chosen = rows <= n
        tl.store(out_ptr + n + rows, tl.load(chosen_ptr + rows, mask=in_chosen, other=0), mask=in_chosen)
        if LAZY:  # the tree's host lists, read in the same transfer
            tl.store(out_ptr + 2 * n + 1 + rows, tl.load(tokens_ptr + rows, mask=is_node, other=0), mask=is_node)
            tl.store(out_ptr + 3 * n + 1 + rows, tl.load(parents_ptr + rows, mask=is_node, other=0), mask=is_node)
            tl.store(out_ptr + 4 * n + 1 + rows, tl.load(valid_ptr + rows, mask=is_node, other=0).to(tl.int64),
                     mask=is_node)

    @triton.jit(do_not_specialize=["n", "r"])
    def committed_kernel(acc_ptr, tokens_ptr, depths_ptr, out_ptr, n, r, BLOCK_P: tl.constexpr,
                         BLOCK_C: tl.constexpr):
        places = tl.arange(0, BLOCK_P)  # 0 the root; d the accepted node of depth d (one at most)
        row = tl.zeros([BLOCK_P], dtype=tl.int64)  # the verify row at each place
        below = tl.full([BLOCK_P], -1, dtype=tl.int64)  # the token of the place below
        count = tl.zeros([BLOCK_C], dtype=tl.int64)
        for c0 in range(0, n, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            in_cols = cols < n
            ok = tl.load(acc_ptr + cols, mask=in_cols, other=0) != 0
            dep = tl.load(depths_ptr + cols, mask=in_cols, other=0)
            tok = tl.load(tokens_ptr + cols, mask=in_cols, other=0)
            count += ok.to(tl.int64)
            here = ok[None, :] & (dep[None, :] == places[:, None])
            row = tl.maximum(row, tl.max(tl.where(here, (cols + 1).to(tl.int64)[None, :], 0), axis=1))
            under = ok[None, :] & (dep[None, :] == places[:, None] + 1)
            below = tl.maximum(below, tl.max(tl.where(under, tok.to(tl.int64)[None, :], -1), axis=1))
        total = tl.sum(count, axis=0)
        last = tl.sum(tl.where(places == total, row, 0), axis=0)  # the deepest accepted row (0: the root)
        bonus = tl.load(acc_ptr + n + last)
        tokens_out = tl.where(places < total, below, tl.where(places == total, bonus, -1))
        in_places = places < r
        tl.store(out_ptr + places, row, mask=in_places)
        tl.store(out_ptr + r + places, tokens_out, mask=in_places)
        tl.store(out_ptr + 2 * r, total)

    return verify_inputs_kernel, paths_kernel, accept_kernel, committed_kernel, triton.cdiv


def _kernels():
    """The jitted kernels, defined at first use."""
    from .triton_env import defined

    return defined("tree_ops", _define)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A bool tensor as uint8 (the same bytes: Triton reads and writes bytes, not its 1-bit type)."""
    return t.view(torch.uint8) if t.dtype == torch.bool else t


def verify_inputs(root: int, start: int, tokens: torch.Tensor, depths: torch.Tensor, anc: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [N + 1], positions [N + 1], mask [N + 1, N + 1] bool) of the verify pass over the root ``root`` at
    position ``start`` and the tree of ``tokens`` [N], ``depths`` [N] (the root's children 1) and ancestor-or-self
    matrix ``anc`` [N, N] bool: one launch where :func:`applies`, else :func:`verify_inputs_reference`."""
    if not applies(tokens):
        return verify_inputs_reference(root, start, tokens, depths, anc)
    n, dev = tokens.numel(), tokens.device
    ids = torch.empty(n + 1, dtype=torch.long, device=dev)
    positions = torch.empty(n + 1, dtype=depths.dtype, device=dev)
    mask = torch.empty(n + 1, n + 1, dtype=torch.bool, device=dev)
    kernel, _, _, _, cdiv = _kernels()
    anc = _bytes(anc)
    kernel[(cdiv(n + 1, BLOCK_R),)](tokens.contiguous(), depths.contiguous(), anc, ids, positions, _bytes(mask),
                                    root, start, n, anc.stride(0), anc.stride(1), BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C)
    return ids, positions, mask


def paths(tokens: torch.Tensor, anc: torch.Tensor) -> torch.Tensor:
    """Each verify row's path as ids, [N + 1, N] int64: the root's row none (-1 throughout), node i's row the tokens
    of its ancestors and itself where ``anc`` [N, N] (bool) marks them, -1 elsewhere (what the processors take as
    each row's history beyond the committed tokens); one launch where :func:`applies`, else
    :func:`paths_reference`."""
    if not applies(tokens):
        return paths_reference(tokens, anc)
    n = tokens.numel()
    out = torch.empty(n + 1, n, dtype=torch.long, device=tokens.device)
    _, kernel, _, _, cdiv = _kernels()
    anc = _bytes(anc)
    kernel[(cdiv(n + 1, BLOCK_R),)](tokens.contiguous(), anc, out, n, anc.stride(0), anc.stride(1),
                                    BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C)
    return out


def accept(chosen: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, anc: torch.Tensor, valid: torch.Tensor,
           lazy: bool) -> torch.Tensor:
    """The acceptance of a tree's nodes and what the host reads with it, as one int64 tensor: for each node i of
    ``tokens`` [N] (``parents`` [N], -1 the root; ``anc`` [N, N] bool, its ancestors and itself; ``valid`` [N] bool,
    False for padding) 1 where it and each ancestor is its parent row's choice in ``chosen`` [N + 1] (row 0 the
    root), else 0; then ``chosen``; then where ``lazy`` the tokens, the parents and the valid flags (5N + 1 values,
    else 2N + 1).  One launch where :func:`applies`, else :func:`accept_reference`."""
    if not applies(tokens):
        return accept_reference(chosen, tokens, parents, anc, valid, lazy)
    n = tokens.numel()
    out = torch.empty((5 if lazy else 2) * n + 1, dtype=torch.long, device=tokens.device)
    _, _, kernel, _, cdiv = _kernels()
    anc = _bytes(anc)
    kernel[(cdiv(n + 1, BLOCK_R),)](chosen.contiguous(), tokens.contiguous(), parents.contiguous(), anc,
                                    _bytes(valid.contiguous()), out, n, anc.stride(0), anc.stride(1), LAZY=lazy,
                                    BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C)
    return out


def committed(acceptance: torch.Tensor, tokens: torch.Tensor, depths: torch.Tensor, r: int) -> torch.Tensor:
    """What a step commits, on the device before the host reads :func:`accept`'s buffer ``acceptance`` (its first
    2N + 1 values: the nodes' acceptance, the rows' choices) over the tree of ``tokens`` [N] and ``depths`` [N] (the
    root's children 1; at most one accepted node a depth), padded to ``r`` places (the tree's depth + 1), as one
    int64 tensor [2r + 1]: the verify rows of the root and the accepted nodes (0 after them), the committed tokens
    (the accepted nodes', then the bonus token, the choice at the deepest accepted row; -1 after them), and the
    number of accepted nodes.  One launch where :func:`applies`, else :func:`committed_reference`."""
    if not applies(tokens):
        return committed_reference(acceptance, tokens, depths, r)
    out = torch.empty(2 * r + 1, dtype=torch.long, device=tokens.device)
    _, _, _, kernel, _ = _kernels()
    kernel[(1,)](acceptance, tokens.contiguous(), depths.contiguous(), out, tokens.numel(), r,
                 BLOCK_P=max(16, 1 << (r - 1).bit_length()), BLOCK_C=BLOCK_C)
    return out


__all__ = ["accept", "accept_reference", "applies", "committed", "committed_reference", "paths", "paths_reference",
           "verify_inputs", "verify_inputs_reference"]
