"""Peak resident memory (RSS) of one generation per ``--weights`` setting, each in a fresh process.

    python benchmarks/measure/peak_memory.py                          # gemma-3-270m, gguf and bf16, 64 tokens
    python benchmarks/measure/peak_memory.py --weights gguf,gguf-f32,bf16,fp32 --model smollm2-135m-instruct

Each setting runs ``microspec generate`` (plain decoding, or ``--extra``'s drafter options) in its own Python
process; the peak RSS the kernel reports for that process (``ru_maxrss``) covers loading, the prefill and
decoding.  With ``gguf`` the packed blocks are memory-mapped from the GGUF file, so the pages a step reads count
in RSS like any other weights: what is compared is the whole footprint.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import resource, sys
from microspec.cli import main
code = main(sys.argv[1:])
print("PEAK_RSS_KIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def peak_rss_mib(args: list[str]) -> tuple[float, str]:
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"generate failed: {proc.stderr.strip().splitlines()[-1]}")
    kib = next(int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("PEAK_RSS_KIB"))
    stats = next((line for line in proc.stderr.splitlines() if line.startswith("[microspec]")), "")
    return kib / 1024, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--weights", default="gguf,bf16")
    ap.add_argument("--prompt", default="The three laws of robotics are")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--extra", default="--drafter none",
                    help="more generate options (default: plain decoding), e.g. '--drafter eagle --vocab microspec'")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    out = {}
    for w in a.weights.split(","):
        args = ["generate", "--model", a.model, "--weights", w, "--prompt", a.prompt, "--max-new-tokens",
                str(a.max_new_tokens), "--threads", "2", *a.extra.split()]
        mib, stats = peak_rss_mib(args)
        out[w] = round(mib, 1)
        print(f"{w}: peak RSS {mib:.0f} MiB   {stats}")
    if len(out) > 1 and "bf16" in out:
        for w, mib in out.items():
            print(f"{w} / bf16 = {mib / out['bf16']:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "peak_rss_mib": out, "extra": a.extra}, f, indent=2)


if __name__ == "__main__":
    main()
