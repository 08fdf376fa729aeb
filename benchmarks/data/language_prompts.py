"""Held-out prompts by natural and programming language, for tau per language.

    python benchmarks/data/language_prompts.py --data ../shared/data --out lang.jsonl --per-language 3
    python benchmarks/measure/eagle_tau.py --data lang.jsonl --per-category 3 --trees eagle2,cpu ...

Every source is disjoint from what the shipped heads were trained on (the training.json files beside them:
OASST1-en, the plain-text demos, XQuAD-de, OASST code answers, the prompt pool):

- natural languages: MGSM's questions (de, es, fr, ja, ru, zh, th, sw; an evaluation set, never trained on), each
  followed by a line "Answer:" in no language in particular; Genesis in Finnish, Portuguese and Swedish (NLTK);
- programming languages: source files this machine holds — Python's standard library, Java's class library
  (``java.util`` from the JDK's ``lib/src.zip``), C++'s standard library headers (libstdc++), JavaScript (npm's
  own sources), Go's standard library's top-level packages (Debian's ``golang-*-src``; tests left out) — each
  prompt a passage of a file from an unindented line picked at random after its licence comment, cut at a line
  end.

Files and passages are picked by a seeded shuffle, so the same command writes the same prompts on the same
machine. A language whose source is missing here is left out, with a line on stderr. Records: ``question_id``,
``category`` (the language), ``source`` (where the prompt came from), ``prompt``.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import random
import sys
import zipfile
from pathlib import Path

MGSM = ("de", "es", "fr", "ja", "ru", "zh", "th", "sw")
GENESIS = {"fi": ("genesis/finnish.txt", "latin-1"), "pt": ("genesis/portuguese.txt", "utf-8"),
           "sv": ("genesis/swedish.txt", "cp865")}  # the files' own encodings (NLTK's genesis reader's)
CODE = {  # language: (glob or zip member suffix, where)
    "python": ("/usr/lib/python3*/*.py", None),
    "java": (".java", "/usr/lib/jvm/*/lib/src.zip"),
    "cpp": ("/usr/include/c++/*/bits/*.h", None),
    "javascript": ("/usr/lib/node_modules/npm/lib/**/*.js", None),
    "go": ("/usr/share/go-*/src/*/*.go", None),  # Debian's golang-*-src: the top-level packages (fmt, strings, ...)
}
JAVA_PACKAGE = "/java/util/"  # the package of the JDK's src.zip that Java's prompts come from
COMMENT = ("#", "//", "/*", "*", "'use strict'", '"use strict"', "#!/")


def held_out_files(pattern: str) -> list[str]:
    """The source files a glob of ``CODE`` draws prompts from (Go's tests left out)."""
    return sorted(f for f in glob.glob(pattern, recursive=True) if not f.endswith("_test.go"))


def take_lines(lines: list[str], max_chars: int) -> list[str]:
    """The leading ``lines`` that fit in ``max_chars`` characters, newlines counted."""
    out, n = [], 0
    for line in lines:
        if n + len(line) + 1 > max_chars:
            break
        out.append(line)
        n += len(line) + 1
    return out


def _passage(text: str, max_chars: int, rng: random.Random) -> str | None:
    """A passage of a source file: from a line picked at random after the file's leading comment block (licence,
    module docstring), starting at a line with no indentation, cut at a line end near ``max_chars`` (None: too
    short a file)."""
    lines = text.splitlines()
    i = 0
    while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith(COMMENT) or
                              lines[i].strip().startswith('"""')):
        if lines[i].strip().startswith('"""'):  # a Python module docstring: skip to its end
            j = i + 1 if lines[i].strip().count('"""') == 1 else i
            while j < len(lines) and '"""' not in lines[j]:
                j += 1
            i = j
        i += 1
    starts = [j for j in range(i, max(i + 1, len(lines) - 30)) if j < len(lines) and lines[j].strip() and
              not lines[j][0].isspace() and not lines[j].lstrip().startswith(COMMENT)]
    if not starts:
        return None
    body = "\n".join(take_lines(lines[rng.choice(starts):], max_chars)).rstrip()
    return body + "\n" if len(body) >= max_chars // 3 else None


