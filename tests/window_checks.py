"""The device window's Triton kernels against their plain-torch references and the host window, over random appends:
run by tests/test_kernels.py under ``TRITON_INTERPRET=1`` on a CPU, and by tests/test_cuda.py compiled on a GPU.

Every step appends a random tuple (repeats, ids new and old, ``unique`` or not, sometimes split into up to three
tuples with the last one ``fresh``, sometimes more than W_max entries) to three windows with packed rows bound —
:class:`KernelWindow` (the kernels), :class:`DeviceWindow` + tensor :class:`PackedRows` updates (the plain-torch
reference) and :class:`HostWindow` + host-list updates — every fourth append with padding ids (-1) in its tuples,
to be left out as if absent — and checks, bit for bit: the window's entries, the counts, the slot of every id and
the packed rows.  A fourth window, a :class:`HostWindow` given each tuple as an append of
its own (the fresh tuple filtered by hand), checks what a split append means: its entries and counts equal theirs.
``python tests/window_checks.py DEVICE STEPS`` runs it alone.
"""

from __future__ import annotations

import sys

import torch

from microspec.kernels.window_update import WindowKernels, gather_rows, gather_rows_reference
from microspec.vocab.window import DeviceWindow, HostWindow, KernelWindow, WindowRows


def check_windows(device: str, steps: int, seed: int = 0, vocab: int = 200, w_max: int = 24, dim: int = 8) -> int:
    dev = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, dim, generator=g).to(dev)
    pinned = torch.tensor([1, 2])
    kinds = {"kernel": KernelWindow, "torch": DeviceWindow, "host": HostWindow}
    wins = {k: cls(vocab, w_max, dev) for k, cls in kinds.items()}
    rows = {k: WindowRows(w, weight, w_max + 2, pinned) for k, w in wins.items()}
    serial = HostWindow(vocab, w_max, dev)  # the same tuples, one append each
    for step in range(steps):
        m = int(torch.randint(0, 3 * w_max // 2 if step % 50 == 0 else 10, (1,), generator=g))
        hi = int(torch.randint(4, vocab, (1,), generator=g))  # a narrow range now and then: many repeats
        ids = torch.randint(0, hi, (m,), generator=g)
        unique = bool(torch.randint(0, 2, (1,), generator=g))
        parts, fresh = (m,), False
        if step % 3 == 0:  # two or three tuples, some empty
            n_cuts = int(torch.randint(1, 3, (1,), generator=g))
            cuts = sorted(torch.randint(0, m + 1, (n_cuts,), generator=g).tolist())
            parts = tuple(b - a for a, b in zip([0, *cuts], [*cuts, m]))
            fresh = bool(torch.randint(0, 2, (1,), generator=g))
        given, sizes, pad = ids, parts, step % 4 == 1
        if pad:  # padding (-1) anywhere in each tuple, as a verification's update taken from the device has it
            if parts[-1]:  # a last tuple with id 0 (a fresh one keeps it: the padding before it is not id 0)
                ids[-1] = 0
            pieces, sizes, start = [], [], 0
            for size in parts:
                part = ids[start : start + size].tolist()
                start += size
                for at in torch.randint(0, size + 1, (int(torch.randint(0, 4, (1,), generator=g)),),
                                        generator=g).tolist():
                    part.insert(at, -1)
                pieces += part
                sizes.append(len(part))
            given, sizes = torch.tensor(pieces, dtype=torch.long), tuple(sizes)
        for w in wins.values():
            w.extend(w.load(given), unique, sizes, fresh, padded=pad)
        start = 0
        for k, size in enumerate(parts):
            part = ids[start : start + size].tolist()
            if fresh and k == len(parts) - 1:
                part = [t for t in part if t not in ids[:start].tolist()]
            serial.append(torch.tensor(part, dtype=torch.long), unique)
            start += size
        host = wins["host"]
        assert serial.entries() == host.entries() and torch.equal(serial.counts, host.counts), (step, "split")
        want_rows = rows["host"].packed
        for k in ("kernel", "torch"):
            w, packed = wins[k], rows[k].packed
            assert w.entries() == host.entries(), (step, k, "entries")
            assert torch.equal(w.counts.cpu(), host.counts.cpu()), (step, k, "counts")
            assert torch.equal(packed.slot_ids.cpu()[:-1], want_rows.slot_ids.cpu()[:-1]), (step, k, "slots")
            assert torch.equal(packed.slot_of.cpu()[:-1], want_rows.slot_of.cpu()[:-1]), (step, k, "slot_of")
            assert torch.equal(packed.rows.cpu()[:-1], want_rows.rows.cpu()[:-1]), (step, k, "rows")
        if step % 97 == 96:  # a new request
            for k in wins:
                wins[k].reset()
                rows[k].reset()
            serial.reset()
    return steps


def check_gather(device: str, seed: int = 0) -> None:
    dev = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    for dtype in (torch.float32, torch.bfloat16):
        for v, d, cap, most in ((50, 8, 10, 6), (300, 300, 40, 17), (40, 1, 5, 5)):
            weight = torch.randn(v, d, generator=g).to(dev, dtype)
            got = torch.randn(cap + 1, d, generator=g).to(dev, dtype)
            want = got.clone()
            ids = torch.randperm(v, generator=g)[:most].to(dev)
            slots = torch.randperm(cap, generator=g)[:most].to(dev)
            for n in (0, most // 2, most):
                count = torch.tensor([n], dtype=torch.int32, device=dev)
                gather_rows(weight, got, ids, slots, count, most)
                gather_rows_reference(weight, want, ids, slots, count)
                assert torch.equal(got, want), (dtype, v, d, n)
    kern = WindowKernels(64, dev)  # the window alone (no rows bound): the ring and the counts
    ring = torch.full((9,), -1, dtype=torch.long, device=dev)
    ptr = torch.zeros((), dtype=torch.long, device=dev)
    counts = torch.zeros(64, dtype=torch.int32, device=dev)
    kern.window_update(torch.tensor([5, 5, 7, 1], device=dev), ring, ptr, counts, unique=True)
    assert ring[:3].tolist() == [5, 7, 1] and int(ptr) == 3 and int(counts.sum()) == 3
    # three tuples, each deduplicated on its own, the last keeping none of the ids before it: 5 7 | 7 2 | 9
    kern.window_update(torch.tensor([5, 7, 5, 7, 2, 2, 9, 5, 9], device=dev), ring, ptr, counts, unique=True,
                       parts=(3, 3, 3), fresh=True)
    assert ring[:8].tolist() == [5, 7, 1, 5, 7, 7, 2, 9] and int(ptr) == 0 and int(counts.sum()) == 8


if __name__ == "__main__":
    check_gather(sys.argv[1])
    print("ok", check_windows(sys.argv[1], int(sys.argv[2])))
