"""auto's measured starts are data: the shipped ``auto/starts.json`` is what ``benchmarks/auto_starts.py`` computes
from the committed results, every (device kind, decoding kind) has a start, and the library types no ratio."""

from __future__ import annotations

import json
import re

from support import ROOT, load_script

from microspec.auto.start import DECODING_KINDS, EAGLE, LOOKUP, MEASURED, PLAIN, start_arm
from microspec.devices import DEVICE_KINDS

SHIPPED = ROOT / "src" / "microspec" / "auto" / "starts.json"


def test_shipped_starts_are_what_the_results_give():
    generator = load_script(ROOT / "benchmarks" / "auto_starts.py")
    assert generator.render() == SHIPPED.read_text(encoding="utf-8"), (
        "src/microspec/auto/starts.json differs from benchmarks/results/: run `python3 benchmarks/auto_starts.py`")
    assert generator.DECODING_KINDS == DECODING_KINDS and (generator.PLAIN, generator.LOOKUP) == (PLAIN, LOOKUP)
    by_device = json.loads(SHIPPED.read_text(encoding="utf-8"))["starts (device kind, then decoding kind)"]
    for row in (row for by_decoding in by_device.values() for row in by_decoding.values()):
        assert row["sources"] or row["untraced"], row  # a start names its run or says it is not committed
        for source in row["sources"]:
            assert (ROOT / "benchmarks" / "results" / source["file"]).is_file(), source["file"]


def test_every_device_and_decoding_kind_has_a_start():
    assert set(MEASURED) == {(d, k) for d in DEVICE_KINDS for k in DECODING_KINDS}
    for (device, kind), start in MEASURED.items():
        assert start.arm in (PLAIN, LOOKUP, EAGLE) and start.why and start.measured and start.source
        assert start_arm(device, kind, shipped_head=True) == (start.arm, start.why)
        assert start_arm(device, kind, shipped_head=False) == (start.arm, start.why)


def test_the_library_types_no_measured_ratio():
    source = (ROOT / "src" / "microspec" / "auto" / "start.py").read_text(encoding="utf-8")
    assert not re.findall(r"\d\.\d+x", source)
