"""CUDA graphs of a model's forward over a KV cache: the verify pass and the draft levels with fixed shapes.

A decode step launches a few hundred small kernels; on a GPU their launch cost is a large part of a small model's
step, and a CUDA graph replays them in one launch.  A graph fixes every shape and address, while
:meth:`NativeCausalLM.run <microspec.models.native.NativeCausalLM.run>` attends over exactly the cache's live slots
and writes at a host-side offset.  :func:`static_run` is the same forward in fixed shapes:

- the new keys and values go to the slots in a device tensor (``index_copy_``), not to a host offset;
- attention covers the first ``S`` slots, ``S`` the cache length rounded up to a bucket of ``bucket`` slots, with a
  mask [T, S] that hides every slot past the live ones (and what the tree mask and the sliding windows hide), built
  inside the graph from its inputs (:func:`device_masks`; a caller's mask over the whole cache is made into the
  bucket's masks before the replay);
- the position ids, the slots and a tree's [T, T] mask are inputs, written into the graph's static buffers before
  each replay (slots and default positions in place: the step's eager work is a few copies and the replay).

:class:`CudaGraphs` captures one graph per (rows, bucket, cache) at the second use of that shape (a shape used once,
a prompt's, runs eagerly) and replays it afterwards, up to :data:`MAX_GRAPHS` a cache (the least recently used
go first); a cache's graphs and their memory pool go when the cache does.  A finished generation gives its cache
back to the model (:class:`~microspec.models.kv_cache.CachePool`), and the next one of its size class takes it with
its graphs: a later request replays the shapes earlier ones captured and captures only those used once before
(the second request captures the prompt's shape, which the first ran eagerly).  Anything it cannot run (no
CUDA, more rows than ``max_rows``, taps or an early exit, a capture that fails) goes to the eager forward, which is
also what every CPU run uses.

A forward's graph may go on with a :class:`Tail` inside the same replay: a plain decoding step's LM head,
processors and choice of the next token (:meth:`Generation.plain_replay
<microspec.decoding.loop.Generation.plain_replay>`), so that a plain step is one replay and one read of its token.

Beside the forward's graphs, :class:`GraphedCall` replays any function of fixed shapes (the packed draft head's
product and top-k), and :class:`CallsByCache` keeps such graphs by the KV cache they write: an EAGLE drafter's whole
tree draft (every level's forward, the head's top-k, the tree's growth and rerank) is one of them, one replay a step
(:meth:`WholeTreeBuilder.build <microspec.drafters.builders.WholeTreeBuilder.build>`).

Attention over a bucket with masked slots adds exact zeros to each softmax, but a GPU kernel may sum in another
order over a longer row, so graphed logits can differ from eager ones in the last bits, as a pass over 5 rows
already differs from a pass over 1 on a GPU.  Greedy speculative output equals the model's own greedy output where
no two logits are that close; tests/test_cuda.py checks it, graphed and eager, on tiny fp32 and bf16 models.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..devices import profile
from ..onetime import paying
from .kv_cache import KVCache
from .layers import by_window

BUCKET = 256  # cache slots per attention bucket: a graph serves lengths up to a multiple of this
MAX_ROWS = 64  # the most new rows a graphed forward takes (a verify tree, a draft level)
MAX_GRAPHS = 128  # graphs kept per cache (row counts x attention spans seen)


def bucket_of(slots: int, bucket: int, capacity: int) -> int:
    """The attention span for ``slots`` live slots: rounded up to a multiple of ``bucket``, at most ``capacity``."""
    return min(-(-slots // bucket) * bucket, capacity)


def static_masks(model, cache: KVCache, start: int, t: int, positions: torch.Tensor | None,
                 mask: torch.Tensor | None, span: int) -> dict:
    """Per distinct sliding window: a bool mask [1, 1, t, span] (True = may attend) for ``t`` new rows at slots
    ``start..start+t`` over the first ``span`` slots; ``cache.pos`` must already hold the new rows' positions."""
    dev = cache.device
    s = start + t
    qpos = positions if positions is not None else torch.arange(start, s, device=dev)
    live = torch.arange(span, device=dev) < s
    if mask is None:
        base = torch.ones(t, span, dtype=torch.bool, device=dev).tril(diagonal=start)
    elif mask.dim() == 2 and mask.shape == (t, t):
        base = live[None, :].expand(t, span).clone()
        base[:, start:s] = mask
    else:
        base = torch.zeros(t, span, dtype=torch.bool, device=dev)
        base[:, :s] = mask.reshape(t, s).to(torch.bool)
    base &= live[None, :]
    return by_window(model.spec.layer_windows, base, cache.pos[:span], qpos)


