"""The family seam holds: no module outside ``bytelm/families/`` names a family. Families are reached
through the registry (:mod:`bytelm.families`) and the members of :class:`~bytelm.families.Task`
alone, so adding one never means editing the trainer, the evaluator, the experiments, the
interop or the command line.

"Names a family" here, read from the source of every module outside the families' folders:
- imports from a family's own folder (``bytelm.families.<name>``, its classes, configs, models);
- compares something called ``family`` with a family's name (``cfg.model.family == "blt"``), or
  asks the registry for a family by a literal name (``task_class("hnet")``).
"""

import ast
import pathlib

import bytelm
from bytelm.families import names

ROOT = pathlib.Path(bytelm.__file__).parent
SEAM = {"bytelm.families", "bytelm.families.base", "bytelm.families.registry"}  # the public seam


def _is_family_expr(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "family") or (
        isinstance(node, ast.Attribute) and node.attr == "family"
    )


def _literals(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def family_mentions(source: str, families: set[str]) -> list[str]:
    """Each place in ``source`` that names one of ``families`` (see the module docstring)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        modules = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        own = [
            m
            for m in modules
            if m.split(".")[:2] == ["bytelm", "families"]
            and len(m.split(".")) > 2
            and m not in SEAM
            and (m.split(".")[2] in families or (ROOT / "families" / m.split(".")[2]).is_dir())
        ]
        if own:
            found.append(f"line {node.lineno}: imports {own[0]}")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_family_expr(s) for s in sides):
                named = [v for s in sides for v in _literals(s) if v in families]
                found += [f"line {node.lineno}: compares a family with {v!r}" for v in named]
        if isinstance(node, ast.Call):
            fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if fn in ("task_class", "config_class"):
                named = [v for a in node.args for v in _literals(a) if v in families]
                found += [f"line {node.lineno}: looks up the family {v!r}" for v in named]
    return found


def test_no_module_outside_the_families_names_a_family():
    families = set(names())
    assert {"byte", "bpe", "megabyte", "blt", "hnet"} <= families
    offenders = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "families":
            continue  # the families' folders and the registration of the built-in ones
        if found := family_mentions(path.read_text(), families):
            offenders[str(rel)] = found
    assert offenders == {}


def test_the_checker_finds_each_kind_of_mention():
    families = {"blt", "hnet", "byte"}
    bad = """
from bytelm.families.blt.source import read_patch_source
import bytelm.families.hnet.model
from bytelm.families import blt
if cfg.model.family == "byte": pass
if family in ("hnet", "x"): pass
task_class("blt")
"""
    found = family_mentions(bad, families)
    assert [f.split(":")[0] for f in found] == [
        "line 2",
        "line 3",
        "line 4",
        "line 5",
        "line 6",
        "line 7",
    ], found
    fine = """
from bytelm.families import task_class, Task
from bytelm.families.registry import names
kind = "byte"  # a tokenizer's level, not a family
if args.level == "byte": pass
task_class(cfg.model.family)
"""
    assert family_mentions(fine, families) == []
