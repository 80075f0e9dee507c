"""The package's shape: dependencies point one way, no hidden imports, every module on the map.

models -> core -> spec -> sim -> serve / train / course -> cli (A -> B: B may import A, never the
reverse), and no import cycles. The contracts live in pyproject.toml under [tool.importlinter];
`lint-imports` from the repository root checks them by hand, this file checks them with the suite.
"""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from importlinter.api import read_configuration

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minispec"
PYPROJECT = ROOT / "pyproject.toml"
ARCHITECTURE_DOC = ROOT / "docs" / "architecture.md"

CONTRACTS = read_configuration(str(PYPROJECT))["contracts_options"]
# the `lint-imports` console script, started through this interpreter wherever its bin/ is
LINT_IMPORTS = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def _package_files():
    """Every .py file under minispec/, as paths relative to the repository root, sorted."""
    return sorted(p.relative_to(ROOT) for p in PACKAGE.rglob("*.py")
                  if "__pycache__" not in p.parts)


def test_every_contract_has_an_id():
    # each contract runs on its own below, so that one broken or unrunnable contract (a layer
    # that does not exist stops the whole run) does not hide the others' reports
    missing = [c["name"] for c in CONTRACTS if "id" not in c]
    assert not missing, f"give these [tool.importlinter] contracts an `id`: {missing}"


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.get("id", c["name"]))
def test_import_contract(contract):
    result = subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, str(PYPROJECT), "--contract", contract.get("id", ""),
         "--no-cache", "--no-logo"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "120"},
    )
    assert result.returncode == 0, (
        f"import contract broken: {contract['name']}\n{result.stdout}{result.stderr}")


def test_every_package_directory_is_a_regular_package():
    # import-linter (grimp) does not look inside a folder without __init__.py: its modules would
    # escape every contract
    folders = sorted({p.parent for p in _package_files()})
    missing = [str(f / "__init__.py") for f in folders if not (ROOT / f / "__init__.py").exists()]
    assert not missing, "missing __init__.py:\n" + "\n".join(missing)


def _imports_minispec(node):
    if isinstance(node, ast.Import):
        return any(a.name == "minispec" or a.name.startswith("minispec.") for a in node.names)
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        return node.level > 0 or module == "minispec" or module.startswith("minispec.")
    return False


def _imports_inside_functions(tree):
    """Yield the minispec import statements that sit inside a function or method body."""
    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if in_function and _imports_minispec(child):
                yield child
            yield from visit(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef)))
    yield from visit(tree, False)


def test_no_minispec_import_inside_a_function():
    # an import hidden in a function body to dodge a cycle means a type lives in the wrong file;
    # lazy imports of third-party packages (torch, matplotlib, ...) are fine
    offenders = []
    for path in _package_files():
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"), filename=str(path))
        offenders += [f"{path}:{node.lineno}: {ast.unparse(node)}"
                      for node in _imports_inside_functions(tree)]
    assert not offenders, (
        "move these imports to the top of their module (and fix the cycle they dodge):\n"
        + "\n".join(offenders))


def _module_map(text):
    """The text of the doc's module map: from its heading to the next heading of the same level."""
    match = re.search(r"^(#+)\s+module map\b.*$", text, flags=re.IGNORECASE | re.MULTILINE)
    if match is None:
        return ""
    level = len(match.group(1))
    rest = text[match.end():]
    end = re.search(rf"^#{{1,{level}}}\s", rest, flags=re.MULTILINE)
    return rest[:end.start()] if end else rest


def _named_in_doc(text):
    """The module files the doc names, as 'minispec/.../name.py' strings.

    Anywhere in the doc, a path (`minispec/spec/verify.py`) or a dotted name
    (`minispec.spec.verify`) names a file. Inside the module map a bare file name (`verify.py`) is
    read in the folder of the last path before it (`minispec/train/distill.py`, `eagle.py` or a
    `minispec/spec/` heading), or in minispec/ when no path came before it.
    """
    named = set(re.findall(r"minispec(?:/\w+)+\.py", text))
    named |= {d.replace(".", "/") + ".py" for d in re.findall(r"minispec(?:\.\w+)+", text)}
    folder = "minispec/"
    for token in re.findall(r"minispec(?:/\w+)*/(?:\w+\.py)?|\b\w+\.py\b", _module_map(text)):
        if token.startswith("minispec/"):
            folder = token.rsplit("/", 1)[0] + "/"
        else:
            named.add(folder + token)
    return named


def test_every_module_is_on_the_architecture_map():
    named = _named_in_doc(ARCHITECTURE_DOC.read_text(encoding="utf-8"))
    modules = [p.as_posix() for p in _package_files()
               if p.name not in ("__init__.py", "__main__.py")]
    missing = [m for m in modules if m not in named]
    assert not missing, (
        f"{ARCHITECTURE_DOC.relative_to(ROOT)} does not name these modules (add them to the "
        "module map):\n" + "\n".join(missing))
