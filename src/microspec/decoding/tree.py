"""Token trees: what a drafter proposes and what the target verifies in one forward pass.

A tree hangs below the *root*, the last committed token that the target has not yet seen (the previous step's bonus
token).  Node ``i`` has token ``tokens[i]`` and parent ``parents[i]`` (-1 = the root); parents come before children,
and siblings are ordered most probable first.  A chain is a tree whose node ``i`` has parent ``i - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..kernels import tree_ops
from ..transfer import to_device

SCHEMES = ("deterministic", "iid", "without-replacement")


def path_to(parents: list[int], node: int) -> list[int]:
    """Nodes from the root's child down to ``node`` (parent -1 is the root)."""
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


@dataclass
class DraftTree:
    """How the siblings below one parent were chosen decides how sampling verification must treat them:

    - ``deterministic``: picked without randomness (n-gram lookup, top-k of a draft distribution); no ``q`` needed;
    - ``iid``: each sibling drawn independently from the parent's draft distribution ``q`` (a sampled chain is this
      with one child per node);
    - ``without-replacement``: siblings drawn one after another from ``q`` with earlier draws removed.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    # The draft distribution each node's token was drawn from (that of its parent), [N, V] over the full vocabulary;
    # needed for the iid and without-replacement schemes.
    q: torch.Tensor | None = None
    scheme: str = "deterministic"
    # the tree as built on the device, set by :class:`DeviceTree` only (tokens [N], parents [N], depths [N], the
    # ancestor-or-self matrix [N, N], valid [N]): the verify pass's inputs and the device walk are made from it with
    # no host work per node
    on_device: tuple[torch.Tensor, ...] | None = field(default=None, compare=False, repr=False)
    # where the proposal came from, for what the step feeds the vocabulary policy and the coverage (the drafter that
    # proposed it says so): "head", the draft head (and its draft vocabulary) drafted it, or nothing asked it;
    # "copy", a chain copied from the text that still feeds the policy the target's verified logits (prompt lookup
    # first: its chains enter MicroSpec's stream); "aside", drafted without the head and feeding the policy the
    # committed tokens only (auto's other arms: the top-k over the full vocabulary would tax every such step).
    # Coverage is read at "head" steps only
    origin: str = field(default="head", compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents differ in length")
        if self.scheme not in SCHEMES:
            raise ValueError(f"unknown sampling scheme {self.scheme!r}")
        if self.scheme != "deterministic" and self.tokens and (self.q is None or self.q.shape[0] != len(self)):
            raise ValueError(f"scheme {self.scheme!r} needs q with one row per node")
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"node {i} has parent {p}: parents must come before children")

    @classmethod
    def chain(cls, tokens: list[int], q: torch.Tensor | None = None) -> "DraftTree":
        """A chain; with ``q`` its tokens were sampled from q (scheme iid), else chosen deterministically."""
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), q, "iid" if q is not None else "deterministic")

    def first(self, n: int) -> "DraftTree":
        """The first ``n`` nodes (a prefix-closed subtree, since parents come before children)."""
        if n >= len(self):
            return self
        return DraftTree(self.tokens[:n], self.parents[:n], self.q[:n] if self.q is not None else None, self.scheme,
                         origin=self.origin)

    def from_(self, origin: str) -> "DraftTree":
        """This tree, proposed from ``origin`` (see :attr:`origin`)."""
        self.origin = origin
        return self

    def __len__(self) -> int:
        return len(self.tokens)

    def drafted(self) -> list[int]:
        """The tokens of the nodes drafted (:class:`DeviceTree` leaves its padding nodes out)."""
        return self.tokens

    def depths(self) -> list[int]:
        """Depth of each node, the root's children having depth 1."""
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    def children(self) -> list[list[int]]:
        """Children of each row of the verify pass: row 0 is the root, row i + 1 is node i."""
        ch: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents):
            ch[p + 1].append(i)
        return ch

    def truncated(self, max_depth: int) -> "DraftTree":
        """The nodes of depth <= max_depth (they form a prefix-closed set, so indices are re-mapped in order)."""
        if max_depth <= 0:
            return DraftTree(origin=self.origin)
        return self.subset([i for i, d in enumerate(self.depths()) if d <= max_depth])

    def subset(self, keep: list[int]) -> "DraftTree":
        """The nodes ``keep`` (increasing, each node's parent among them: a prefix-closed set), re-mapped in order."""
        if len(keep) == len(self):
            return self
        remap = {old: new for new, old in enumerate(keep)}
        q = self.q[keep] if self.q is not None else None
        return DraftTree([self.tokens[i] for i in keep], [remap.get(self.parents[i], -1) for i in keep], q,
                         self.scheme, origin=self.origin)

    def causal(self) -> bool:
        """Whether each node's parent is the node before it (a chain): then the verify pass is causal at the slots
        it fills, a forward's default positions and mask."""
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def verify_ids(self, root: int, device: torch.device) -> torch.Tensor:
        """The verify pass's ids [N+1]: root then nodes."""
        return to_device([root] + self.tokens, device)

    def verify_inputs(self, root: int, start: int, device: torch.device):
        """(ids [N+1], positions [N+1], mask [N+1, N+1]) of the verify pass: root then nodes, each row seeing its
        ancestors and itself; the root sits at position ``start`` (the cache length)."""
        if self.on_device is not None and self.on_device[0].device == torch.device(device):
            return self._verify_inputs_on_device(root, start)
        n = len(self) + 1
        ids = to_device([root] + self.tokens, device)
        positions = to_device([start + d for d in [0] + self.depths()], device)
        mask = torch.zeros(n, n, dtype=torch.bool)
        mask[:, 0] = True
        for i, p in enumerate(self.parents):
            row = i + 1
            mask[row] = mask[p + 1]
            mask[row, row] = True
        mask[0, 0] = True
        return ids, positions, to_device(mask, device, torch.bool)

    def _verify_inputs_on_device(self, root: int, start: int):
        tokens, _, depths, anc = self.on_device[:4]
        return tree_ops.verify_inputs(root, start, tokens, depths, anc)  # one launch where Triton runs


