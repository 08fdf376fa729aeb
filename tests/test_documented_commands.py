"""Every command BENCHMARKS.md and docs/history.md cite as the source of a table still runs as written: each
concrete ``microspec`` command parses with today's command line (its options and their values exist), the files it
reads from the repository exist, and each cited script is in the repository."""

from __future__ import annotations

import re
import shlex

import pytest
from support import ROOT

from microspec.cli import build_parser
from microspec.errors import MicrospecError

DOCS = (ROOT / "BENCHMARKS.md", ROOT / "docs" / "history.md")
SOURCE = re.compile(r"<sub>From `[^`]*`: `([^`]*)`")
# a command written as a template (a placeholder, an optional part, an elision or a prose remark): not runnable as is
TEMPLATE = re.compile(r"[<\[…(]|\s[A-Z]{1,6}(\s|$)")


def _cited() -> list[str]:
    out = []
    for doc in DOCS:
        for m in SOURCE.finditer(doc.read_text(encoding="utf-8")):
            out += [c.strip() for c in m.group(1).split("; ") if c.strip()]
    return sorted(set(out))


COMMANDS = _cited()
MICROSPEC = [c for c in COMMANDS if c.startswith("microspec ") and not TEMPLATE.search(c)]


def test_the_docs_cite_commands():
    assert len(MICROSPEC) >= 20, MICROSPEC


@pytest.mark.parametrize("command", MICROSPEC)
def test_a_cited_microspec_command_parses(command):
    argv = shlex.split(command)[1:]
    if argv[0] in ("bench", "analyze") and "--out" not in argv:  # the docs leave the output folder out
        argv += ["--out", "/tmp/unused"]
    try:
        args = build_parser().parse_args(argv)
    except (SystemExit, MicrospecError) as exc:
        pytest.fail(f"{command}: {exc}")
    for name in ("data", "prompts", "texts"):
        given = getattr(args, name, None) or []
        for path in (given if isinstance(given, list) else str(given).split(",")):
            if path.startswith("benchmarks/"):
                assert (ROOT / path).exists(), f"{command}: {path} is not in the repository"


def test_every_cited_script_is_in_the_repository():
    scripts = {m.group(1) for c in COMMANDS for m in re.finditer(r"(?:^|\s)python3? (\S+\.py)", c)}
    assert scripts
    missing = sorted(s for s in scripts if not (ROOT / s).is_file())
    assert not missing, missing
