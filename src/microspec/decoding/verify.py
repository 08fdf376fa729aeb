"""Verification: walk a draft tree with the target's logits and decide which tokens to commit.

The target's full-vocabulary head is the expensive part of a verify step on a large vocabulary (one 262k row is a
large share of a bf16 step on a CPU), so the walk never computes it for every node of a wide tree.  ``HEAD_MODES``:

- ``all``: one batched head pass over every row (the reference the others must equal);
- ``visited``: one pass per node the walk visits;
- ``path``: one batched pass over the draft's most probable path (the first child at every level), then one pass per
  node only where the walk leaves that path.

Whatever the mode, the committed tokens are identical (tests/test_speculative.py proves it).

Default (:attr:`Runtime.head_mode <microspec.runtime.Runtime.head_mode>`): ``path`` wherever a batch of head rows
costs little more than one row — on CUDA (there by that reasoning; the modes were not compared on a GPU) and on a
CPU with bf16 weights through the fp32-accumulating kernel of :mod:`microspec.kernels.cpu_linear` (a few rows stream
the head's weights once, as one row does).  ``visited`` elsewhere on a CPU: there a row costs the same batched or not
(torch's bf16 matmul without native bf16 arithmetic, and fp32 on a wide head, grow with every row), so scoring fewer
rows wins.  The modes' speeds are compared in BENCHMARKS.md, "Where the time goes".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..kernels import cpu_quant, tree_ops
from ..options import Option
from ..runtime import Runtime
from ..transfer import HostRead, rows_of, to_device
from .processors import LogitsPipeline, keyed_uniform, sample
from .tree import DeviceTree, DraftTree

HEAD_MODES = ("all", "visited", "path")
HEAD_MODE = Option(
    "head_mode", choices=HEAD_MODES,
    help="how verification computes the target's LM head: all, visited or path (default: path where a batch of head "
         "rows costs little more than one row — CUDA, and a CPU with bf16 or fp32 weights through the CPU kernel — "
         "else visited)")


@dataclass
class Walk:
    accepted: list[int]  # accepted draft nodes, root's child first
    tokens: list[int]  # tokens to commit: the accepted nodes' tokens, then the bonus token
    head_rows: int  # full-vocabulary head rows computed
    # [V] logits the target chose from at the root and at each accepted node (processed: the node's path as history):
    # a list of rows, or the rows of one [k, V] tensor (the device walk's)
    logits: list[torch.Tensor] | torch.Tensor = field(default_factory=list)
    # the same rows before the processors, where the pipeline keeps them (LogitsPipeline.keep_raw: raw logprobs)
    raw: list[torch.Tensor] | torch.Tensor | None = None

    def stacked(self, raw: bool = False) -> torch.Tensor:
        """:attr:`logits` (with ``raw``, :attr:`raw` where the walk kept it) as one [k, V] tensor (no copy where
        they are one already)."""
        rows = self.raw if raw and self.raw is not None else self.logits
        return rows if isinstance(rows, torch.Tensor) else torch.stack(rows)


class LazyHead:
    """Full-vocabulary logits of verify rows, computed on demand according to a head mode.  ``head`` gives new
    tensors (a product does): a walk processes the rows it visits in place."""

    def __init__(self, head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, tree: DraftTree,
                 mode: str, first: torch.Tensor | None = None, block_reads: bool = False):
        """``first``: the logits of :meth:`first_rows` already computed (a batch of walks shares one head pass);
        ``block_reads``: :meth:`argmax` reads the rows computed together at once (the runtime's choice)."""
        self.head, self.hidden, self.rows, self.block_reads = head, hidden, {}, block_reads
        self.computed = 0
        self._blocks: list[tuple[list[int], torch.Tensor]] = []  # rows computed together, argmax not read yet
        self._argmax: dict[int, int] = {}
        rows = self.first_rows(tree, mode)
        if first is None:
            self._fill(rows)
        else:
            self.computed += len(rows)
            self.rows.update(zip(rows, first))
            self._blocks.append((rows, first))

    @staticmethod
    def first_rows(tree: DraftTree, mode: str) -> list[int]:
        """The verify rows a walk's head computes up front: every row (``all``), the draft's most probable path
        (``path``), the root (``visited``: every walk starts there)."""
        if mode == "all":
            return list(range(1 + len(tree)))
        if mode == "path":
            children, row, main = tree.children(), 0, [0]
            while children[row]:
                row = children[row][0] + 1
                main.append(row)
            return main
        if mode != "visited":
            raise ValueError(f"unknown head mode {mode!r}; choose from {HEAD_MODES}")
        return [0]

    def _fill(self, rows: list[int]) -> None:
        logits = self.head(rows_of(self.hidden, rows))
        self.computed += len(rows)
        for i, r in enumerate(rows):
            self.rows[r] = logits[i]
        self._blocks.append((rows, logits))

    def __call__(self, row: int) -> torch.Tensor:
        if row not in self.rows:
            self._fill([row])
        return self.rows[row]

    def argmax(self, row: int) -> int:
        """The id of the largest logit of ``row``.  On a GPU the rows computed together with it are read back in
        the same transfer (one wait for the draft's whole main path, not one per accepted token)."""
        logits = self(row)
        if not self.block_reads:
            return cpu_quant.argmax(logits)
        if row not in self._argmax:
            rows, block = next(b for b in self._blocks if row in b[0])
            self._argmax.update(zip(rows, block.argmax(dim=-1).tolist()))
        return self._argmax[row]


def _follow(tree: DraftTree, logits_of: LazyHead, pipe: LogitsPipeline, target_of) -> Walk:
    """Follow the target's own choice (``target_of(row, logits, depth)``, of the row's processed logits) from the
    root while the tree contains it; the first choice the tree lacks is the bonus token.  Processors see each node's
    own path as history."""
    children = tree.children()
    row, path_tokens, accepted, chosen_from = 0, [], [], []
    raw = [] if pipe.keep_raw else None
    while True:
        logits = logits_of(row)
        if raw is not None:
            raw.append(logits.clone())
        if pipe.active:  # in place: the walk visits each row once, and keeps it processed (Walk.logits)
            logits = pipe.process(logits[None], [path_tokens])[0]
        chosen_from.append(logits)
        target = target_of(row, logits, len(path_tokens))
        child = next((c for c in children[row] if tree.tokens[c] == target), None)
        if child is None:
            return Walk(accepted, path_tokens + [target], logits_of.computed, chosen_from, raw)
        accepted.append(child)
        path_tokens.append(target)
        row = child + 1


def greedy_walk(tree: DraftTree, logits_of: LazyHead, pipe: LogitsPipeline) -> Walk:
    """Follow the target's own greedy choice from the root while the tree contains it; the first choice the tree
    lacks is the bonus token.  Processors see each node's own path as history."""
    def argmax(row: int, logits: torch.Tensor, depth: int) -> int:
        return cpu_quant.argmax(logits) if pipe.active else logits_of.argmax(row)

    return _follow(tree, logits_of, pipe, argmax)


def device_walk_takes(tree: DraftTree, pipe: LogitsPipeline, runtime: Runtime) -> bool:
    """Whether :func:`device_walk` verifies a step over ``tree`` (where the runtime walks on the device),
    once the tree is on the device: no processor or only those that take each row's path as a device tensor (the
    repetition penalty); greedy decoding, seeded sampling, or unseeded sampling over deterministic drafts (the keyed
    rule with the request's random key, :attr:`LogitsPipeline.key`: a child is accepted with the target's residual
    mass on it, as rejection sampling accepts deterministic drafts, so the two rules accept alike; sampled drafts
    keep rejection sampling, whose acceptance, the sum of min(p, q), is the most any exact rule has), which the
    device walk takes for a chain sampled on the device (:meth:`DeviceTree.chain_of
    <microspec.decoding.tree.DeviceTree.chain_of>` with its ``q``)."""
    return runtime.walk_on_device and pipe.on_device and (
        pipe.cfg.greedy or pipe.keyed or (pipe.key is not None and tree.scheme == "deterministic")
        or (tree.scheme == "iid" and tree.on_device is not None and pipe.generator is not None))


def walks_on_device(tree: DraftTree, pipe: LogitsPipeline, runtime: Runtime) -> bool:
    """Whether :func:`device_walk` verifies this step: a tree on the device that it takes
    (:func:`device_walk_takes`)."""
    return tree.on_device is not None and device_walk_takes(tree, pipe, runtime)


def device_walk(tree: DeviceTree, head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                pipe: LogitsPipeline | None = None) -> Walk:
    """:func:`greedy_walk`, or when sampling :func:`keyed_walk` (with the pipeline's key: the seed, or an unseeded
    request's random key), over a tree on the device (``tree.on_device``, siblings of distinct tokens, as a top-k
    gives them): the head over every row in one pass, the target's choice at each row (its argmax; or the
    inverse-CDF draw of the warped distribution at the uniform the key and the row's position fix), a node accepted
    where it and each of its ancestors is its parent row's choice (at most one per depth: the accepted nodes are the
    walk's path), and one read of the acceptance and the choices.  Processors that take the rows' paths on the
    device (the repetition penalty) see each row's own: the root's none, a node's its ancestors and itself.  The
    tokens are the host walk's with head mode ``all`` (tests/test_tree_device.py).  A chain sampled from the draft
    is walked by rejection sampling instead (:func:`_chain_rejection`)."""
    walk = launch_walk(tree, head, hidden, pipe)
    return walk if isinstance(walk, Walk) else walk.read()


def launch_walk(tree: DeviceTree, head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                pipe: LogitsPipeline | None = None) -> "LaunchedWalk | Walk":
    """:func:`device_walk` up to its read, which is under way when this returns (:class:`LaunchedWalk`; work
    launched after it, a model drafter's next draft, does not delay it); a sampled chain's walk, read already."""
    tokens, parents, depths, anc, valid = tree.on_device
    n = len(tree)
    logits = head(hidden[: n + 1])
    raw = logits.clone() if pipe is not None and pipe.keep_raw else None
    if pipe is not None and pipe.active:  # row 0 the root (no path), row i + 1 node i (its ancestors and itself)
        logits = pipe.process_on_device(logits, tree_ops.paths(tokens, anc))
    if tree.scheme == "iid":  # a chain sampled from the draft: rejection sampling, every row at once
        return _chain_rejection(tree, logits, pipe, raw)
    if pipe is None or pipe.cfg.greedy:
        chosen = logits.argmax(dim=-1)
    else:  # every row's keyed sample at once: the uniform of its position (the root's is the next token's)
        table = to_device([keyed_uniform(pipe.key, pipe.position + d) for d in range(tree.depth + 1)],
                          logits.device, torch.float64)
        u = table[torch.nn.functional.pad(depths, (1, 0))]  # the root's depth 0, then the nodes
        chosen = sample(pipe.probs(logits), u=u[:, None]).squeeze(-1)
    # the one read: the acceptance (padding nodes never accepted), the choices (and a lazy tree's host lists)
    return LaunchedWalk(tree, logits, tree_ops.accept(chosen, tokens, parents, anc, valid, not tree.read_back), raw)


class LaunchedWalk:
    """A device walk whose one read is under way (:func:`launch_walk`): :meth:`read` waits for it and gives the
    :class:`Walk`; before that, :meth:`path` gives on the device what the step commits, for work launched ahead of
    the read."""

    def __init__(self, tree: DeviceTree, logits: torch.Tensor, out: torch.Tensor, raw: torch.Tensor | None = None):
        self.tree, self.logits, self.out, self.raw = tree, logits, out, raw
        self.lazy = not tree.read_back
        self.host = HostRead(out)

    def read(self) -> Walk:
        tree, n = self.tree, len(self.tree)
        read = self.host.values()
        if self.lazy:
            tree.fill(read[2 * n + 1 : 3 * n + 1], read[3 * n + 1 : 4 * n + 1], read[4 * n + 1 :])
        accepted = [i for i in range(n) if read[i]]
        bonus = read[n + (accepted[-1] + 1 if accepted else 0)]
        picked = [0] + [a + 1 for a in accepted]
        return Walk(accepted, [tree.tokens[a] for a in accepted] + [bonus], n + 1, rows_of(self.logits, picked),
                    None if self.raw is None else rows_of(self.raw, picked))

    def path(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """On the device, nothing read: (the verify rows of the root and the accepted nodes [R], 0 after them; the
        tokens the step commits [R], the accepted nodes' then the bonus, -1 after them; the number of accepted
        nodes, 0-dim), R = the tree's depth + 1, the most a step commits: :meth:`read`'s ``[0] + [a + 1 for a in
        accepted]`` and tokens, padded (:func:`~microspec.kernels.tree_ops.committed`, one launch)."""
        tree = self.tree
        tokens, _, depths = tree.on_device[:3]
        r = tree.depth + 1
        out = tree_ops.committed(self.out, tokens, depths, r)
        return out[:r], out[r : 2 * r], out[2 * r]


def _chain_rejection(tree: DeviceTree, logits: torch.Tensor, pipe: LogitsPipeline,
                     raw: torch.Tensor | None = None) -> Walk:
    """:func:`sample_walk` over a chain sampled on the device (node i drawn from ``tree.q[i]``, the draft's
    distribution at row i), on the device with one read: node i is accepted with probability
    min(1, p_i(x_i) / q_i(x_i)) (p_i: the target's warped distribution at row i, processed ``logits``), the accepted
    nodes the chain's prefix up to the first rejection; the bonus token is drawn from row k's residual
    norm(max(0, p_k - q_k)) where node k is the first rejected (from p_k itself where rounding leaves the residual
    no mass, as the host walk does), or from the last row's p when every node is accepted.  Each row's candidate
    bonus is drawn with a uniform of its own, independent of the acceptance draws, and only row k's is kept: the
    committed tokens follow the target's distribution exactly, as :func:`sample_walk`'s do."""
    tokens = tree.on_device[0]
    n, gen = len(tree), pipe.generator
    p = pipe.probs(logits)  # [n + 1, V]
    q = tree.q.to(p.device, p.dtype)
    px, qx = p[:n].gather(1, tokens[:, None])[:, 0], q.gather(1, tokens[:, None])[:, 0]
    u = torch.rand(n, generator=gen, device=p.device)
    accept = (qx > 0) & (u < torch.where(qx > 0, px / qx, 0).clamp(max=1))
    kept = accept.long().cumprod(0)  # node i kept: it and every node before it accepted
    residual = (p[:n] - q).clamp(min=0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p[:n])
    bonus = sample(torch.cat([residual, p[n:]]), gen)[:, 0]  # row k: the bonus where node k is the first rejected
    lazy = not tree.read_back
    parts = [kept, bonus] + ([tokens, tree.on_device[1], tree.on_device[4].long()] if lazy else [])
    read = torch.cat(parts).tolist()  # the one read
    if lazy:
        tree.fill(read[2 * n + 1 : 3 * n + 1], read[3 * n + 1 : 4 * n + 1], read[4 * n + 1 :])
    accepted = [i for i in range(n) if read[i]]
    picked = [0] + [a + 1 for a in accepted]
    return Walk(accepted, [tree.tokens[a] for a in accepted] + [read[n + len(accepted)]], n + 1,
                rows_of(logits, picked), None if raw is None else rows_of(raw, picked))


def keyed_walk(tree: DraftTree, logits_of: LazyHead, pipe: LogitsPipeline) -> Walk:
    """Seeded sampling verification: the target's sample at each position is the inverse-CDF draw of the uniform
    that the seed and the position fix (:func:`~microspec.decoding.processors.keyed_uniform`), from the target's
    distribution there (processors with the node's own path, the warpers); a drafted child is accepted exactly
    when it is that sample, and the first sample the tree lacks is the bonus token.  The committed tokens are those
    plain decoding draws with the same seed, whatever was drafted: each follows the target's distribution exactly
    (a fresh uniform per position), and a child is accepted with probability p(child), as deterministic drafts are
    by rejection sampling."""
    def keyed(row: int, logits: torch.Tensor, depth: int) -> int:
        return int(pipe.choose(logits[None], pipe.position + depth))

    return _follow(tree, logits_of, pipe, keyed)


def sample_walk(tree: DraftTree, logits_of: LazyHead, pipe: LogitsPipeline) -> Walk:
    """Lossless sampling verification (recursive rejection over each sibling set), for unseeded sampling.

    At each visited row the target distribution p (processors with the node's own path, temperature, top-p) meets
    the row's children in order.  A child x is accepted with probability min(1, p(x) / q(x)); on rejection p becomes
    the residual norm(max(0, p - q)) and the next sibling is tried.  q is the distribution the siblings were drawn
    from: the point mass on x for deterministic drafts (so acceptance is p(x) and the residual is p without x);
    the parent's draft distribution for iid draws; and that distribution with the earlier draws removed and
    renormalised for draws without replacement.  When every sibling is rejected, the bonus token is drawn from
    the last residual.  The committed tokens then follow the target's distribution exactly.
    """
    children = tree.children()
    gen = pipe.generator
    row, path_tokens, accepted, chosen_from = 0, [], [], []
    raw = [] if pipe.keep_raw else None
    while True:
        logits = logits_of(row)[None]
        if raw is not None:
            raw.append(logits[0].clone())
        if pipe.active:  # in place, as in _follow
            logits = pipe.process(logits, [path_tokens])
        chosen_from.append(logits[0])
        p = pipe.probs(logits)[0]
        chosen = None
        q = None
        for c in children[row]:
            x = tree.tokens[c]
            if tree.scheme == "deterministic":
                accept = p[x]
            else:
                if q is None:  # all siblings were drawn from the same parent distribution
                    q = tree.q[c].to(p.device, torch.float32)
                accept = torch.clamp(p[x] / q[x], max=1.0) if q[x] > 0 else torch.zeros((), device=p.device)
            if float(torch.rand((), generator=gen, device=p.device)) < float(accept):
                chosen = c
                break
            if tree.scheme == "deterministic":
                p = p.clone()
                p[x] = 0
            else:
                p = torch.clamp(p - q, min=0)
                if tree.scheme == "without-replacement":
                    q = q.clone()
                    q[x] = 0
                    q = q / q.sum() if q.sum() > 0 else q
            total = p.sum()
            if total <= 0:  # cannot happen in exact arithmetic; guard against rounding
                p = pipe.probs(logits)[0]
                break
            p = p / total
        if chosen is None:
            bonus = int(sample(p, gen))
            return Walk(accepted, path_tokens + [bonus], logits_of.computed, chosen_from, raw)
        accepted.append(chosen)
        path_tokens.append(tree.tokens[chosen])
        row = chosen + 1
