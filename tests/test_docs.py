"""The documentation says what the software does: generated references match their sources."""

from __future__ import annotations

import re

from support import ROOT, load_script


def test_cli_reference_matches_parsers():
    """docs/cli.md is what docs/render_cli.py renders from the argument parsers now (no model is loaded)."""
    render_cli = load_script(ROOT / "docs" / "render_cli.py")
    committed = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert render_cli.render() == committed, (
        "docs/cli.md differs from the command-line parsers: run `python3 docs/render_cli.py` and commit the result")


def test_openai_reference_matches_the_servers_fields():
    """docs/openai.md is what docs/render_openai.py renders from the server's table of fields, and every field in
    that table is read by the request parser (named there beside the table)."""
    render = load_script(ROOT / "docs" / "render_openai.py")
    assert render.render() == (ROOT / "docs" / "openai.md").read_text(encoding="utf-8"), (
        "docs/openai.md differs from the server's fields: run `python3 docs/render_openai.py` and commit the result")
    from microspec.serve.protocol import FIELDS

    source = "".join((ROOT / "src" / "microspec" / "serve" / f).read_text(encoding="utf-8")
                     for f in ("protocol.py", "tools.py"))
    unread = [name for name in FIELDS if source.count(f'"{name}"') < 2 and f"'{name}'" not in source]
    assert not unread, f"in FIELDS but never read: {unread}"


def test_benchmarks_md_matches_results():
    """BENCHMARKS.md, docs/history.md and the README's results table are what benchmarks/render_docs.py renders from
    the results JSON in benchmarks/results/ (no number in them is typed by hand)."""
    render_docs = load_script(ROOT / "benchmarks" / "render_docs.py")
    assert render_docs.render() == (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"), (
        "BENCHMARKS.md differs from benchmarks/results/: run `python3 benchmarks/render_docs.py` and commit the result")
    assert render_docs.render_history() == (ROOT / "docs" / "history.md").read_text(encoding="utf-8"), (
        "docs/history.md differs from benchmarks/results/: run `python3 benchmarks/render_docs.py` and commit it")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert render_docs.with_readme_results(readme) == readme, (
        "README.md's results table differs from benchmarks/results/: run `python3 benchmarks/render_docs.py`")


def test_benchmarks_md_is_short_and_its_links_to_the_history_land():
    """BENCHMARKS.md holds each question's current answer in at most 600 lines; the before/after measurements are in
    docs/history.md, and every link between the two names a heading that is there."""
    render_docs = load_script(ROOT / "benchmarks" / "render_docs.py")
    bench = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    history = (ROOT / "docs" / "history.md").read_text(encoding="utf-8")
    assert len(bench.splitlines()) <= 600, f"BENCHMARKS.md has {len(bench.splitlines())} lines"

    def anchors(text):
        return {render_docs.anchor(line.lstrip("#").strip()) for line in text.splitlines() if line.startswith("#")}

    links = [(a, history) for a in re.findall(r"\(docs/history\.md#([\w-]+)\)", bench)]
    links += [(a, bench) for a in re.findall(r"\(\.\./BENCHMARKS\.md#([\w-]+)\)", history)]
    links += [(a, text) for text in (bench, history) for a in re.findall(r"\]\(#([\w-]+)\)", text)]
    assert links and all(a in anchors(text) for a, text in links), [a for a, text in links if a not in anchors(text)]


def test_pictures_the_docs_show_exist():
    """Every picture BENCHMARKS.md or the README shows is in docs/figures/, and every figure the renderer draws is
    shown somewhere."""
    render_docs = load_script(ROOT / "benchmarks" / "render_docs.py")
    text = "".join((ROOT / f).read_text(encoding="utf-8") for f in ("README.md", "BENCHMARKS.md"))
    shown = set(re.findall(r"\(docs/figures/([\w.-]+)\.svg\)", text))
    drawn = {name for s in render_docs.SECTIONS for name in getattr(s, "FIGURES", {})}
    assert shown, "no pictures shown"
    assert shown <= {p.stem for p in (ROOT / "docs" / "figures").glob("*.svg")}, "a picture shown is missing"
    assert drawn == shown, f"drawn but not shown: {drawn - shown}; shown but not drawn: {shown - drawn}"


def test_readme_is_short_and_its_status_cells_are_one_line():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 260
    status = readme.split("## Status", 1)[1]
    cells = [c.strip() for line in status.splitlines() if line.startswith("| ") for c in line.strip("|").split(" | ")]
    assert cells and max(len(c) for c in cells) <= 120, max(cells, key=len)


ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|this|last|previous")
ORGANISATION = re.compile(rf"\b[Ii]ssues? \d+\b|\b(?:{ORDINALS}) sessions?\b|\bnext time\b")


def test_docs_and_comments_speak_of_the_software():
    """Markdown and source comments describe the software and its results, not how the work was organised."""
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").glob("*.md"),
             ROOT / "benchmarks" / "README.md", *(ROOT / "src").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in files for m in ORGANISATION.finditer(p.read_text())]
    assert not found, found
