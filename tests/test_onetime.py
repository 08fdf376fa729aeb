"""One-time costs (microspec.onetime): timed apart, in none of a generation's times nor in ``auto``'s choices."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from support import official_checkpoint

from microspec import onetime


def test_the_clock_stands_still_while_a_one_time_cost_is_paid():
    before = onetime.costs().get("test: a stall", 0.0)
    t0, w0, paid0 = onetime.clock(), time.perf_counter(), onetime.total()
    with onetime.paying("test: a stall"):
        time.sleep(0.2)
        with onetime.paying("test: inside"):  # nested: counted once, as the outer block
            time.sleep(0.05)
    took, wall = onetime.clock() - t0, time.perf_counter() - w0
    assert wall >= 0.25 and took < 0.05
    assert onetime.total() - paid0 == pytest.approx(wall, abs=0.05)
    assert onetime.costs()["test: a stall"] - before >= 0.25 and "test: inside" not in onetime.costs()
    assert "test: a stall" in onetime.summary()


def test_another_threads_cost_leaves_this_threads_clock_running():
    t0 = onetime.clock()

    def pay():
        with onetime.paying("test: elsewhere"):
            time.sleep(0.1)

    worker = threading.Thread(target=pay)
    worker.start()
    worker.join()
    assert onetime.clock() - t0 >= 0.1  # this thread waited: its own time


def test_kernel_builds_and_conversions_are_one_time_costs(monkeypatch, tmp_path):
    """A kernel's build (a stand-in that takes a while) is recorded as the kernel's build."""
    from microspec.kernels import _build

    monkeypatch.setenv("MICROSPEC_CACHE", str(tmp_path))
    ext = _build.Extension("test_nothing", ["nothing.cpp"], "test kernel", root=tmp_path)
    (tmp_path / "nothing.cpp").write_text("int f() { return 1; }\n")

    def slow_load(*a, **k):
        time.sleep(0.2)
        raise RuntimeError("no build here")

    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "load", slow_load)
    before = onetime.costs().get("test kernel build", 0.0)
    t0 = onetime.clock()
    assert ext.load() is None and "no build here" in ext.failed
    assert onetime.costs()["test kernel build"] - before >= 0.2 and onetime.clock() - t0 < 0.1


class FakeTime:
    """A clock that moves ``tick`` seconds at each reading outside a one-time cost (where it stands still) and
    ``advance`` seconds when told: timings, and so ``auto``'s choices, the same from run to run."""

    def __init__(self, tick: float = 1e-3):
        self.now, self.tick = 1000.0, tick

    def perf_counter(self) -> float:
        if not getattr(onetime._local, "depth", 0):
            self.now += self.tick
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_a_first_use_cost_inside_a_step_changes_no_speed_and_no_choice(monkeypatch, tmp_path, tiny_model_dir):
    """A slow one-time cost (a stand-in for a kernel build on a fresh cache, 30 s on a clock that the test moves)
    paid inside an arm's first draft, as a fresh machine paid the CPU kernel's build inside the EAGLE arm's: the
    generation's speeds and ``auto``'s choices are those of the same generation without it, exactly; the cost is
    reported apart (``one_time_s``).  The tiny model's random head is never taken: prompt lookup, which ``auto``
    starts with here and asks at every step, pays the cost; a second run pays it in the suffix arm's first draft."""
    import microspec
    from microspec.decoding import GenerationConfig

    monkeypatch.setenv("MICROSPEC_CACHE", str(tmp_path / "cache"))  # a fresh cache ...
    monkeypatch.setenv("MICROSPEC_CPU_KERNEL", "0")  # ... whose real kernels are not built here
    lm = microspec.load_model(str(tiny_model_dir), dtype="fp32")
    head, _, _ = official_checkpoint(tmp_path / "eagle")
    prompt = lm.tokenizer("w5 w6 w7 w8 w5 w6 w7 w9 w5 w6").input_ids
    cfg = GenerationConfig(max_new_tokens=48, ignore_eos=True)
    stall = 30.0

    def run(arm_name: str | None):
        fake = FakeTime()
        monkeypatch.setattr(onetime, "time", fake)
        engine = microspec.auto.engine(lm, draft=str(head))
        online = engine.engine_for(cfg)
        for name, arm in online.drafter.arms.items():
            if name == arm_name:
                first, propose = [True], arm.propose

                def propose_paying(ctx, first=first, propose=propose):
                    if first[0]:
                        first[0] = False
                        with onetime.paying("test: a kernel built at first use"):
                            fake.advance(stall)
                    return propose(ctx)

                monkeypatch.setattr(arm, "propose", propose_paying)
        with torch.inference_mode():
            out = engine.generate_ids(prompt, cfg)
        monkeypatch.setattr(onetime, "time", time)
        return out

    warm = run(None)
    assert warm.stats.one_time_s == 0 and len(warm.stats.auto["arms"]) > 1  # it chose among arms
    for arm in ("lookup", "suffix"):
        cold = run(arm)
        assert cold.stats.one_time_s == pytest.approx(stall)
        assert cold.token_ids == warm.token_ids
        assert cold.stats.auto == warm.stats.auto  # the same choices, switches and measured costs
        assert cold.stats.decode_tokens_per_s == warm.stats.decode_tokens_per_s
        assert (cold.stats.wall_s, cold.stats.draft_s, cold.stats.verify_s) == \
            (warm.stats.wall_s, warm.stats.draft_s, warm.stats.verify_s)
