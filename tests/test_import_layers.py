"""Dependencies point one way: nothing below dpcore/mechanisms imports a mechanism (each mechanism owns
its noise model), dpcore imports no tasks or flows, and imports (function-local ones too) form no circle."""

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
#: dpcore packages below the mechanisms: they may be imported by mechanisms, never the other way.
BELOW_MECHANISMS = ("data", "geo.py", "grid", "privacy", "synopsis", "queries", "heatmap", "sparse1d", "models")


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path, module_level_only: bool) -> set[str]:
    """Modules a file imports (TYPE_CHECKING blocks skipped: annotations only, no runtime edge)."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]

    def visit(node: ast.AST, top: bool) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child, top)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            inner_top = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if inner_top or not module_level_only:
                visit(child, inner_top)

    visit(tree, True)
    return out


def _files(*tops: str) -> list[Path]:
    out = []
    for top in tops:
        p = ROOT / top
        out.extend([p] if p.suffix == ".py" else sorted(p.rglob("*.py")))
    return out


def test_nothing_below_the_mechanisms_imports_one():
    upward = {}
    for f in _files(*(f"dpcore/{p}" for p in BELOW_MECHANISMS)):
        bad = sorted(m for m in _imports(f, module_level_only=False) if m.startswith("dpcore.mechanisms"))
        if bad:
            upward[str(f.relative_to(ROOT))] = bad
    assert upward == {}


def test_dpcore_imports_no_tasks_or_flows():
    bad = {str(f.relative_to(ROOT)): sorted(m for m in _imports(f, False) if m.split(".")[0] in ("tasks", "flows"))
           for f in _files("dpcore")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_imports_form_no_circle():
    """Issue 46: circles hid behind function-local imports (mechanisms/contract ↔ inputs, ag ↔ ag_levels,
    storage/ledger ↔ ledger_home), which a module-level check does not see; every import counts."""
    files = _files("dpcore", "tasks", "flows", "geodp")
    known = {_module(f) for f in files}
    graph = nx.DiGraph()
    for f in files:
        src = _module(f)
        graph.add_node(src)
        for m in _imports(f, module_level_only=False):
            if m in known and m != src and not src.startswith(m + "."):  # a package's own __init__ is no edge
                graph.add_edge(src, m)
    circles = sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)
    assert circles == []


def test_the_check_sees_an_upward_import(tmp_path):
    """The checker itself: a lazy import inside a function is found; one under TYPE_CHECKING is not."""
    f = ROOT / "dpcore" / "synopsis" / "_probe_for_test.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dpcore.mechanisms.base import M\n"
                 "def g():\n    from dpcore.mechanisms import get_mechanism\n")
    try:
        found = _imports(f, module_level_only=False)
        assert "dpcore.mechanisms" in found and "dpcore.mechanisms.base" not in found
        assert _imports(f, module_level_only=True) == {"typing", "typing.TYPE_CHECKING"}
    finally:
        f.unlink()


def test_the_read_api_imports_nothing_from_the_cli():
    """Issue 46: geodp/api.py took its window parser from flows.cli.common (a Release.query(period=…)
    loaded typer and the CLI); the read API parses windows with tasks.config.parse_window."""
    bad = {str(f.relative_to(ROOT)): sorted(m for m in _imports(f, False) if m.startswith("flows.cli"))
           for f in _files("geodp")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_one_window_parser():
    """Issue 46: four places read time windows (the CLI, the read API, a dataset's horizon in the settings
    and in `geodp dataset create`), each its own way. Only tasks/config.py takes an A..B text apart;
    everything else calls parse_period, parse_window or period_days there."""
    splitters = {}
    for f in _files("dpcore", "tasks", "flows", "geodp"):
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("split", "rsplit", "partition") and node.args
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value == ".."):
                splitters.setdefault(str(f.relative_to(ROOT)), []).append(node.lineno)
    assert set(splitters) == {"tasks/config.py"}, splitters