def device_masks(model, cache: KVCache, slots: torch.Tensor, positions: torch.Tensor, tree: torch.Tensor | None,
                 span: int) -> dict:
    """:func:`static_masks` built from device tensors alone, for inside a captured graph (nothing read or decided on
    the host): the new rows at ``slots`` [t] (in a row) at ``positions``, causal (a row sees the slots up to its
    own) or, with ``tree`` [t, t], the cached prefix and the tree's own mask among the new rows; ``cache.pos`` must
    hold the new rows' positions.  The same masks as :func:`static_masks` (tests/test_whole_draft.py)."""
    t = slots.shape[0]
    j = torch.arange(span, device=slots.device)
    if tree is None:
        base = j[None, :] <= slots[:, None]
    else:
        rel = j[None, :] - slots[:1, None]  # [1, span]: a slot's place among the new rows (< 0: the prefix)
        among = tree.gather(1, rel.clamp(0, t - 1).expand(t, span)) & (rel >= 0) & (rel < t)
        base = (rel < 0) | among
    return by_window(model.spec.layer_windows, base, cache.pos[:span], positions)


def static_inputs(model, cache: KVCache, t: int, positions: torch.Tensor | None = None,
                  mask: torch.Tensor | None = None, span: int | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """What :func:`static_run` takes for ``t`` new rows after ``cache.length``, placed as the eager forward places
    them: their slots, their positions (``positions``, default the slots; written to ``cache.pos``) and the masks
    over the first ``span`` slots (default the cache's capacity)."""
    start = cache.length
    model.check_room(cache, t)
    slots = torch.arange(start, start + t, device=cache.device)
    pos = positions if positions is not None else slots
    cache.pos[start: start + t] = pos
    span = cache.capacity if span is None else span
    return slots, pos, static_masks(model, cache, start, t, positions, mask, span)


def static_run(model, x: torch.Tensor, cache: KVCache, slots: torch.Tensor, positions: torch.Tensor,
               masks: dict, span: int) -> torch.Tensor:
    """The forward of ``x`` [T, d] in fixed shapes: keys and values written at ``slots`` [T], attention over the
    first ``span`` slots under ``masks`` (from :func:`static_masks`).  Leaves ``cache.length`` alone."""
    spec = model.spec
    rope = model._rope_tables(positions, model.dtype)
    gqa = spec.num_heads != spec.num_kv_heads

    def attend(i: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None) -> torch.Tensor:
        buf = cache.kv[i]
        if k is not None:  # None: the fused kernel wrote them (attend.store)
            buf[0].index_copy_(1, slots, k)
            buf[1].index_copy_(1, slots, v)
        return model._attend(q, buf[0][:, :span], buf[1][:, :span], masks[spec.layer_windows[i]], gqa)

    attend.store = (cache, slots)

    return model.stack(x, model.model.layers, rope, attend)[1]


@dataclass(frozen=True)
class Tail:
    """What a graphed forward goes on to do inside the same replay: ``fn(hidden, *inputs)`` returns a tuple of
    tensors (a plain step's LM head, processors and choice of the next token).  ``inputs`` are copied into the
    graph's static buffers before each replay; ``key`` names everything else ``fn`` depends on (the values it bakes
    in), for a graph is replayed for any later call of the same key, whatever function that call passes."""

    key: tuple
    fn: Callable[..., tuple[torch.Tensor, ...]]
    inputs: tuple[torch.Tensor, ...] = ()


class _Graph:
    """A captured forward and its static inputs: ``masks`` (by window, built before each replay) where the caller's
    mask covers the whole cache, else ``tree`` (the [t, t] mask among the new rows, or None: causal) from which the
    graph builds its masks itself; ``tail`` the static inputs of a :class:`Tail`'s function."""

    def __init__(self, x, slots, positions, masks, tree, out, graph, tail=()):
        self.x, self.slots, self.positions, self.masks, self.tree = x, slots, positions, masks, tree
        self.out, self.graph, self.tail = out, graph, tail


class _CacheGraphs:
    """One cache's graphs: by (rows, span, dtype, buffer address, capacity) a graph, or None where its capture was
    refused; the keys seen once (captured at their second use: a shape used once, a prompt's, is not worth a
    capture); the memory pool they share, which goes with them."""

    def __init__(self):
        self.graphs: dict[tuple, _Graph | None] = {}
        self.seen: set[tuple] = set()
        self.pool = None

    def lookup(self, key: tuple) -> _Graph | None | bool:
        """The graph of ``key``, None (run eagerly), or True (capture it now).  Every span's graphs stay: the cache
        serves request after request (CachePool), each growing through the spans again; past :data:`MAX_GRAPHS`
        the longest unused go first."""
        if key in self.graphs:
            graph = self.graphs.pop(key)  # most recently used last
            self.graphs[key] = graph
            return graph
        if key not in self.seen:
            self.seen.add(key)
            return None
        while len(self.graphs) >= MAX_GRAPHS:
            del self.graphs[next(iter(self.graphs))]
        if not any(g is not None for g in self.graphs.values()):
            self.pool = None  # no graph holds it: CUDA's allocator takes no new capture into a released pool
        return True


class CudaGraphs:
    """Graphed forwards of ``model`` (see the module's doc); :meth:`run` returns None where the eager forward must
    run instead."""

    def __init__(self, model, bucket: int = BUCKET, max_rows: int = MAX_ROWS):
        self.model, self.bucket, self.max_rows = model, bucket, max_rows
        self.caches: weakref.WeakKeyDictionary[KVCache, _CacheGraphs] = weakref.WeakKeyDictionary()  # gone with them
        self.replays = 0
        self.captures = 0
        self.refusals: list[str] = []  # why captures were refused (those shapes run eagerly)

    def run(self, x: torch.Tensor, cache: KVCache, positions: torch.Tensor | None,
            mask: torch.Tensor | None, tail: Tail | None = None) -> torch.Tensor | tuple[torch.Tensor, ...] | None:
        """The graphed forward of ``x``: input vectors [T, d], or token ids [T] (embedded inside the graph); None
        where the eager forward must run.  With ``tail``: (the hidden states, ``tail.fn``'s tensors), all of one
        replay."""
        t = int(x.shape[0])
        if not profile(x.device).graphs or t == 0 or t > self.max_rows:
            return None
        start = cache.length
        span = bucket_of(start + t, self.bucket, cache.capacity)
        state = self.caches.setdefault(cache, _CacheGraphs())
        # causal and [t, t] tree masks are built inside the graph from its inputs; a mask over the whole cache
        # (its width the cache's length) is made into the bucket's masks before each replay
        kind = None if mask is None else "tree" if mask.dim() == 2 and mask.shape == (t, t) else "full"
        key = (t, span, x.dtype, cache.kv.data_ptr(), cache.capacity, kind,
               None if tail is None else (tail.key, tuple((i.shape, i.dtype) for i in tail.inputs)))
        entry = state.lookup(key)
        if entry is None:
            return None
        self.model.check_room(cache, t)
        if entry is True:
            entry = state.graphs[key] = self._capture(state, x, cache, start, positions, mask, kind, span, tail)
            if entry is None:
                return None
        else:
            entry.x.copy_(x)
            for buffer, value in zip(entry.tail, tail.inputs if tail is not None else ()):
                buffer.copy_(value)
            self._inputs(entry, cache, start, positions, mask, span)
        entry.graph.replay()
        self.replays += 1
        cache.length = start + t
        return tuple(o.clone() for o in entry.out) if tail is not None else entry.out.clone()

    def _inputs(self, entry: _Graph, cache: KVCache, start: int, positions, mask, span: int) -> None:
        """The step's inputs into the graph's static buffers: slots and positions (written in place), the tree mask
        or, for a whole-cache mask, the bucket's masks."""
        t = entry.slots.shape[0]
        torch.arange(start, start + t, out=entry.slots)
        if positions is None:
            torch.arange(start, start + t, out=entry.positions)
        else:
            entry.positions.copy_(positions)
        if entry.tree is not None:
            entry.tree.copy_(mask)
        if entry.masks is not None:
            cache.pos[start: start + t] = entry.positions
            for w, m in static_masks(self.model, cache, start, t, positions, mask, span).items():
                entry.masks[w].copy_(m)

    def _capture(self, state: _CacheGraphs, x, cache, start, positions, mask, kind, span,
                 tail: Tail | None) -> _Graph | None:
        model, t, dev = self.model, int(x.shape[0]), x.device
        masks = {w: torch.empty(1, 1, t, span, dtype=torch.bool, device=dev) for w in set(model.spec.layer_windows)} \
            if kind == "full" else None  # filled by _inputs
        entry = _Graph(x.clone(), torch.empty(t, dtype=torch.long, device=dev),
                       torch.empty(t, dtype=torch.long, device=dev), masks,
                       mask.to(torch.bool).clone() if kind == "tree" else None, None, None,
                       () if tail is None else tuple(i.clone() for i in tail.inputs))
        self._inputs(entry, cache, start, positions, mask, span)

        def body():
            cache.pos.index_copy_(0, entry.slots, entry.positions)
            masks = entry.masks if entry.masks is not None else \
                device_masks(model, cache, entry.slots, entry.positions, entry.tree, span)
            x = entry.x if entry.x.is_floating_point() else model.embed(entry.x)  # token ids: embedded here
            out = static_run(model, x, cache, entry.slots, entry.positions, masks, span)
            return out if tail is None else (out, *tail.fn(out, *entry.tail))

        if state.pool is None:
            state.pool = torch.cuda.graph_pool_handle()
        captured = capture(body, state.pool, self.refusals)
        if captured is None:
            if not any(g is not None for g in state.graphs.values()):
                state.pool = None
            return None
        self.captures += 1
        entry.graph, entry.out = captured
        return entry


def capture(body, pool, refusals: list[str] | None = None) -> tuple[torch.cuda.CUDAGraph, object] | None:
    """(graph, outputs) of ``body()`` captured after two warm-up runs on a side stream; None where the capture is
    refused (a host read inside, an operation CUDA graphs do not take), its reason appended to ``refusals``.

    A refused capture ends without CUDA's generator leaving capture mode (``CUDAGraph.capture_end`` raises before
    it resets the generator), after which any random draw outside a capture fails; an empty capture resets it."""
    with paying("CUDA graph capture"):
        return _capture(body, pool, refusals)


def _capture(body, pool, refusals: list[str] | None) -> tuple[torch.cuda.CUDAGraph, object] | None:
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(main)
    try:
        # all on the side stream, which the outer context restores even when ending a refused capture raises
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazy initialisations happen outside the capture
                body()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=side):
                out = body()
    except Exception as exc:  # noqa: BLE001 - anything a capture refuses runs eagerly
        if refusals is not None:
            refusals.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        _reset_generator(side)
        return None
    finally:
        main.wait_stream(side)  # what the warm-up wrote (KV slots the eager rerun writes too) comes first
    return graph, out


