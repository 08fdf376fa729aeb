"""The draft head: logits of draft hidden states over an *active vocabulary*, ids mapped back to the full one.

Every drafter with an LM head computes its logits here and nowhere else, so a vocabulary policy (MicroSpec's
in-context vocabulary, a static shortlist, a trained router) changes what the drafts cost and cover — and cannot
change what the target accepts, because verification always uses the full vocabulary.

At each call the head asks the policy for the set of draft depth ``depth``, reads it as an
:class:`~microspec.vocab.active.ActiveRows` (the same few questions whatever the set) and computes, by what it is:
- the whole vocabulary (the policy answers None): the whole [V, d] weight (EAGLE-2);
- a packed buffer (:class:`~microspec.vocab.packed.PackedRows`): one dense matmul over its leading rows, free slots
  masked to -inf — the policy copied only the rows that entered the set;
- an id list: the indexed path, ``W[idx] @ h`` — rows gathered whenever the list changes (the ablation baseline),
  or, for a policy made with ``--gather fused``, a Triton kernel that reads the rows inside the matmul
  (:mod:`microspec.kernels`);
- a prefix of a fixed order (:class:`~microspec.vocab.active.RankedPrefix`: a static shortlist under a per-depth
  budget): the order's rows gathered once, each budget a view of their leading rows.
It keeps the time it spent (``seconds``, device-timed) and the size of each set it used (``sizes``).
"""

from __future__ import annotations

import torch

from ..decoding.stats import DeviceTimer
from ..errors import check
from ..models.quant import product
from ..runtime import Runtime
from ..vocab.active import ActiveRows, as_active
from ..vocab.base import VocabPolicy


class DraftVocabRows:
    """An LM head with a draft vocabulary of its own (EAGLE-3's ``d2t``): ``rows`` [V_draft, d], row r scoring target
    id ``ids[r]``, seen by vocabulary policies and the draft head as a [V, d] matrix of the whole vocabulary.

    Without ``fallback`` (*intersect*), rows of ids outside the draft vocabulary read as row 0 and the draft head
    masks them to -inf wherever they are scored, so a restricted set (MicroSpec's, a shortlist) is intersected with
    the draft vocabulary.  With ``fallback`` [V, d] (*replace*: the target's own LM head), those ids read the
    fallback's rows instead and are scored like the others, so a restricted set replaces the draft vocabulary (an
    unrestricted draft still scores the head's own rows only)."""

    def __init__(self, rows, ids: torch.Tensor, vocab_size: int, fallback=None):
        self.rows = rows
        self.ids = ids.to(torch.long)
        self.fallback = fallback
        self.row_of = torch.full((vocab_size + 1,), -1, dtype=torch.long, device=self.ids.device)
        self.row_of[self.ids] = torch.arange(self.ids.numel(), device=self.ids.device)
        self.own = self.row_of >= 0  # [V + 1]: index V (and -1) is False
        # the ids the draft head may score: its own (intersect), or every id (replace); index V (a free slot) never
        self.present = self.own if fallback is None else torch.arange(vocab_size + 1, device=self.ids.device) < vocab_size
        self.shape = torch.Size((vocab_size, rows.shape[1]))

    @property
    def device(self) -> torch.device:
        return self.rows.device

    @property
    def dtype(self) -> torch.dtype:
        return self.rows.dtype

    def _rows_of(self, ids: torch.Tensor) -> torch.Tensor:
        return self.row_of[ids.to(torch.long)].clamp(min=0)

    def index_select(self, dim: int, ids: torch.Tensor):
        check(dim == 0, "a draft vocabulary selects rows only")
        if self.fallback is not None:
            return self[ids]  # rows from two matrices: unpacked (a restricted set's few thousand rows)
        return self.rows.index_select(0, self._rows_of(ids))

    def __getitem__(self, ids):
        ids = torch.as_tensor(ids).to(torch.long)
        if self.fallback is None:
            return self.rows[self._rows_of(ids)]
        own = self.own[ids]
        out = self.fallback[ids].to(self.dtype)
        if bool(own.any()):
            out[own] = self.rows[self.row_of[ids[own]]].to(out.dtype)
        return out

    def new_zeros(self, *size, **kwargs) -> torch.Tensor:
        return self.rows.new_zeros(*size, **kwargs)