class DeviceTree(DraftTree):
    """A tree built on the device (:func:`~microspec.drafters.tree_search.dynamic_tree_on_device`) whose host lists
    are read back only when something asks for them: the verify pass's inputs are made from its tensors, and a walk
    on the device (:func:`~microspec.decoding.verify.device_walk`) reads them in the same transfer as its acceptance
    (:meth:`fill`), so such a step reads the host once.  ``on_device`` is (tokens, parents, depths, ancestor-or-self
    matrix, valid): a node whose score was -inf (fewer candidates than the tree's budget: a draft vocabulary smaller
    than top-k) is kept as a node of token 0 so that no read decides the tree's size, and no walk accepts it
    (:meth:`children` leaves it out on the host, the device walk masks it).  ``depth``: the depth it was built to
    (a cut to that depth keeps it whole, no read needed)."""

    chained = False  # a chain (chain_of, or a host chain copied over): causal() without reading the host lists

    def __init__(self, on_device: tuple[torch.Tensor, ...], depth: int) -> None:
        self.q, self.scheme, self.on_device, self.depth = None, "deterministic", on_device, depth
        self._host: tuple[list[int], list[int], list[int]] | None = None

    def causal(self) -> bool:
        return self.chained or (self._host is not None and all(self._host[2]) and super().causal())

    def verify_ids(self, root: int, device: torch.device) -> torch.Tensor:
        return torch.cat([to_device([root], self.on_device[0].device), self.on_device[0]])

    def _lists(self) -> tuple[list[int], list[int], list[int]]:
        if self._host is None:
            tokens, parents, _, _, valid = self.on_device
            self.fill(*torch.stack([tokens, parents, valid.long()]).tolist())
        return self._host

    @classmethod
    def chain_of(cls, tokens: torch.Tensor, q: torch.Tensor | None = None) -> "DeviceTree":
        """A chain of the device tensor ``tokens`` [n] (node i's parent i - 1), nothing read back; with ``q`` [n, V]
        its tokens were sampled, node i from ``q[i]`` (scheme iid)."""
        n, dev = tokens.numel(), tokens.device
        idx = torch.arange(n, device=dev)
        anc = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
        out = cls((tokens, idx - 1, idx + 1, anc, torch.ones(n, dtype=torch.bool, device=dev)), n)
        out.chained = True
        if q is not None:
            out.q, out.scheme = q, "iid"
        return out

    @classmethod
    def of(cls, tree: DraftTree, device: torch.device) -> "DeviceTree | None":
        """A deterministic tree built on the host (a lookup's chain, a suffix trie's tree) copied to ``device``, so
        that the device walk takes it and the step reads the host once: its lists stay here (nothing to read
        back), its tensors go over in two copies that do not make the host wait.  None where the device walk
        cannot take it: a sampled tree (its ``q``), or siblings of one token (the walk accepts at most one node a
        depth because siblings differ)."""
        if tree.scheme != "deterministic" or len(set(zip(tree.parents, tree.tokens))) != len(tree):
            return None
        n, depths = len(tree), tree.depths()
        anc: list[list[bool]] = []  # row i: node i's ancestors and itself
        for i, p in enumerate(tree.parents):
            anc.append(anc[p][:] if p >= 0 else [False] * n)
            anc[i][i] = True
        lists = to_device(tree.tokens + tree.parents + depths, device).view(3, n)
        out = cls((lists[0], lists[1], lists[2], to_device(anc, device, torch.bool),
                   torch.ones(n, dtype=torch.bool, device=device)), max(depths))
        out.fill(list(tree.tokens), list(tree.parents), [1] * n)
        out.origin, out.chained = tree.origin, tree.causal()
        return out

    @property
    def read_back(self) -> bool:
        """Whether the host lists are here."""
        return self._host is not None

    def fill(self, tokens: list[int], parents: list[int], valid: list[int]) -> None:
        """The host lists, read by the caller together with something else (the device walk's acceptance)."""
        self._host = (tokens, parents, valid)

    @property
    def tokens(self) -> list[int]:
        return self._lists()[0]

    @property
    def parents(self) -> list[int]:
        return self._lists()[1]

    def drafted(self) -> list[int]:
        """The tokens of the nodes actually drafted (the -inf padding left out)."""
        tokens, _, valid = self._lists()
        return [t for t, v in zip(tokens, valid) if v]

    def __len__(self) -> int:
        return self.on_device[0].numel()

    def children(self) -> list[list[int]]:
        """:meth:`DraftTree.children` without the padding nodes: no walk, on the host or the device, accepts one."""
        valid = self._lists()[2]
        return [[c for c in row if valid[c]] for row in super().children()]

    def first(self, n: int) -> DraftTree:
        return self if n >= len(self) else super().first(n)

    def truncated(self, max_depth: int) -> DraftTree:
        return self if max_depth >= self.depth else super().truncated(max_depth)
