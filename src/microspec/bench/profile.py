"""Where a decode step's time goes, per method (``microspec bench --profile``): one untimed generation of the first
question under CUDA's sync detector (the host waits it makes) and one under ``torch.profiler`` (the device's busy
time: its kernels' and copies' own durations, and a census of them: how many a step, and the ones that take the
most time), beside the step's wall time.

A step that the host bounds shows a device busy share far below 1: the GPU idles while Python prepares the next
launch.  The waits count every ``torch.cuda`` synchronisation the detector reports, prefill included, over the
generation's decode steps (tests/test_sync_free.py holds every method to one a step; on a CPU there is no device to
wait for and the field is None).  Plain decoding's read of each token waits on an event for that step alone, the
next step already queued (``transfer.HostRead``), and so does a device walk's read of a step's acceptance (a
tree's or a lookup's; an EAGLE tree's next draft queued behind it): waits the detector does not report, so such
steps count none.  Both extra generations are untimed and not recorded as answers.
"""

from __future__ import annotations

import warnings

import torch

from ..devices import profile as device_profile


def _device_us(event) -> float:
    """An averaged profiler event's own device time in microseconds (``self_device_time_total`` in recent torch,
    ``self_cuda_time_total`` before)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


CENSUS_TOP = 8  # the kernels the census names, by device time


def census(events, steps: int, top: int = CENSUS_TOP) -> dict:
    """Of a profile's averaged device events (``key``, ``count``, their own device time): the kernels and copies a
    decode step runs (each launch the profiler records) and the ``top`` by device time, each
    with its ms and launches a step.  On a small model a step's device time is mostly a count of tiny kernels, so
    the count says what fusing would save."""
    timed = [e for e in events if _device_us(e) > 0]
    steps = max(steps, 1)
    named = sorted(timed, key=_device_us, reverse=True)[:top]
    return {"kernels_per_step": round(sum(e.count for e in timed) / steps, 1),
            "top_kernels": [{"name": str(e.key)[:80], "ms_per_step": round(_device_us(e) / 1000.0 / steps, 4),
                             "per_step": round(e.count / steps, 2)} for e in named]}


def profile_method(runner, prompt_ids: list[int], cfg) -> dict:
    """``runner`` (an engine method: its generations carry stats) on ``prompt_ids`` under ``cfg``: steps, wall ms
    per decode step, host waits per step (CUDA) and the device's busy ms per step and share of the wall (CUDA)."""
    cuda = device_profile(runner.lm.model.device).runs_behind_host  # CUDA's sync detector and profiler
    waits = None
    if cuda:
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                turn = runner.run(prompt_ids, cfg)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        waits = sum("synchroniz" in str(w.message) for w in seen)
    else:
        turn = runner.run(prompt_ids, cfg)
    st = turn.stats
    steps = max(st.steps, 1)
    wall_ms = 1000.0 * (st.wall_s - st.prefill_s) / steps
    out = {"steps": st.steps, "wall_ms_per_step": round(wall_ms, 3),
           "host_waits_per_step": None if waits is None else round(waits / steps, 2),
           "device_ms_per_step": None, "device_busy_share": None}
    if cuda:
        from torch.profiler import ProfilerActivity, profile

        try:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                again = runner.run(prompt_ids, cfg)
            torch.cuda.synchronize()
            events = prof.key_averages()
            busy_ms = sum(_device_us(e) for e in events) / 1000.0
            per_step = busy_ms / max(again.stats.steps, 1)
            out["device_ms_per_step"] = round(per_step, 3)
            out["device_busy_share"] = round(per_step / wall_ms, 3) if wall_ms > 0 else None
            out.update(census(events, again.stats.steps))
        except Exception as exc:  # noqa: BLE001 - a profiler that cannot run (no CUPTI) leaves the rest standing
            out["device_error"] = f"{type(exc).__name__}: {exc}"
    return out


def profile_lines(profiles: dict[str, dict]) -> list[str]:
    """The report's table of :func:`profile_method` results by method."""
    def cell(v, fmt):
        return "–" if v is None else format(v, fmt)

    lines = ["| method | steps | wall ms / step | host waits / step | device busy ms / step | device busy share | "
             "kernels / step |", "|---|---|---|---|---|---|---|"]
    for name, p in profiles.items():
        lines.append(f"| {name} | {p['steps']} | {cell(p['wall_ms_per_step'], '.2f')} | "
                     f"{cell(p['host_waits_per_step'], '.2f')} | {cell(p['device_ms_per_step'], '.3f')} | "
                     f"{cell(p['device_busy_share'], '.2f')} | {cell(p.get('kernels_per_step'), '.1f')} |")
    named = {name: p["top_kernels"] for name, p in profiles.items() if p.get("top_kernels")}
    if named:
        lines += ["", "The kernels that take the most device time a step (ms, launches):", ""]
        lines += [f"- {name}: " + "; ".join(f"`{k['name']}` {k['ms_per_step']:.3f} ms, {k['per_step']:g}"
                                            for k in top) for name, top in named.items()]
    return lines
