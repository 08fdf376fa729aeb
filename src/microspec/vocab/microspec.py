"""MicroSpec's in-context vocabulary: Algorithm 1 of "MicroSpec: Accelerating Speculative Decoding with Lightweight
In-Context Vocabularies" (Chen et al.).

    S  <- (x_1..x_L) ⊕ tuple(∪_i TopK(z_i, K_pre))                      prefill: prompt, then its top predictions
    I  <- Unique(Suffix(S, W_max))                                       the active vocabulary
    after each verification:
    S  <- S ⊕ tuple(Unique(tokens in the draft tree)) ⊕ tuple(TopK(z_verify, K_ver))
    I  <- Unique(Suffix(S, W_max))

:class:`MicroSpecVocab` is those lines; what lies under them is in :mod:`microspec.vocab.window`.  The stream is never
stored whole: only its last ``W_max`` entries matter, so it lives in a :class:`~microspec.vocab.window.CandidateWindow`
— a ring buffer of W_max token ids with a count per vocabulary id of how often it occurs in the ring; ``I`` is the set
of ids with a non-zero count.  Three backends keep the same state.  ``triton`` (default on CUDA where Triton runs,
:class:`~microspec.vocab.window.KernelWindow`): one Triton kernel per append updates the ring, the counts and the
packed rows' slots, a second gathers the entering rows (:mod:`microspec.kernels.window_update`).  ``device``
(:class:`~microspec.vocab.window.DeviceWindow`, the plain-torch reference and the CUDA fallback): appending is a
handful of fixed-shape tensor operations on the model's device (first-occurrence dedup by scatter-min, ring positions
by cumulative sum, count updates by index_add), with the write pointer itself a device tensor.  Neither reads
anything back to the host.  ``host`` (default on a CPU,
:class:`~microspec.vocab.window.HostWindow`) keeps the ring and the counts in Python and walks the few ids of each
append one by one: on a CPU every tensor operation pays a fixed dispatch cost whatever its size, so the device
version's dozens of operations per verification cost far more than the host walk.

What the draft head gets (``gather``): ``"packed"`` (default) — the rows of I in a
:class:`~microspec.vocab.packed.PackedRows` buffer of W_max (+ special) slots, which a
:class:`~microspec.vocab.window.WindowRows` keeps in step with the window: on each append it frees the slots of ids
whose count fell to zero and copies in only the rows of ids whose count rose from zero; ``"indexed"`` (the ablation
baseline) — I as an id list, whose rows the head gathers at every step; or ``"fused"`` — the same id list, read by a
Triton kernel inside the head's matmul (``fused`` is set).  On CUDA the packed path's appends run on a
:class:`~microspec.vocab.window.SideStream`, overlapping the draft model's forward; the head waits on an event just
before its matmul.

Order inside a tuple(set): prefill candidates by prompt position then rank, draft candidates in tree order,
verify candidates by branch row then rank; each set is deduplicated on its own (the paper's ⊕ of three tuples), so a
token in both C_draft and C_ver enters the stream twice.  Special tokens: the ids in ``always`` (the model's EOS ids
by default) are added to I at every step, so a draft may end where the target would; they are not stream entries.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from ..runtime import Runtime
from ..errors import MicrospecError, check
from ..options import Option, PolicySpec
from ..transfer import to_device
from .base import ActiveSet, VocabPolicy
from .packed import GATHER, GATHERS, PackedRows
from .position import POSITION_AWARE, check_ranked, with_budgets
from .window import WINDOWS, CandidateWindow, SideStream, WindowRows


def topk_ids(logits: torch.Tensor, k: int, block: int = 512) -> torch.Tensor:
    """Ids [R, k] of the k largest logits of each row of [R, V] (ties in any order).  Two stages when V splits into
    blocks: the k blocks with the largest maxima hold the top k, so only they are searched — on a CPU cheaper than
    one ``torch.topk`` over a whole wide vocabulary row."""
    r, v = logits.shape
    if v % block or v // block < 4 * k:
        return torch.topk(logits, k, dim=-1).indices
    blocks = logits.view(r, v // block, block)
    best = torch.topk(blocks.amax(dim=-1), k, dim=-1).indices                      # [R, k] block numbers
    cand = blocks.gather(1, best[:, :, None].expand(r, k, block)).reshape(r, k * block)
    cols = torch.topk(cand, k, dim=-1).indices
    return best.gather(1, cols // block) * block + cols % block


SOURCES = ("ctx+ext", "ctx", "ext")
# Algorithm 1's settings at the paper's values
W_MAX = Option("w_max", type=int, default=3072, low=1, high=32768,
               help="microspec: W_max, the window over the candidate stream")
K_PRE = Option("k_pre", type=int, default=3, low=0, high=64,
               help="microspec: K_pre, the top-k per prompt position at prefill")
K_VER = Option("k_ver", type=int, default=3, low=0, high=64,
               help="microspec: K_ver, the top-k of the verify logits per step")
# no C_pre on a packed CPU target: the target's top-k at a prompt position costs a full-vocabulary head row, so with
# every position the long-prompt categories (rag, summarization) run below plain decoding, and fewer positions, down
# to none, keep about the same acceptance (docs/history.md, "Vocabulary methods compared")
K_PRE_POSITIONS = Option(
    "k_pre_positions", type=int, low=0, per_device=(("cpu-gguf", 0),),
    help="microspec: take the prefill's top-k at the last N prompt positions only (default: every position, as "
         "Algorithm 1; none on a packed GGUF target on a CPU, where each position costs a full-vocabulary head row; "
         "the method name microspec-kpall takes every position there too)")
SOURCES_OPTION = Option("sources", choices=SOURCES, default=SOURCES[0],
                        help="microspec: the stream's sources: ctx+ext (Algorithm 1), ctx or ext (the paper's Ctx. "
                             "Only / Ext. Only ablation)")


class MicroSpecVocab(VocabPolicy):
    """Algorithm 1, line by line:

        S <- (x_1..x_L) ⊕ tuple(∪_i TopK(z_i, K_pre))                        on_prefill
        I <- Unique(Suffix(S, W_max))                                         active
        after each verification:
        S <- S ⊕ tuple(Unique(C_draft)) ⊕ tuple(TopK(z_verify, K_ver))        on_verify
             ⊕ tuple(C_commit)
        I <- Unique(Suffix(S, W_max))                                         active

    Under the decoding's processors: z_verify are the logits the target actually chose from — processed with each
    validated node's own path as history (repetition penalty, no-repeat-n-gram) — and C_commit, the step's committed
    tokens that are in neither C_draft nor TopK(z_verify, K_ver), always enters the stream (a sampled bonus token
    outside the top K_ver, or any bonus token when K_ver = 0).  Under plain greedy decoding this is exactly the
    paper's Algorithm 1: processed = raw logits, the committed tokens are accepted drafts (in C_draft) and the bonus
    token, the raw top-1 (in TopK(z_verify, K_ver) for K_ver >= 1), so C_commit is empty.

    S is kept as Suffix(S, W_max) only: ``self.suffix``, a host or device
    :class:`~microspec.vocab.window.CandidateWindow`.  Beside Algorithm 1, not in it: the packed head rows of I kept
    in step with the window (``self.rows``, a :class:`~microspec.vocab.window.WindowRows`, after :meth:`attach`) and
    the CUDA side stream the appends run on (``self.side``, a :class:`~microspec.vocab.window.SideStream`)."""

    name = "microspec"

    def __init__(self, vocab_size: int, w_max: int = W_MAX.default, k_pre: int = K_PRE.default,
                 k_ver: int = K_VER.default,
                 always: Sequence[int] = (), device: torch.device | str = "cpu", gather: str = "packed",
                 backend: str | None = None, k_pre_positions: int | None = None,
                 sources: str = SOURCES_OPTION.default, side_stream: bool = True):
        for option, value in ((W_MAX, w_max), (K_PRE, k_pre), (K_VER, k_ver), (K_PRE_POSITIONS, k_pre_positions)):
            option.check(value)
        check(gather in GATHERS, f"unknown gather {gather!r}; choose from {', '.join(GATHERS)}")
        self.runtime = runtime = Runtime.of(device)
        device = runtime.device
        if backend is None:  # on the device where its runtime says so (CUDA): the Triton window kernels where they
            # build (the tensor window's update costs several times theirs, BENCHMARKS.md, "GPU"), else the tensor
            # window; elsewhere the host's (and Triton is not imported)
            backend = "host"
            if runtime.window_on_device:
                from ..kernels.window_update import compiles

                backend = "triton" if compiles(device) else "device"
        check(backend in WINDOWS, f"unknown backend {backend!r}; choose from {', '.join(WINDOWS)}")
        super().__init__(always, device)
        self.vocab_size, self.w_max, self.k_pre, self.k_ver, self.gather = vocab_size, w_max, k_pre, k_ver, gather
        self.backend, self.device, self.fused = backend, device, gather == "fused"
        self.set_sources(sources)
        self.prompt_positions = k_pre_positions  # None: every prompt position, as Algorithm 1
        self.suffix: CandidateWindow = WINDOWS[backend](vocab_size, w_max, device)  # Suffix(S, W_max)
        self.rows: WindowRows | None = None  # the packed rows of I (gather "packed", once attached)
        self.side = SideStream(runtime, enabled=side_stream and gather == "packed" and backend != "host")
        self._ids: tuple[int, torch.Tensor] | None = None  # (version, I as ids) for the id-list gathers

    # ---------------------------------------------------------------- Algorithm 1
    def reset(self) -> None:
        """S <- () (a new request)."""
        self.side.wait()
        self.suffix.reset()
        if self.rows is not None:
            self.rows.reset()
        self.version += 1

    def on_prefill(self, prompt_ids: torch.Tensor, prompt_topk_ids: torch.Tensor | None) -> None:
        if "ctx" not in self.sources:
            return
        self.append(prompt_ids, unique=False)                      # S <- (x_1, ..., x_L)
        if prompt_topk_ids is not None and self.k_pre > 0:
            self.append(prompt_topk_ids[:, : self.k_pre].reshape(-1), unique=True)  # ⊕ tuple(∪ TopK(z_i, K_pre))

    def on_verify(self, tree_ids: torch.Tensor, verify_logits: torch.Tensor,
                  committed: Sequence[int] | torch.Tensor = (), padded: bool = False) -> None:
        if not isinstance(committed, torch.Tensor):
            committed = torch.as_tensor(list(committed), dtype=torch.long)
        self._verified(tree_ids, verify_logits, committed if committed.numel() else None, padded)

    @property
    def takes_padded(self) -> bool:
        """A device window takes an update whose tuples are padded to fixed sizes (a host window would read them)."""
        return self.backend != "host" or "ext" not in self.sources

    def _verified(self, tree_ids: torch.Tensor, verify_logits: torch.Tensor, committed: torch.Tensor | None,
                  padded: bool = False) -> None:
        """The update from a verification (``committed``: the tokens the step commits, None for none; ``padded``:
        -1 after them, and the rows of ``verify_logits`` past them padding too)."""
        if "ext" not in self.sources:
            return
        parts = [tree_ids.flatten()]                               # S <- S ⊕ tuple(Unique(C_draft))
        if self.k_ver > 0 and verify_logits.numel():               # ⊕ tuple(TopK(z_verify, K_ver))
            top = topk_ids(verify_logits, min(self.k_ver, verify_logits.shape[-1]))
            parts.append((top.masked_fill(committed[:, None] < 0, -1) if padded else top).flatten())
        if committed is not None:                                  # ⊕ committed tokens not entered above
            parts.append(committed)
        # one append of the tuples, each deduplicated on its own
        ids = parts[0] if len(parts) == 1 else torch.cat([to_device(p, self.device) for p in parts])
        self.append(ids, unique=True, parts=[p.numel() for p in parts], fresh=committed is not None, padded=padded)

    def active(self, depth: int = 0) -> ActiveSet:
        """I = Unique(Suffix(S, W_max)) plus the special ids: the packed buffer, or the ids ascending."""
        self.side.wait()
        if self.rows is not None:
            return self.rows.packed
        if self._ids is None or self._ids[0] != self.version:
            present = self.suffix.present()
            if self.always.numel():
                present[self.always] = True
            self._ids = (self.version, present.nonzero().flatten())
        return self._ids[1]

    # ---------------------------------------------------------------- the stream, the rows, the ablation
    def append(self, ids: torch.Tensor, unique: bool, parts: Sequence[int] = (), fresh: bool = False,
               padded: bool = False) -> None:
        """S <- S ⊕ ids (first occurrences only when ``unique``; ``parts``, ``fresh``, ``padded``: the tuples of
        :meth:`~microspec.vocab.window.CandidateWindow.extend`), keeping the window and the packed rows exact."""
        if ids.numel() == 0:
            return
        self.version += 1
        self.side.run(self.suffix.extend, self.suffix.load(ids), unique, parts, fresh, padded)

    def attach(self, weight: torch.Tensor) -> None:
        if self.gather != "packed" or (self.rows is not None and self.rows.packed.weight is weight):
            return
        self.side.wait()
        self.rows = WindowRows(self.suffix, weight, self.w_max + self.always.numel(), self.always,
                               fixed_shape=self.runtime.graphs)

    @property
    def packed(self) -> PackedRows | None:
        """The packed rows of I (None before :meth:`attach`, and for the id-list gathers)."""
        return None if self.rows is None else self.rows.packed

    @property
    def counts(self) -> torch.Tensor:
        """[V] int32: occurrences of each id in the window (built on demand by the host backend)."""
        return self.suffix.counts

    def ranked(self) -> torch.Tensor:
        """The ids of I by recency, most recent stream entry first."""
        self.side.wait()
        return self.suffix.ranked()

    def window(self) -> list[int]:
        """The last W_max stream entries, oldest first (for tests and inspection; synchronises)."""
        self.side.wait()
        return self.suffix.entries()

    def set_sources(self, sources: str) -> None:
        """The paper's ablation (Table 3): ``"ctx"`` keeps only S_init (prompt + prefill candidates, no updates),
        ``"ext"`` only the decoding-time candidates C_draft and C_ver (no prompt), ``"ctx+ext"`` is Algorithm 1."""
        check(sources in SOURCES, f"unknown sources {sources!r}; choose from {', '.join(SOURCES)}")
        self.sources = sources
        self.prompt_topk = self.k_pre if "ctx" in sources else 0
        self.wants_verify_logits = self.k_ver > 0 and "ext" in sources


_NAME_OPTION = re.compile(r"^(ctx|ext|indexed|packed|w\d+|kp\d+|kpall)$")
# ``kpall``: the prefill's top-K_pre at every prompt position, as Algorithm 1, where a device's default takes fewer
ALL_PROMPT_POSITIONS = 2 ** 31 - 1


def parse_name(text: str, method: str) -> dict | None:
    """``microspec`` and ``microspec-<opts>``: options joined by ``-``: ``w<N>`` (W_max), ``ctx`` / ``ext`` (the
    sources ablation), ``indexed`` / ``packed`` (the gather), ``kp<N>`` (K_pre at the last N prompt positions),
    ``kpall`` (K_pre at every prompt position, whatever the device's default)."""
    if text == "microspec":
        return {"vocab": "microspec"}
    if not text.startswith("microspec-"):
        return None
    opts = text[len("microspec-"):].split("-")
    bad = [o for o in opts if not _NAME_OPTION.match(o)]
    if bad or len(set(opts)) != len(opts) or {"ctx", "ext"} <= set(opts) or {"indexed", "packed"} <= set(opts):
        raise MicrospecError(f"method {method!r}: microspec options are w<N>, ctx or ext, indexed or packed, kp<N> "
                             "or kpall (e.g. microspec-w1024-indexed, microspec-kp64)")
    out: dict = {"vocab": "microspec"}
    for o in opts:
        if o in ("ctx", "ext"):
            out["sources"] = o
        elif o in ("indexed", "packed"):
            out["gather"] = o
        elif o == "kpall":
            out["k_pre_positions"] = ALL_PROMPT_POSITIONS
        elif o.startswith("kp"):
            out["k_pre_positions"] = int(o[2:])
        else:
            out["w_max"] = int(o[1:])
    return out


def build(method, vocab_size: int, device, always) -> VocabPolicy:
    from .packed import check_fused

    check_fused(method.gather, device)
    policy = MicroSpecVocab(vocab_size, w_max=W_MAX.value(method), k_pre=K_PRE.value(method),
                            k_ver=K_VER.value(method), always=always, device=device,
                            k_pre_positions=method.k_pre_positions, sources=SOURCES_OPTION.value(method),
                            **({} if method.gather is None else {"gather": method.gather}))
    return with_budgets(policy, method)


SPEC = PolicySpec(
    "microspec", "MicroSpec's in-context vocabulary (Algorithm 1): prompt, the target's top predictions, recent drafts",
    options=(W_MAX, K_PRE, K_VER, K_PRE_POSITIONS, SOURCES_OPTION, GATHER, POSITION_AWARE),
    names=("microspec", "microspec-OPTS"), parse_name=parse_name, build=build, check=check_ranked)
