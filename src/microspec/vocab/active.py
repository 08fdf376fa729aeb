"""What the draft head scores: the active set behind one interface, whatever a policy answered.

A policy's ``active(depth)`` answers None (the whole vocabulary), a 1-D tensor of ids, a
:class:`~microspec.vocab.packed.PackedRows` buffer or a :class:`RankedPrefix`; :func:`as_active` turns the answer into
an :class:`ActiveRows` (the last two are ones already, None becomes a :class:`Whole`, a tensor an :class:`IdList`), so
the draft head asks every set the same few questions and never its kind:
- ``size()``: how many ids (a device scalar for a packed buffer: no synchronisation);
- ``contains(ids)``: which of ``ids`` are in the set, without waiting for a GPU;
- ``source``: the ids whose rows the head gathers once per set (an id list, a prefix's whole order; None: none);
  ``listed``: the ids as one list a kernel reads rows by (``--gather fused``; None: whole vocabulary, packed buffer);
- ``matrix(weight, gathered)``: the [A, d] rows the product multiplies, ``free()``: the columns it masks to -inf;
- ``columns_of(ids, inverse)`` / ``to_full_ids(columns)``: between the logits' columns and full-vocabulary ids;
- ``fits_fixed(graphed)`` / ``fixed_inputs(gathered)``: whether the set goes into one graph of the whole draft, and
  the tensors that graph reads; ``fixed_shape``: whether the head's product over it can be captured on its own.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

Inverse = Callable[[torch.Tensor], torch.Tensor]  # an id list -> [V] the column of each id in it (-1: absent)


class ActiveRows(ABC):
    """The set the draft head scores at one depth (see the module docstring)."""

    whole = False  # the whole vocabulary (the columns are the head's own rows)
    fixed_shape = False  # the product over it has shapes a CUDA graph can capture (a packed buffer on CUDA)
    source: torch.Tensor | None = None
    listed: torch.Tensor | None = None

    @property
    def answer(self):
        """What the policy answered (None, an id tensor, or this set itself)."""
        return self

    @abstractmethod
    def size(self) -> torch.Tensor | int:
        """Number of ids (a device scalar for a packed buffer)."""

    @abstractmethod
    def contains(self, ids: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        """[n] bool: which of ``ids`` are in the set; ``cache``: see :func:`listed_contains`."""

    @abstractmethod
    def matrix(self, weight, gathered):
        """The rows the head multiplies: of ``weight`` [V, d], or of ``gathered`` (``weight``'s rows of
        :attr:`source`, gathered by the head)."""

    def free(self) -> torch.Tensor | None:
        """[A] bool: columns of the product that hold no id (masked to -inf); None: every column holds one."""
        return None

    @abstractmethod
    def columns_of(self, ids: torch.Tensor, inverse: Inverse) -> torch.Tensor:
        """Columns [n] of the product that hold ``ids`` (-1 for an id outside the set); ``inverse`` maps an id list to
        each id's position in it (the head keeps it while the list lives)."""

    @abstractmethod
    def to_full_ids(self, columns: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary ids of columns of the product (-1: a free column)."""

    def fits_fixed(self, graphed: bool) -> bool:
        """Whether one graph of the whole draft (or, unless ``graphed``, its fixed-shape eager run) can score it."""
        return False

    def fixed_inputs(self, gathered) -> tuple[torch.Tensor, ...]:
        """The tensors such a draft reads: none (the weight itself), or (rows [A, d], the id of each row, -1 free)."""
        raise NotImplementedError(f"{type(self).__name__} is not scored in one graph of the whole draft")


class Whole(ActiveRows):
    """The whole vocabulary: ``vocab_size`` rows, or those of a head with a draft vocabulary of its own (``mapped``,
    a :class:`~microspec.drafters.head.DraftVocabRows`: its ``rows``, the target id of each, the row of each id)."""

    whole = True

    def __init__(self, vocab_size: int | None = None, mapped=None):
        self.vocab_size = vocab_size
        self.mapped = mapped

    @property
    def answer(self) -> None:
        return None

    def size(self) -> int:
        return self.vocab_size if self.mapped is None else self.mapped.rows.shape[0]

    def contains(self, ids: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        return torch.ones(ids.shape, dtype=torch.bool, device=ids.device)

    def matrix(self, weight, gathered):
        return weight if self.mapped is None else self.mapped.rows

    def columns_of(self, ids: torch.Tensor, inverse: Inverse) -> torch.Tensor:
        return ids if self.mapped is None else self.mapped.row_of[ids]

    def to_full_ids(self, columns: torch.Tensor) -> torch.Tensor:
        return columns if self.mapped is None else self.mapped.ids[columns]

    def fits_fixed(self, graphed: bool) -> bool:
        return True

    def fixed_inputs(self, gathered) -> tuple[torch.Tensor, ...]:
        return ()


class IdList(ActiveRows):
    """A 1-D tensor of ids: the head gathers their rows (``W[idx]``) whenever the tensor changes (the indexed
    path)."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids

    @property
    def answer(self) -> torch.Tensor:
        return self.ids

    @property
    def source(self) -> torch.Tensor:
        return self.ids

    @property
    def listed(self) -> torch.Tensor:
        return self.ids

    def size(self) -> int:
        return self.ids.numel()

    def contains(self, ids: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        return listed_contains(self.ids, ids, cache)

    def matrix(self, weight, gathered):
        return gathered

    def columns_of(self, ids: torch.Tensor, inverse: Inverse) -> torch.Tensor:
        return inverse(self.ids)[ids.to(self.ids.device)]

    def to_full_ids(self, columns: torch.Tensor) -> torch.Tensor:
        return self.ids[columns]

    def fits_fixed(self, graphed: bool) -> bool:
        return True

    def fixed_inputs(self, gathered) -> tuple[torch.Tensor, ...]:
        return gathered, self.ids


@dataclass(frozen=True, eq=False)
class RankedPrefix(ActiveRows):
    """The first ``n`` ids of ``order``, one fixed ranking (the same tensor every step): what a static shortlist
    answers under a per-depth budget (PA-FR).  The draft head gathers ``order``'s rows once and scores a prefix view
    of them, so the depths' budgets cost no gather of their own."""

    order: torch.Tensor
    n: int

    @property
    def ids(self) -> torch.Tensor:
        return self.order[: self.n]

    @property
    def source(self) -> torch.Tensor:
        return self.order

    @property
    def listed(self) -> torch.Tensor:
        return self.ids

    def size(self) -> int:
        return self.n

    def contains(self, ids: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        return listed_contains(self.ids, ids, cache)

    def matrix(self, weight, gathered):
        # a view of the order's leading rows; rows of a GGUF head kept packed stay packed (their own ``leading``)
        return gathered.leading(self.n) if hasattr(gathered, "leading") else gathered[: self.n]

    def columns_of(self, ids: torch.Tensor, inverse: Inverse) -> torch.Tensor:
        cols = inverse(self.order)[ids.to(self.order.device)]
        return cols.masked_fill(cols >= self.n, -1)

    def to_full_ids(self, columns: torch.Tensor) -> torch.Tensor:
        return self.ids[columns]


def as_active(answer, vocab_size: int | None = None, mapped=None) -> ActiveRows:
    """A policy's answer as an :class:`ActiveRows`: None is the whole vocabulary (of ``vocab_size`` ids, or the rows
    of ``mapped``), a tensor an id list; a set that is one already is returned as it is."""
    if isinstance(answer, ActiveRows):
        return answer
    if answer is None:
        return Whole(vocab_size, mapped)
    return IdList(answer)


def listed_contains(listed: torch.Tensor, ids: torch.Tensor, cache: list | None = None) -> torch.Tensor:
    """[n] bool: which of ``ids`` are in the id list ``listed``, without waiting for a GPU: a binary search of its
    sorted ids (``torch.isin`` over a set of thousands takes ATen's sorting path, whose ``unique`` reads its size
    back).  ``cache``: a list that keeps the last list's sorted ids while that list lives."""
    ids = ids.to(listed.device)
    if listed.numel() == 0:
        return torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
    if cache and cache[0][0]() is listed:
        order = cache[0][1]
    else:
        order = listed.reshape(-1).sort().values
        if cache is not None:
            cache[:] = [(weakref.ref(listed), order)]
    at = torch.searchsorted(order, ids.to(order.dtype)).clamp_(max=order.numel() - 1)
    return order[at] == ids
