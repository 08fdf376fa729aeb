"""Training text in many natural and programming languages, disjoint from the held-out prompts.

    python benchmarks/data/broad_texts.py --data ../shared/data --out broad/
    microspec train eagle --texts broad/*.jsonl --text-tokens N ...

Writes one ``{"text": ...}`` JSONL file per source, for ``train eagle --texts`` (self-distillation: the target's
own predictions on the text are the labels, so the text needs no answers). Every source is disjoint from what
``benchmarks/data/language_prompts.py`` evaluates on (MGSM's questions, Genesis, and the source files it draws from):

- ``udhr.jsonl``: the Universal Declaration of Human Rights (NLTK udhr2, public domain) in the 44 languages of
  ``UDHR``;
- ``xquad.jsonl``: XQuAD's contexts in its twelve languages (CC BY-SA 4.0; a reading-comprehension set, not one
  of the project's evaluation sets; its questions are left out);
- ``oasst_fi.jsonl``: OASST1 messages translated to Finnish (Apache-2.0);
- ``python.jsonl``: Python's standard library *packages* (``/usr/lib/python3.X/<package>/``; the evaluation draws
  from the top-level modules only), tests left out;
- ``java.jsonl``: the JDK's class library outside ``java.util`` (which the evaluation draws from);
- ``c_cpp.jsonl``: the C library's headers (``/usr/include/*.h``) and libstdc++ outside ``bits/`` (the evaluation's);
- ``javascript.jsonl``: npm's dependencies (``npm/node_modules``; the evaluation draws from ``npm/lib``);
- ``go.jsonl``: Go's standard library below its top-level packages (``src/net/http``, ``src/encoding/json``, ...;
  the evaluation draws from the top-level ones, ``src/fmt``, ``src/strings``, ...), from Debian's ``golang-*-src``,
  tests and test data left out.

Disjointness is also enforced, not only planned: no file the evaluation's globs match (``language_prompts.CODE``)
is read here. A source file becomes one document: a passage of at most ``--max-chars`` characters from a line
picked at random. Files and passages are picked by a seeded shuffle, so the same command writes the same files on
the same machine. A source missing on this machine is left out with a line on stderr.
"""

from __future__ import annotations

import argparse
import glob
import json
import random
import sys
import zipfile
from pathlib import Path

# this folder's (a script: the folder is on sys.path)
from language_prompts import CODE, JAVA_PACKAGE, held_out_files, take_lines

UDHR = ("arb", "ben", "bul", "cat", "ces", "cmn_hans", "cmn_hant", "dan", "deu", "eng", "est", "fin", "fra",
        "heb", "hin", "hrv", "hun", "ind", "ita", "jpn", "kor", "lit", "lav", "nld", "nob", "pol", "por_BR",
        "por_PT", "ron", "rus", "slk", "slv", "spa", "srp_cyrl", "swe", "swh", "tam", "tha", "tur", "ukr", "urd",
        "vie", "yor", "zul")


def _passage(text: str, max_chars: int, rng: random.Random) -> str | None:
    """Up to ``max_chars`` characters of ``text`` from a line picked at random, cut at a line end."""
    lines = text.splitlines()
    if not lines:
        return None
    start = rng.randrange(max(1, len(lines) - 20))
    body = "\n".join(take_lines(lines[start:], max_chars)).strip("\n")
    return body if len(body) >= 200 else None


def _files(patterns: list[str], exclude: tuple[str, ...]) -> list[str]:
    held_out = {f for pattern, where in CODE.values() if where is None for f in held_out_files(pattern)}
    return sorted({f for p in patterns for f in glob.glob(p, recursive=True)
                   if Path(f).is_file() and not any(x in f for x in exclude) and f not in held_out})


def code_docs(files: list[str], rng: random.Random, max_chars: int, limit: int) -> list[str]:
    rng.shuffle(files)
    docs = []
    for f in files[:limit]:
        try:
            body = _passage(Path(f).read_text(encoding="utf-8"), max_chars, rng)
        except (OSError, UnicodeDecodeError):
            continue
        if body:
            docs.append(body)
    return docs


