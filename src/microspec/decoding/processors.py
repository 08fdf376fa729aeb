"""Logits processors with Hugging Face ``generate`` semantics, and the choice of the next token.

Both processors keep incremental state over the committed sequence (prompt included, as in HF) and can be applied to
rows whose history is the committed sequence plus a few extra tokens: the path of a draft-tree node.  Verification
applies them that way to each node, so speculative output equals autoregressive output under them too.

Drafts apply the same processors to the draft head's logits (:meth:`LogitsPipeline.process_columns`), whose columns
are a subset of the vocabulary: only the columns of ids a processor touches are changed (the ids already seen, for
the repetition penalty; the banned ids, for no-repeat-n-gram), so the cost follows the text, not the vocabulary.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from ..errors import check
from ..kernels import penalty as penalty_kernel
from ..kernels import sampling as sampling_kernel
from ..runtime import Runtime
from ..transfer import to_device
from .config import GenerationConfig


def _id_mask(ids: torch.Tensor, keep: torch.Tensor, vocab: int, col_ids: torch.Tensor | None) -> torch.Tensor:
    """[R, V] bool: row r marks its ``ids[r]`` where ``keep[r]`` (scattered into a spare column V otherwise, so no
    read decides a count); with ``col_ids`` [A] (each column's id, -1 for none) the same mask over those columns."""
    mask = torch.zeros(ids.shape[0], vocab + 1, dtype=torch.bool, device=ids.device)
    if ids.numel():
        mask.scatter_(1, torch.where(keep, ids, vocab), True)
    return _on_columns(mask[:, :vocab], col_ids)


def _on_columns(mask: torch.Tensor, col_ids: torch.Tensor | None) -> torch.Tensor:
    """A [R, V] id mask over a draft head's columns ``col_ids`` [A] (-1: a column of no id, never marked)."""
    return mask if col_ids is None else mask[:, col_ids.clamp(min=0)] & (col_ids >= 0)[None, :]


def penalised(logits: torch.Tensor, penalty: float | torch.Tensor) -> torch.Tensor:
    """HF's repetition penalty rule on ``logits`` (every one of them, seen or not: callers choose where it applies):
    a negative logit multiplied by ``penalty``, any other divided by it; ``penalty`` a number or a tensor that
    broadcasts (one per row).  Differentiable."""
    return torch.where(logits < 0, logits * penalty, logits / penalty)


class RepetitionPenalty:
    """HF ``RepetitionPenaltyLogitsProcessor``: for every token already in the sequence, a positive logit is divided
    by the penalty and a negative one multiplied by it.  State: a [V] bitmap of seen tokens on the model's device."""

    def __init__(self, penalty: float, vocab_size: int, device: torch.device | Runtime):
        runtime = Runtime.of(device)  # the model's (a device: its own), whether apply indexes the seen ids
        self.penalty, self.by_index = penalty, runtime.penalty_by_index
        self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=runtime.device)
        self._seen_ids: set[int] = set()
        self._seen_list: torch.Tensor | None = None  # the seen ids as a tensor, rebuilt when the set grows
        self._seen_early = False  # the bitmap took the next commit's tokens already (see_on_device)

    def commit(self, tokens: Sequence[int] | torch.Tensor) -> None:
        if not self._seen_early:  # the ids copied pinned and asynchronously: no host wait on CUDA
            self.seen.index_fill_(0, to_device(tokens, self.seen.device), True)
        self._seen_early = False
        new = {int(t) for t in (tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens)} - self._seen_ids
        if new:
            self._seen_ids |= new
            self._seen_list = None

    def seen_ids(self) -> torch.Tensor:
        if self._seen_list is None:
            self._seen_list = torch.tensor(sorted(self._seen_ids), dtype=torch.long, device=self.seen.device)
        return self._seen_list

    def row_ids(self, toks: Sequence[int]) -> torch.Tensor:
        """The ids a row whose history is the committed sequence plus ``toks`` penalises (sorted, each once)."""
        base = self.seen_ids()
        if not len(toks):
            return base
        return torch.cat([base, torch.as_tensor(list(toks), dtype=torch.long, device=base.device)]).unique()

    def apply_columns(self, logits: torch.Tensor, columns_of, extra: Sequence[Sequence[int]]) -> torch.Tensor:
        """Penalise draft logits [R, A] whose columns are vocabulary ids mapped by ``columns_of(ids) -> [n]`` (-1:
        not a column); row r's history is the committed sequence plus ``extra[r]``."""
        for r, toks in enumerate(extra):
            cols = columns_of(self.row_ids(toks))
            cols = cols[cols >= 0]
            if cols.numel():
                row = logits[r, cols]
                logits[r, cols] = penalised(row, self.penalty)
        return logits

    def apply_on_device(self, logits: torch.Tensor, paths: torch.Tensor, col_ids: torch.Tensor | None = None,
                        state: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """:meth:`apply` (``col_ids`` None) or :meth:`apply_columns` (``col_ids`` [A]: the id of each column, -1 for
        none) with each row's path as a device tensor: ``paths`` [R, W], row r's path ids, -1 padding.  The same
        penalised set (seen ∪ the row's path), the same values, no read back.  ``state``: :meth:`graph_state`'s
        tensors to read instead of this one's own (a graph's copies of them)."""
        seen = self.seen if state is None else state[0]
        paths = paths if paths.numel() else paths.new_zeros(logits.shape[0], 0)
        fused = penalty_kernel.penalise(logits, seen, paths, self.penalty) if col_ids is None else None
        if fused is not None:  # one launch, the rows read once (the same values)
            return fused
        mask = _id_mask(paths, paths >= 0, seen.numel(), None) | seen[None, :]
        return torch.where(_on_columns(mask, col_ids), penalised(logits, self.penalty), logits)

    def graph_state(self) -> tuple[tuple[torch.Tensor, ...], tuple]:
        """(the tensors :meth:`apply_on_device` reads, the values it bakes in): a graph of a whole draft takes the
        first as inputs and keys itself by the second."""
        return (self.seen,), ("repetition_penalty", self.penalty)

    def see_on_device(self, tokens: torch.Tensor) -> None:
        """The seen bitmap takes ``tokens`` (a device tensor not read yet: the next commit's tokens, and maybe more)
        ahead of :meth:`commit`, which then takes them into the host's set only."""
        self.seen.index_fill_(0, tokens, True)
        self._seen_early = True

    def apply(self, logits: torch.Tensor, extra: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
        """Penalise ``logits`` [R, V] (in place); row r's history is the committed sequence plus ``extra[r]``.

        On a CPU only the seen ids' logits are read and written (a few hundred of a large vocabulary, where a select
        over whole rows would read and write every logit), the same values; on a GPU the whole rows under the seen
        bitmap, which needs no host list (a new id would be a copy the step waits for)."""
        if self.by_index:
            return self._apply_seen(logits, extra)
        seen = self.seen.expand_as(logits)
        if extra is not None and any(len(e) for e in extra):
            seen = seen.clone()
            for r, toks in enumerate(extra):
                if len(toks):
                    seen[r].index_fill_(0, to_device(list(toks), seen.device), True)  # no blocking copy
        return torch.where(seen, penalised(logits, self.penalty), logits, out=logits)

    def _apply_seen(self, logits: torch.Tensor, extra: Sequence[Sequence[int]] | None) -> torch.Tensor:
        """:meth:`apply` by index over the seen ids (and each row's ``extra``), in place."""
        if extra is None or not any(len(e) for e in extra):
            base = self.seen_ids()
            if base.numel():
                logits[:, base] = penalised(logits[:, base], self.penalty)
            return logits
        for r, toks in enumerate(extra):
            ids = self.row_ids(toks)
            if ids.numel():
                logits[r, ids] = penalised(logits[r, ids], self.penalty)
        return logits


def _counted(counts: dict[int, int], extra: Sequence[int]) -> tuple[list[int], list[int]]:
    """(ids, counts) of ``counts`` with the tokens of ``extra`` counted too, each id once."""
    if not len(extra):
        return list(counts), list(counts.values())
    more = dict(counts)
    for t in extra:
        more[int(t)] = more.get(int(t), 0) + 1
    return list(more), list(more.values())


class PresenceFrequency:
    """OpenAI's ``presence_penalty`` and ``frequency_penalty``: every id already generated loses ``presence`` once
    and ``frequency`` times the number of times it was generated, subtracted from its logit.  Only generated tokens
    count, not the prompt (OpenAI's and vLLM's rule): the pipeline's :meth:`~LogitsPipeline.start` hands the prompt
    to :meth:`start`, which skips it.  Rows whose history ends in ``extra`` tokens count those too.

    The amount an id loses is ``count * frequency + (count > 0) * presence`` in float32 on every path (by index on
    the host, over whole rows on the device, over a draft head's columns), so all paths give the same bits."""

    def __init__(self, presence: float, frequency: float, vocab_size: int, device: torch.device):
        self.presence, self.frequency, self.vocab_size = presence, frequency, vocab_size
        self.device = torch.device(device)
        self.counts: dict[int, int] = {}
        self._dense: torch.Tensor | None = None  # the counts as a [V] float32 tensor, rebuilt when they change

    def start(self, prompt: Sequence[int]) -> None:
        """The prompt: not counted."""

    def commit(self, tokens: Sequence[int] | torch.Tensor) -> None:
        for t in (tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens):
            self.counts[int(t)] = self.counts.get(int(t), 0) + 1
        if len(tokens):
            self._dense = None

    def amount(self, counts: torch.Tensor) -> torch.Tensor:
        """What each id loses given its float32 ``counts`` (any shape)."""
        return counts * self.frequency + (counts > 0).to(counts.dtype) * self.presence

    def _row(self, extra: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        ids, counts = _counted(self.counts, extra)
        return (torch.as_tensor(ids, dtype=torch.long, device=device),
                self.amount(torch.as_tensor(counts, dtype=torch.float32, device=device)))

    def apply(self, logits: torch.Tensor, extra: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
        """Penalise ``logits`` [R, V] in place, by index over the counted ids."""
        rows = extra if extra is not None else [()] * logits.shape[0]
        if not any(len(e) for e in rows):
            ids, amount = self._row((), logits.device)
            if ids.numel():
                logits[:, ids] = logits[:, ids] - amount.to(logits.dtype)
            return logits
        for r, toks in enumerate(rows):
            ids, amount = self._row(toks, logits.device)
            if ids.numel():
                logits[r, ids] = logits[r, ids] - amount.to(logits.dtype)
        return logits

    def apply_columns(self, logits: torch.Tensor, columns_of, extra: Sequence[Sequence[int]]) -> torch.Tensor:
        """:meth:`apply` on draft logits [R, A] whose columns are ids mapped by ``columns_of`` (see
        :class:`RepetitionPenalty`)."""
        for r, toks in enumerate(extra):
            ids, amount = self._row(toks, logits.device)
            if not ids.numel():
                continue
            cols = columns_of(ids)
            keep = cols >= 0
            if keep.any():
                cols = cols[keep]
                logits[r, cols] = logits[r, cols] - amount[keep].to(logits.dtype)
        return logits

    def dense(self) -> torch.Tensor:
        """The counts as a [V] float32 tensor on the device."""
        if self._dense is None:
            dense = torch.zeros(self.vocab_size, dtype=torch.float32)
            if self.counts:
                dense[torch.tensor(list(self.counts))] = torch.tensor(list(self.counts.values()), dtype=torch.float32)
            self._dense = dense.to(self.device)
        return self._dense

    def apply_on_device(self, logits: torch.Tensor, paths: torch.Tensor, col_ids: torch.Tensor | None = None
                        ) -> torch.Tensor:
        """:meth:`apply` (``col_ids`` None) or :meth:`apply_columns` (``col_ids`` [A]: each column's id, -1 for
        none) with each row's path a device tensor ``paths`` [R, W] (-1 padding): the same amounts over whole
        rows, nothing read back."""
        rows = logits.shape[0]
        counts = self.dense().expand(rows, -1)
        if paths.numel():
            counts = counts.clone().scatter_add_(1, paths.clamp(min=0), (paths >= 0).to(torch.float32))
        amount = self.amount(counts)
        if col_ids is not None:
            amount = amount[:, col_ids.clamp(min=0)] * (col_ids >= 0).to(torch.float32)[None, :]
        return logits - amount.to(logits.dtype)


class LogitBias:
    """OpenAI's ``logit_bias``: a fixed amount added to the logits of some ids, every row, every step (no state).
    On the host by index over the biased ids; on the device as a dense [V] row (an input a graph can read)."""

    def __init__(self, bias: Sequence[tuple[int, float]], vocab_size: int, device: torch.device):
        ids = [int(i) for i, _ in bias]
        check(all(0 <= i < vocab_size for i in ids),
              f"logit_bias names a token id outside the vocabulary (0 to {vocab_size - 1})")
        self.ids = torch.tensor(ids, dtype=torch.long, device=device)
        self.values = torch.tensor([float(v) for _, v in bias], dtype=torch.float32, device=device)
        self.row = torch.zeros(vocab_size, dtype=torch.float32, device=device).index_put_((self.ids,), self.values)

    def commit(self, tokens: Sequence[int] | torch.Tensor) -> None:
        pass

    def apply(self, logits: torch.Tensor, extra: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
        ids = self.ids.to(logits.device)
        logits[:, ids] = logits[:, ids] + self.values.to(logits.device, logits.dtype)
        return logits

    def apply_columns(self, logits: torch.Tensor, columns_of, extra: Sequence[Sequence[int]]) -> torch.Tensor:
        cols = columns_of(self.ids.to(logits.device))
        keep = cols >= 0
        if keep.any():
            cols = cols[keep]
            logits[:, cols] = logits[:, cols] + self.values.to(logits.device, logits.dtype)[keep]
        return logits

    def apply_on_device(self, logits: torch.Tensor, paths: torch.Tensor, col_ids: torch.Tensor | None = None,
                        state: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        row = self.row if state is None else state[0]
        if col_ids is not None:
            row = row[col_ids.clamp(min=0)] * (col_ids >= 0).to(row.dtype)
        return logits + row.to(logits.dtype)[None, :]

    def graph_state(self) -> tuple[tuple[torch.Tensor, ...], tuple]:
        return (self.row,), ("logit_bias",)

    def see_on_device(self, tokens: torch.Tensor) -> None:
        pass


class NoRepeatNGram:
    """HF ``NoRepeatNGramLogitsProcessor``: a token that would complete an n-gram already present is banned.

    State: a map from each (n-1)-gram of the committed sequence to the tokens that followed it, updated per commit;
    for :meth:`apply_on_device` (given ``vocab_size``) the committed sequence on the device too, brought up to date
    there when asked (a copy that does not wait).
    """

    def __init__(self, n: int, vocab_size: int | None = None):
        self.n, self.vocab_size = n, vocab_size
        self.history: list[int] = []
        self.follow: dict[tuple[int, ...], set[int]] = defaultdict(set)
        self._on_device: torch.Tensor | None = None  # history[: its length], on the device of the last logits

    def commit(self, tokens: Sequence[int]) -> None:
        n = self.n
        for tok in tokens:
            self.history.append(int(tok))
            if len(self.history) >= n:
                self.follow[tuple(self.history[-n:-1])].add(int(tok))

    def apply_on_device(self, logits: torch.Tensor, paths: torch.Tensor, col_ids: torch.Tensor | None = None
                        ) -> torch.Tensor:
        """:meth:`apply` (``col_ids`` None) or :meth:`apply_columns` (``col_ids`` [A]: each column's id, -1 for
        none) with each row's path as a device tensor ``paths`` [R, W] (its ids in path order, -1 anywhere between
        or after them): the same bans, found on the device without a read back.  Row r's text is the committed
        sequence followed by its path; every n-gram of it whose first n - 1 tokens equal its last n - 1 bans its
        last token."""
        check(self.vocab_size is not None, "NoRepeatNGram.apply_on_device needs the vocabulary size")
        have = 0 if self._on_device is None else self._on_device.numel()
        if have < len(self.history):  # what was committed since: copied pinned and asynchronously
            more = to_device(self.history[have:], logits.device)
            self._on_device = more if self._on_device is None else torch.cat([self._on_device, more])
        n, rows = self.n, logits.shape[0]
        hist = self._on_device if self._on_device is not None else logits.new_zeros(0, dtype=torch.long)
        if paths.numel():  # the path ids first, in order (a stable sort of the -1s to the end)
            order = torch.sort((paths < 0).to(torch.uint8), dim=1, stable=True).indices
            path = paths.gather(1, order)
            length = hist.numel() + (paths >= 0).sum(1)
        else:
            path = paths.new_zeros(rows, 0)
            length = torch.full((rows,), hist.numel(), dtype=torch.long, device=logits.device)
        text = torch.cat([hist.expand(rows, -1), path], 1)  # [R, T], -1 past each row's length
        if text.shape[1] < n:
            return logits
        grams = text.unfold(1, n, 1)  # [R, T - n + 1, n]
        start = torch.arange(grams.shape[1], device=logits.device)
        key_at = (length[:, None] - (n - 1) + torch.arange(n - 1, device=logits.device)).clamp(0, text.shape[1] - 1)
        key = text.gather(1, key_at)  # [R, n - 1]: each row's last n - 1 tokens
        hit = (start[None] + n <= length[:, None]) & (grams[:, :, : n - 1] == key[:, None, :]).all(-1)
        return logits.masked_fill_(_id_mask(grams[:, :, n - 1], hit, self.vocab_size, col_ids), float("-inf"))

    def banned(self, extra: Sequence[int] = ()) -> list[int]:
        """Tokens banned after the committed sequence followed by ``extra``."""
        n = self.n
        if len(self.history) + len(extra) + 1 < n:
            return []
        seq = self.history[max(0, len(self.history) - (n - 1)) :] + [int(t) for t in extra]
        key = tuple(seq[len(seq) - (n - 1) :])
        out = set(self.follow.get(key, ()))
        for i in range(len(seq) - n + 1):  # n-grams that end inside ``extra``
            if tuple(seq[i : i + n - 1]) == key:
                out.add(seq[i + n - 1])
        return sorted(out)

    def apply(self, logits: torch.Tensor, extra: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
        rows = extra if extra is not None else [()] * logits.shape[0]
        for r, toks in enumerate(rows):
            ban = self.banned(toks)
            if ban:
                logits[r, torch.as_tensor(ban, dtype=torch.long, device=logits.device)] = float("-inf")
        return logits

    def apply_columns(self, logits: torch.Tensor, columns_of, extra: Sequence[Sequence[int]]) -> torch.Tensor:
        """:meth:`apply` on draft logits whose columns are ids mapped by ``columns_of`` (see RepetitionPenalty)."""
        for r, toks in enumerate(extra):
            ban = self.banned(toks)
            if ban:
                cols = columns_of(torch.as_tensor(ban, dtype=torch.long, device=logits.device))
                cols = cols[cols >= 0]
                if cols.numel():
                    logits[r, cols] = float("-inf")
        return logits


class LogitsPipeline:
    """The processors a :class:`GenerationConfig` asks for, applied in HF's order, plus sampling warpers."""

    def __init__(self, cfg: GenerationConfig, vocab_size: int, device: torch.device | Runtime):
        runtime = Runtime.of(device)  # the model's (a device: its own)
        self.cfg, self.device = cfg, runtime.device
        device = self.device
        self.processors: list = []
        if cfg.logit_bias:
            self.processors.append(LogitBias(cfg.logit_bias, vocab_size, device))
        if cfg.repetition_penalty != 1.0:
            self.processors.append(RepetitionPenalty(cfg.repetition_penalty, vocab_size, runtime))
        if cfg.presence_penalty or cfg.frequency_penalty:
            self.processors.append(PresenceFrequency(cfg.presence_penalty, cfg.frequency_penalty, vocab_size, device))
        if cfg.no_repeat_ngram_size > 0:
            self.processors.append(NoRepeatNGram(cfg.no_repeat_ngram_size, vocab_size))
        self.grammar = None  # a structured output's mask (decoding.grammar): last, over the processed rows
        if cfg.grammar is not None:
            from .grammar import GrammarMask

            self.grammar = GrammarMask(cfg.grammar)
            self.processors.append(self.grammar)
        self.generator = None
        if not cfg.greedy:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(cfg.seed if cfg.seed is not None else torch.seed())
        # a seeded sample is keyed: the token at each position is the draw of a uniform fixed by (seed, position)
        self.keyed = not cfg.greedy and cfg.seed is not None and KEYED_SEEDS
        # the key of keyed draws: the seed; for an unseeded sample, a random key of the request's own (its
        # generator's random seed), which the device walk uses over deterministic drafts (verify.device_walk)
        self.key = None if cfg.greedy else cfg.seed if self.keyed else self.generator.initial_seed()
        self.position = 0  # tokens committed so far: the next token's position

    @property
    def active(self) -> bool:
        return bool(self.processors)

    @property
    def keep_raw(self) -> bool:
        """Whether verification keeps the target's rows before the processors too (raw log-probabilities asked
        for, and processors that change the rows)."""
        return self.active and self.cfg.logprobs is not None and self.cfg.logprobs_mode == "raw"

    @property
    def on_device(self) -> bool:
        """Whether every processor can take the rows' paths as a device tensor (:meth:`process_on_device`): the
        repetition penalty and no-repeat-n-gram both can."""
        return all(getattr(p, "apply_on_device", None) is not None for p in self.processors)

    def process_on_device(self, logits: torch.Tensor, paths: torch.Tensor, col_ids: torch.Tensor | None = None,
                          states: Sequence[tuple[torch.Tensor, ...]] | None = None) -> torch.Tensor:
        """:meth:`process` / :meth:`process_columns` with row r's extra history ``paths[r]`` a device tensor (-1
        padding; ``col_ids``: each column's id, for a draft head's columns), when :attr:`on_device`.  ``states``:
        each processor's :meth:`graph_state` tensors to read instead of its own."""
        for i, p in enumerate(self.processors):
            logits = p.apply_on_device(logits, paths, col_ids) if states is None else \
                p.apply_on_device(logits, paths, col_ids, states[i])
        return logits

    def graph_state(self) -> tuple[list[tuple[torch.Tensor, ...]], tuple] | None:
        """(each processor's tensors, the values they bake in) for a graph of a whole draft that applies them
        (:meth:`process_on_device` with ``states``); None where one cannot go into such a graph (no-repeat-n-gram:
        its history grows, so its shapes do)."""
        if not all(hasattr(p, "graph_state") for p in self.processors):
            return None
        both = [p.graph_state() for p in self.processors]
        return [s for s, _ in both], tuple(k for _, k in both)

    def choice_inputs(self, ahead: int = 0) -> tuple[tuple, tuple[torch.Tensor, ...]] | None:
        """For a graph that processes a row and chooses the next token itself (a plain step's replay,
        :meth:`choose_fixed`): (the values it bakes in, the tensors it reads: each processor's :meth:`graph_state`
        tensors, then when sampling the keyed uniform of the next position, or of the one ``ahead`` positions
        after it, as a float64 [1]); None where a processor cannot go into a graph.  Sampling is keyed there,
        seeded or not (an unseeded request by its own random key, :attr:`key`, as the device walk is): a fresh
        uniform per position, so the tokens follow the target's distribution exactly, and a seeded request's are
        those of its eager steps."""
        state = self.graph_state() if self.active else ([], ())
        if state is None:
            return None
        tensors, baked = state
        cfg = self.cfg
        given = tuple(t for s in tensors for t in s)
        if not cfg.greedy:
            given += (to_device([keyed_uniform(self.key, self.position + ahead)], self.device, torch.float64),)
        sampling = None if cfg.greedy else (cfg.temperature, cfg.top_p, cfg.top_k, cfg.min_p)
        return (baked, tuple(len(s) for s in tensors), sampling), given

    def see_on_device(self, tokens: torch.Tensor) -> None:
        """The processors' device state takes ``tokens`` [n] (a device tensor, not read yet) ahead of :meth:`commit`
        (a step launched before its input token is read); only where :meth:`choice_inputs` is not None."""
        for p in self.processors:
            p.see_on_device(tokens)

    def graph_states(self, given: Sequence[torch.Tensor]) -> tuple[list[tuple[torch.Tensor, ...]], list]:
        """Each processor's :meth:`graph_state` tensors back from the flat ``given`` (theirs in order, as
        :meth:`choice_inputs` and a whole draft's inputs lay them out; a graph's copies), and what follows them."""
        rest, states = list(given), []
        for p in self.processors:
            n = len(p.graph_state()[0])
            states.append(tuple(rest[:n]))
            del rest[:n]
        return states, rest

    def choose_fixed(self, logits: torch.Tensor, given: Sequence[torch.Tensor]) -> torch.Tensor:
        """The next token [1] of one row of raw logits [1, V]: :meth:`process` and :meth:`choose` in fixed shapes,
        with nothing read back, from :meth:`choice_inputs`'s tensors ``given`` (a graph's copies of them)."""
        states, rest = self.graph_states(given)
        if states:
            logits = self.process_on_device(logits, torch.full((1, 0), -1, dtype=torch.long, device=logits.device),
                                            states=states)
        if self.cfg.greedy:
            return logits.argmax(dim=-1)
        return sample(self.probs(logits), u=rest[0][:, None]).squeeze(-1)

    def start(self, prompt: Sequence[int]) -> None:
        """The prompt, before the first token: every processor takes it as history (the repetition penalty, the
        n-grams) except those that count generated tokens only (:class:`PresenceFrequency`)."""
        self.position += len(prompt)
        for p in self.processors:
            (p.start if hasattr(p, "start") else p.commit)(prompt)

    def commit(self, tokens: Sequence[int]) -> None:
        self.position += len(tokens)
        for p in self.processors:
            p.commit(tokens)

    def process(self, logits: torch.Tensor, extra: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
        """Apply the processors to fp32 ``logits`` [R, V] in place (row r's history: committed + extra[r])."""
        for p in self.processors:
            logits = p.apply(logits, extra)
        return logits

    def process_columns(self, logits: torch.Tensor, columns_of, extra: Sequence[Sequence[int]],
                        col_ids=None) -> torch.Tensor:
        """The processors on a draft head's fp32 logits [R, A] in place: their columns are the ids
        ``columns_of(ids) -> [n]`` maps (-1 where an id has no column), and ``col_ids()`` gives each column's id
        [A] (-1: none) to a processor that masks by columns (the grammar); row r's history is committed + extra[r]."""
        for p in self.processors:
            if hasattr(p, "apply_column_ids"):
                logits = p.apply_column_ids(logits, col_ids(), extra)
            else:
                logits = p.apply_columns(logits, columns_of, extra)
        return logits

    def draft_logp(self, logits: torch.Tensor) -> torch.Tensor:
        """Log-probabilities [R, A] a draft ranks its candidates by: of the processed logits when greedy, of the
        sampling distribution (temperature, top-k, top-p, min-p) otherwise (-inf where the warpers cut)."""
        if self.cfg.greedy:
            logp = torch.log_softmax(logits, dim=-1)
        else:
            logp = torch.log(self.probs(logits))
        if self.grammar is not None:  # a row the grammar leaves nothing in: -inf throughout, not NaN
            logp = logp.masked_fill_(logp.isnan(), float("-inf"))
        return logp

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The sampling distribution [R, V] of processed logits: temperature, top-k, top-p, then min-p (HF order
        and semantics).  Verification warps the target's rows and drafts warp theirs with it, so sampling stays
        exact under every warper."""
        cfg = self.cfg
        return warp_probs(logits, cfg.temperature, cfg.top_p, cfg.top_k, cfg.min_p)

    def choose(self, logits: torch.Tensor, position: int | None = None) -> torch.Tensor:
        """Next token of each row of processed logits [R, V]: argmax when greedy, else a sample; a keyed sample
        (one row) is the draw of :func:`keyed_uniform` at ``position`` (default: the next token's)."""
        if self.cfg.greedy:
            return logits.argmax(dim=-1)
        if self.keyed:
            u = keyed_uniform(self.key, self.position if position is None else position)
            return sample(self.probs(logits), u=u).squeeze(-1)
        return sample(self.probs(logits), self.generator).squeeze(-1)


KEYED_SEEDS = True  # seeded sampling keyed by (seed, position); False: rejection sampling (tests of that path)
_M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers whose every output bit depends on every input bit."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def keyed_uniform(seed: int, position: int) -> float:
    """A uniform number in (0, 1] fixed by ``seed`` and ``position`` alone (53 bits of a hash of both): the draw a
    seeded sample makes at that position, whatever drafted it, whatever it was batched with, on any device."""
    return ((_mix64(_mix64(seed & _M64) ^ (position & _M64)) >> 11) + 1) / float(1 << 53)


def sample(p: torch.Tensor, generator: torch.Generator | None = None, u: float | None = None) -> torch.Tensor:
    """One index per row of ``p`` [..., V] (non-negative weights, not necessarily normalised), index i with
    probability ``p[i] / sum(p)``, shaped like ``torch.multinomial(p, 1)``: [..., 1].  ``u``: the uniform in (0, 1]
    to draw with (every row), instead of one from ``generator``.

    Inverse CDF: a float64 running sum and a binary search for ``u * total``, ``u`` uniform in (0, 1] — an id of
    weight 0 is never drawn (the search stops at the first id whose running sum reaches the target, which has
    weight).  ``torch.multinomial`` draws the same distribution but over a wide row on a CPU costs many times this
    search.  Where the fused kernels run (CUDA)
    every draw takes :func:`microspec.kernels.sampling.inverse_cdf`, the same search in two launches that write
    nothing vocabulary-sized; elsewhere its plain-torch reference."""
    if u is None:
        u = 1.0 - torch.rand((*p.shape[:-1], 1), dtype=torch.float64, generator=generator, device=p.device)
    return sampling_kernel.draw(p, u)


def warp_probs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 0,
               min_p: float = 0.0) -> torch.Tensor:
    """softmax of ``logits / temperature`` after Hugging Face's warpers, in HF's order and with their semantics,
    renormalised over what is kept:

    - top-k (``TopKLogitsWarper``; 0 = off): keep the tokens scoring at least the k-th highest score (ties kept);
    - top-p (``TopPLogitsWarper``): keep the smallest set of most probable tokens whose mass reaches ``top_p``,
      always at least one;
    - min-p (``MinPLogitsWarper``; 0 = off): drop the tokens less probable than ``min_p`` times the most probable
      one (which always stays)."""
    scores = logits / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(scores, descending=False, dim=-1)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - top_p)
        remove_sorted[..., -1] = False
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    if min_p > 0:
        probs = torch.softmax(scores, dim=-1)
        scores = scores.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    return torch.softmax(scores, dim=-1)