def code_prompts(lang: str, k: int, rng: random.Random, max_chars: int) -> list[tuple[str, str]]:
    pattern, where = CODE[lang]
    texts: list[tuple[str, str]] = []
    if where is None:
        files = held_out_files(pattern)
        rng.shuffle(files)
        for f in files:
            try:
                body = _passage(Path(f).read_text(encoding="utf-8"), max_chars, rng)
            except (OSError, UnicodeDecodeError):
                continue
            if body:
                texts.append((f, body))
            if len(texts) == k:
                break
        return texts
    zips = sorted(z for z in glob.glob(where) if Path(z).is_file())
    if not zips:
        return []
    with zipfile.ZipFile(zips[0]) as z:
        names = sorted(n for n in z.namelist() if n.endswith(pattern) and JAVA_PACKAGE in n)
        rng.shuffle(names)
        for n in names:
            body = _passage(z.read(n).decode("utf-8", "replace"), max_chars, rng)
            if body:
                texts.append((f"{zips[0]}:{n}", body))
            if len(texts) == k:
                break
    return texts


def mgsm_prompts(data: Path, lang: str, k: int, rng: random.Random) -> list[tuple[str, str]]:
    path = data / "multilingual" / "mgsm" / f"mgsm_{lang}.tsv"
    if not path.is_file():
        return []
    with path.open(encoding="utf-8", newline="") as f:
        rows = [r for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if r and r[0].strip()]
    picks = rng.sample(range(len(rows)), min(k, len(rows)))
    return [(f"{path}:{i + 1}", rows[i][0].strip() + "\nAnswer:") for i in picks]


def genesis_prompts(data: Path, member: tuple[str, str], k: int, rng: random.Random, max_chars: int) -> list[tuple[str, str]]:
    path = data / "multilingual" / "nltk_genesis.zip"
    if not path.is_file():
        return []
    with zipfile.ZipFile(path) as z:
        if member[0] not in z.namelist():
            return []
        lines = [ln for ln in z.read(member[0]).decode(member[1]).splitlines() if ln.strip()]
    out = []
    for start in sorted(rng.sample(range(max(0, len(lines) - 40)), min(k, max(0, len(lines) - 40)))):
        chunk = take_lines(lines[start:], max_chars)
        if chunk:
            out.append((f"{path}:{member[0]}:{start + 1}", "\n".join(chunk) + "\n"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-language", type=int, default=3)
    ap.add_argument("--max-chars", type=int, default=900, help="length of a passage or file opening")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.per_language < 1 or a.max_chars < 60:
        raise SystemExit("language_prompts: --per-language must be >= 1 and --max-chars >= 60")
    data = Path(a.data)
    records = []
    sources: list[tuple[str, list[tuple[str, str]]]] = []
    for lang in MGSM:
        sources.append((lang, mgsm_prompts(data, lang, a.per_language, random.Random(f"{a.seed}:{lang}"))))
    for lang, member in GENESIS.items():
        sources.append((lang, genesis_prompts(data, member, a.per_language, random.Random(f"{a.seed}:{lang}"),
                                              a.max_chars)))
    for lang in CODE:
        sources.append((lang, code_prompts(lang, a.per_language, random.Random(f"{a.seed}:{lang}"), a.max_chars)))
    for lang, prompts in sources:
        if not prompts:
            print(f"[language_prompts] {lang}: no source on this machine (or no usable passage), left out",
                  file=sys.stderr)
        for i, (src, text) in enumerate(prompts):
            records.append({"question_id": f"{lang}-{i}", "category": lang, "source": src, "prompt": text})
    with open(a.out, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    langs = sorted({r["category"] for r in records})
    print(f"[language_prompts] {len(records)} prompts in {len(langs)} languages ({', '.join(langs)}) -> {a.out}")


if __name__ == "__main__":
    main()