def _reset_generator(stream: torch.cuda.Stream) -> None:
    """Take the default CUDA generator out of the capture mode a refused capture left it in."""
    try:
        with warnings.catch_warnings(), torch.cuda.stream(stream):
            warnings.simplefilter("ignore")  # "the CUDA graph is empty": it is meant to be
            with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream):
                pass
    except Exception:  # noqa: BLE001 - nothing more can be done; later draws report CUDA's own error
        pass


class GraphedCall:
    """``fn(x)`` replayed as a CUDA graph, one per key (the caller's: what fixes the shapes and addresses ``fn``
    reads), ``x`` copied into the graph's static input; the result (a tensor or a tuple of them) is fresh.
    :meth:`__call__` returns None where the capture was refused (the caller runs ``fn`` itself).  ``owner``: the
    object whose buffers ``fn`` reads (a packed draft vocabulary): its graph is held by a weak reference to it, so
    that a graph is never replayed for another object that Python gave the same ``id`` after the first was freed
    (it would read freed buffers), and the graphs of owners that are gone are dropped."""

    def __init__(self):
        self.graphs: dict = {}
        self.owners: dict = {}  # key -> weak reference to its owner, where one was given
        self.pool = None
        self.replays = 0
        self.captures = 0

    def __call__(self, key, fn, x: torch.Tensor | tuple[torch.Tensor, ...], owner=None) -> torch.Tensor | None:
        """``fn(x)``, or ``fn(*x)`` for a tuple of inputs (each copied into a static input of its own)."""
        inputs = x if isinstance(x, tuple) else (x,)
        entry = self.graphs.get(key, False)
        if entry is not False and owner is not None and self.owners.get(key, lambda: None)() is not owner:
            entry = False  # another owner under a reused id: capture it afresh
        if entry is False:
            gone = [k for k, ref in self.owners.items() if ref() is None]
            for k in gone:
                del self.owners[k]
                self.graphs.pop(k, None)
            if not any(g is not None for g in self.graphs.values()):
                self.pool = None  # no graph holds it: CUDA's allocator takes no new capture into a released pool
            static = tuple(t.clone() for t in inputs)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            captured = capture(lambda: fn(*static), self.pool)
            self.captures += captured is not None
            entry = self.graphs[key] = None if captured is None else (static, *captured)
            if owner is not None:
                self.owners[key] = weakref.ref(owner)
            if captured is None and all(g is None for g in self.graphs.values()):
                self.pool = None  # a pool no graph holds takes no new capture
        if entry is None:
            return None
        static, graph, out = entry
        for buffer, value in zip(static, inputs):
            buffer.copy_(value)
        graph.replay()
        self.replays += 1
        return tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()


class CallsByCache:
    """:class:`GraphedCall` graphs of functions that write a KV cache (a whole draft), kept by that cache and gone with
    it (a pooled cache keeps them for the next generation), each key captured at its second use: :meth:`__call__`
    returns None (run it eagerly) for a key seen once, or whose capture was refused."""

    def __init__(self):
        self.calls: weakref.WeakKeyDictionary[KVCache, tuple[set, GraphedCall]] = weakref.WeakKeyDictionary()

    def __call__(self, cache: KVCache, key, fn, inputs: tuple[torch.Tensor, ...], owner=None):
        seen, call = self.calls.setdefault(cache, (set(), GraphedCall()))
        if key not in call.graphs and key not in seen:
            seen.add(key)
            return None
        return call(key, fn, inputs, owner)

    @property
    def replays(self) -> int:
        return sum(call.replays for _, call in self.calls.values())

    @property
    def captures(self) -> int:
        return sum(call.captures for _, call in self.calls.values())