class DraftHead:
    """The draft head over ``weight`` [V, d] (shared with the model it came from, no copy), scoring the sets of
    ``policy`` (None: the whole vocabulary).  The head is the policy's only contact while drafting: it asks for the
    sets, hands a router what the draft network was fed (:meth:`route`) and a ranker the hidden states it scores."""

    def __init__(self, weight: torch.Tensor | DraftVocabRows, softcap: float | None = None,
                 policy: VocabPolicy | None = None, norm=None, runtime: Runtime | None = None):
        """``runtime``: the target's (None: the runtime of ``weight``'s device), for the head's timer and the
        kernel plan of its dense products."""
        self.weight = weight
        self.softcap = softcap
        self.norm = norm  # applied to the hidden states before scoring (an EAGLE-3 head's final norm)
        self.mapped = weight if isinstance(weight, DraftVocabRows) else None
        self.vocab_size = weight.shape[0]
        self.policy = policy
        self.selected: ActiveRows = self._as_active(None)  # the set the last logits() call scored
        self._source: torch.Tensor | None = None  # the id list (or a prefix's order) whose rows are in _rows
        self._rows: torch.Tensor | None = None
        self._inverse: tuple[torch.Tensor, torch.Tensor] | None = None  # (id list, [V] column of each id or -1)
        self._fused = policy is not None and policy.fused
        check(not (self._fused and self.mapped is not None),
              "--gather fused reads rows of the full vocabulary: not with a head that has a draft vocabulary")
        self.runtime = Runtime.of(runtime or weight.device)
        self.timer = DeviceTimer(self.runtime)
        self.graphs = None  # a GraphedCall once use_cuda_graphs(True): the packed product replayed
        self.sizes: list = []  # active size of each call (device scalars for packed buffers: read at the end)
        if policy is not None:
            policy.attach(weight)

    # ---------------------------------------------------------------- what to score
    @property
    def active(self):
        """What the policy answered for the last :meth:`logits` call (None: the whole vocabulary; an id tensor, a
        packed buffer, a ranked prefix)."""
        return self.selected.answer

    def matrix(self):
        """The rows the head multiplies for the set of the last :meth:`logits` call ([A, d]: the whole head, the
        gathered rows, a prefix of them or a packed buffer's extent)."""
        return self.selected.matrix(self.weight, self._rows)

    def _as_active(self, answer) -> ActiveRows:
        return as_active(answer, self.vocab_size, self.mapped)

    def route(self, inputs: tuple[torch.Tensor, torch.Tensor] | None, depth: int) -> None:
        """Before scoring ``depth``: tell a routing policy what the draft network was fed, ``inputs`` = (token
        embeddings, input features) of the nodes whose next tokens are scored (None: a drafter that feeds no
        features)."""
        policy = self.policy
        if policy is not None and policy.wants_draft_inputs:
            check(inputs is not None,
                  f"vocabulary policy {policy.name!r} routes on the draft's inputs: it needs the eagle drafter")
            policy.on_draft_inputs(*inputs, depth)

    def _select(self, depth: int) -> ActiveRows:
        active = self._as_active(self.policy.active(depth) if self.policy is not None else None)
        source = active.source
        if source is not None and source is not self._source and not self._fused:
            self._source = source
            self._rows = self.weight.index_select(0, source)  # the indexed path: W[idx]
        self.selected = active
        # a head with a draft vocabulary of its own scores its rows when unrestricted (a restricted set may hold ids
        # outside it: they are masked, and counted as the rows the product read)
        self.sizes.append(active.size())
        return active

    # ---------------------------------------------------------------- scoring
    def logits(self, hidden: torch.Tensor, depth: int = 0, pipe=None, paths=None) -> torch.Tensor:
        """fp32 logits [R, A] over the set of ``depth``, one column per id (A = V when unrestricted; for a packed
        buffer, one per leading slot, -inf at free slots).  With a :class:`~microspec.decoding.processors
        .LogitsPipeline` ``pipe`` whose processors are active, they are applied as the target's verification applies
        them, row r's history being the committed sequence plus ``paths[r]`` (the draft path to that row's node):
        host lists, or a device tensor [R, W] of ids with -1 padding (a tree drafted on the device)."""
        out = self._logits(hidden, depth)
        if pipe is not None and pipe.active:
            with self.timer:
                if isinstance(paths, torch.Tensor):
                    cols = self.to_full_ids(torch.arange(out.shape[-1], device=out.device))
                    out = pipe.process_on_device(out, paths, cols)
                else:
                    out = pipe.process_columns(out, self.columns_of, paths if paths is not None else
                                               [()] * out.shape[0],
                                               lambda: self.to_full_ids(torch.arange(out.shape[-1],
                                                                                     device=out.device)))
        return out

    def _logits(self, hidden: torch.Tensor, depth: int) -> torch.Tensor:
        with self.timer:
            if self.norm is not None:
                hidden = self.norm(hidden)
            out = self._scores(hidden, depth)
            if self.mapped is not None and not self.selected.whole:  # ids outside the draft vocabulary
                out.masked_fill_(~self.mapped.present[self.to_full_ids(
                    torch.arange(out.shape[-1], device=out.device))], float("-inf"))
            return out

    def _scores(self, hidden: torch.Tensor, depth: int) -> torch.Tensor:
        if self.policy is not None and self.policy.wants_head_input:
            self.policy.on_head_input(hidden, depth)
        active = self._select(depth)
        if self.graphs is not None and hidden.is_cuda and active.fixed_shape:  # fixed shape (packed): one graph
            out = self.graphs((id(active), hidden.shape, hidden.dtype), lambda h: self._product(h, active), hidden,
                              owner=active)
            if out is not None:
                return out
        listed = active.listed if self._fused else None
        if listed is not None:
            from ..kernels.gather_matmul import gather_matmul

            return self._cap(gather_matmul(hidden, self.weight, listed))
        return self._product(hidden, active)

    def _product(self, hidden: torch.Tensor, active: ActiveRows) -> torch.Tensor:
        """One product over the set's rows (the whole weight, the gathered rows or a view of their leading ones, a
        packed buffer's leading slots), columns holding no id at -inf."""
        out = self._matmul(hidden, active.matrix(self.weight, self._rows))
        free = active.free()
        return out if free is None else out.masked_fill_(free, float("-inf"))

    def use_cuda_graphs(self, on: bool = True) -> None:
        """Replay the packed head's product and mask as a CUDA graph (on CUDA, with a fixed-shape buffer)."""
        from ..models.graphs import GraphedCall

        self.graphs = GraphedCall() if on else None

    def _matmul(self, hidden: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self._cap(product(hidden, w, self.runtime.kernels))  # (rows of a GGUF head kept packed stay packed)

    def _cap(self, out: torch.Tensor) -> torch.Tensor:
        return torch.tanh(out / self.softcap) * self.softcap if self.softcap is not None else out

    def columns_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Columns [n] of the last :meth:`logits` call that hold ``ids`` (-1 for an id outside the set)."""
        return self.selected.columns_of(ids, self._inverse_of)

    def _inverse_of(self, source: torch.Tensor) -> torch.Tensor:
        """[V]: the position of each id in the id list ``source`` (-1: absent), kept while ``source`` is the list."""
        if self._inverse is None or self._inverse[0] is not source:
            inverse = torch.full((self.vocab_size,), -1, dtype=torch.long, device=source.device)
            inverse[source] = torch.arange(source.numel(), device=source.device)
            self._inverse = (source, inverse)
        return self._inverse[1]

    def to_full_ids(self, columns: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary ids of columns of the last :meth:`logits` call."""
        return self.selected.to_full_ids(columns)

    def topk(self, hidden: torch.Tensor, k: int, depth: int = 0, pipe=None,
             paths=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probabilities [R, k], full-vocabulary ids [R, k]) of the k most probable active tokens (a set
        smaller than k, or a top-p nucleus, yields -inf entries, which drafters skip).  With ``pipe``: under the
        decoding's processors (see :meth:`logits`) and, when sampling, its temperature and top-p."""
        if self.graphs is not None and hidden.is_cuda \
                and self._as_active(getattr(self.policy, "packed", None)).fixed_shape \
                and self.norm is None and self.mapped is None and not self.policy.wants_head_input \
                and (pipe is None or (pipe.cfg.greedy and not pipe.active)):
            with self.timer:  # the packed head whole (product, mask, log-softmax, top-k, ids) as one graph
                active = self._select(depth)  # that buffer
                k = min(k, active.extent)
                out = self.graphs((id(active), "topk", k, hidden.shape, hidden.dtype),
                                  lambda h: self._product_topk(h, active, k), hidden, owner=active)
                return out if out is not None else self._product_topk(hidden, active, k)  # not capturable: eager
        logits = self.logits(hidden, depth, pipe, paths)
        logp = pipe.draft_logp(logits) if pipe is not None else torch.log_softmax(logits, dim=-1)
        k = min(k, logp.shape[-1])
        values, cols = torch.topk(logp, k, dim=-1)
        return values, self.to_full_ids(cols)

    # ---------------------------------------------------------------- the draft in fixed shapes (one graph)
    def fixed_active(self, depths: int, graphed: bool) -> tuple[bool, ActiveRows | None]:
        """Whether depths ``0..depths-1`` can be scored by :meth:`fixed_topk` inside one graph of the whole draft, and
        their one active set (an :class:`~microspec.vocab.active.ActiveRows`).  It can when the head has no draft
        vocabulary of its own, no policy hears the draft's inputs or ranks by the head's input, and every depth scores
        the same set (:meth:`~microspec.vocab.active.ActiveRows.fits_fixed`): the whole vocabulary, an id list (its
        rows gathered here, outside the graph) or a packed buffer (of fixed shape where ``graphed``: its extent is not
        read).  Records the sets' sizes as :meth:`logits` would."""
        policy = self.policy
        if self.mapped is not None or self._fused or (policy is not None and (
                policy.wants_head_input or policy.wants_draft_inputs)):
            return False, None
        first = policy.active(0) if policy is not None else None
        chosen = self._as_active(first)
        if not chosen.fits_fixed(graphed) \
                or (policy is not None and any(policy.active(d) is not first for d in range(1, depths))):
            return False, None
        self._select(0)
        self.sizes += self.sizes[-1:] * (depths - 1)  # one set for every depth: its size counted once
        return True, chosen

    def fixed_inputs(self, active) -> tuple[torch.Tensor, ...]:
        """What :meth:`fixed_topk` reads of a set :meth:`fixed_active` accepted: nothing for the whole vocabulary (the
        weight itself), a packed buffer's leading rows and the id of each slot (-1: free), an id list's gathered rows
        and the ids.  A graph of the whole draft copies them into inputs of its own at each replay, so that it serves
        the sets of later generations too (each generation has a policy of its own)."""
        return self._as_active(active).fixed_inputs(self._rows)

    def fixed_topk(self, hidden: torch.Tensor, k: int, inputs: tuple[torch.Tensor, ...], pipe=None,
                   paths: torch.Tensor | None = None, states=None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`topk` over a set given by its :meth:`fixed_inputs`, with no timer and no bookkeeping: the same
        operations, fit to run inside a CUDA graph of the whole draft.  With ``paths`` (the rows' paths, a device
        tensor), ``pipe``'s processors apply as :meth:`logits` applies them, reading ``states`` (their graph
        state's tensors)."""
        if self.norm is not None:
            hidden = self.norm(hidden)
        ids = None
        if inputs:
            rows, ids = inputs
            logits = self._matmul(hidden, rows).masked_fill_(ids < 0, float("-inf"))  # a packed buffer's free slots
        else:
            logits = self._matmul(hidden, self.weight)
        if paths is not None:
            logits = pipe.process_on_device(logits, paths, ids, states)
        logp = pipe.draft_logp(logits) if pipe is not None else torch.log_softmax(logits, dim=-1)
        values, cols = torch.topk(logp, min(k, logp.shape[-1]), dim=-1)
        return values, cols if ids is None else ids[cols]

    def _product_topk(self, hidden: torch.Tensor, active: ActiveRows, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        values, cols = torch.topk(torch.log_softmax(self._product(hidden, active), dim=-1), k, dim=-1)
        return values, active.to_full_ids(cols)

    def full_distribution(self, probs_active: torch.Tensor) -> torch.Tensor:
        """Scatter a distribution over the columns of the last :meth:`logits` call [R, A] into the full vocabulary
        [R, V] (zeros elsewhere)."""
        if self.selected.whole and self.mapped is None:
            return probs_active
        ids = self.to_full_ids(torch.arange(probs_active.shape[-1], device=probs_active.device))
        out = probs_active.new_zeros(probs_active.shape[0], self.vocab_size + 1)
        out[:, torch.where(ids >= 0, ids, self.vocab_size)] = probs_active  # free slots carry 0 mass: dropped
        return out[:, : self.vocab_size]