def java_docs(rng: random.Random, max_chars: int, limit: int) -> list[str]:
    zips = sorted(z for z in glob.glob("/usr/lib/jvm/*/lib/src.zip") if Path(z).is_file())
    if not zips:
        return []
    with zipfile.ZipFile(zips[0]) as z:  # the evaluation's own zip: the same library, other packages
        names = sorted(n for n in z.namelist() if n.endswith(".java") and JAVA_PACKAGE not in n)
        rng.shuffle(names)
        docs = []
        for n in names[:limit]:
            body = _passage(z.read(n).decode("utf-8", "replace"), max_chars, rng)
            if body:
                docs.append(body)
    return docs


def udhr_docs(data: Path, languages: tuple[str, ...], chunk_chars: int) -> list[str]:
    path = data / "multilingual" / "nltk_udhr2.zip"
    if not path.is_file():
        return []
    docs = []
    with zipfile.ZipFile(path) as z:
        for lang in languages:
            member = f"udhr2/{lang}.txt"
            if member not in z.namelist():
                print(f"broad_texts: no UDHR text for {lang}", file=sys.stderr)
                continue
            text = z.read(member).decode("utf-8", "replace")
            chunk: list[str] = []
            size = 0
            for para in (p.strip() for p in text.split("\n") if p.strip()):
                chunk.append(para)
                size += len(para) + 1
                if size >= chunk_chars:
                    docs.append("\n".join(chunk))
                    chunk, size = [], 0
            if chunk:
                docs.append("\n".join(chunk))
    return docs


def xquad_docs(data: Path) -> list[str]:
    docs = []
    for path in sorted((data / "multilingual" / "xquad").glob("xquad.*.json")):
        seen = set()
        for article in json.loads(path.read_text(encoding="utf-8"))["data"]:
            for para in article["paragraphs"]:
                if para["context"] not in seen:
                    seen.add(para["context"])
                    docs.append(para["context"])
    return docs


def oasst_fi_docs(data: Path) -> list[str]:
    import gzip

    path = data / "multilingual" / "oasst1_fi" / "fi-validation-messages.jsonl.gz"
    if not path.is_file():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [r["text"] for r in map(json.loads, f) if r.get("text", "").strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--out", required=True, help="a directory")
    ap.add_argument("--max-chars", type=int, default=3000, help="longest passage of a source file")
    ap.add_argument("--files", type=int, default=400, help="source files per programming language")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    data, out = Path(args.data), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    py = sorted(glob.glob("/usr/lib/python3.*/"))
    sources = {
        "udhr": udhr_docs(data, UDHR, args.max_chars),
        "xquad": xquad_docs(data),
        "oasst_fi": oasst_fi_docs(data),
        "python": code_docs(_files([f"{py[-1]}*/**/*.py"] if py else [], ("/test", "site-packages", "dist-packages",
                                                                          "idle_test", "config-3")),
                            rng, args.max_chars, args.files),
        "java": java_docs(rng, args.max_chars, args.files),
        "c_cpp": code_docs(_files(["/usr/include/*.h", "/usr/include/c++/*/**/*"], ("/bits/",)), rng,
                           args.max_chars, args.files),
        "javascript": code_docs(_files(["/usr/lib/node_modules/npm/node_modules/**/*.js"], ("/test",)), rng,
                                args.max_chars, args.files),
        "go": code_docs(_files(["/usr/share/go-*/src/*/*/**/*.go"], ("_test.go", "/testdata/")), rng, args.max_chars,
                        args.files),
    }
    for name, docs in sources.items():
        if not docs:
            print(f"broad_texts: {name}: no source on this machine, left out", file=sys.stderr)
            continue
        with (out / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
        print(f"{name}: {len(docs)} documents, {sum(map(len, docs)):,} characters", file=sys.stderr)


if __name__ == "__main__":
    main()
