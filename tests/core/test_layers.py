"""The package's layers only point down: checked on the source, so a new import that breaks them fails here."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import step_persistence

PACKAGE = 'step_persistence'
ROOT = Path(step_persistence.__file__).parent
STORE_PACKAGES = ('step_persistence.stores.sql', 'step_persistence.stores.mongo', 'step_persistence.stores.file')


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


MODULES: dict[str, Path] = {_module_name(path): path for path in ROOT.rglob('*.py')}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == 'TYPE_CHECKING') or (
        isinstance(test, ast.Attribute) and test.attr == 'TYPE_CHECKING'
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that runs (at module level or in a function), not those under `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking_only(node):
            yield from (each for child in node.orelse for each in _imports(child))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node)


def _imported_modules(name: str) -> set[str]:
    """The modules of this package that module `name` imports."""
    path = MODULES[name]
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    found: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in MODULES)
            continue
        base = node.module or ''
        if node.level:
            base = '.'.join([*package.split('.')[: len(package.split('.')) - node.level + 1], *filter(None, [base])])
        for alias in node.names:
            candidate = f'{base}.{alias.name}'
            if candidate in MODULES:
                found.add(candidate)
            elif base in MODULES:
                found.add(base)
    return {module for module in found if module.startswith(PACKAGE) and module != name}


GRAPH = {name: _imported_modules(name) for name in MODULES}


def test_media_never_imports_the_stores() -> None:
    offenders = {
        name: sorted(target for target in targets if target.startswith(f'{PACKAGE}.stores'))
        for name, targets in GRAPH.items()
        if name.startswith(f'{PACKAGE}.media.') and name != f'{PACKAGE}.media'
    }
    assert {name: targets for name, targets in offenders.items() if targets} == {}


def test_no_module_imports_the_private_modules_of_another_store_package() -> None:
    offenders = sorted(
        (name, target)
        for name, targets in GRAPH.items()
        for target in targets
        for store in STORE_PACKAGES
        if target.startswith(f'{store}._') and not name.startswith(f'{store}.') and name != store
    )
    assert offenders == []


def _cycle_from(start: str) -> list[str] | None:
    path: list[str] = []
    on_path: set[str] = set()

    def visit(name: str) -> list[str] | None:
        if name in on_path:
            return [*path[path.index(name) :], name]
        if name in done:
            return None
        path.append(name)
        on_path.add(name)
        for target in sorted(GRAPH[name]):
            cycle = visit(target)
            if cycle is not None:
                return cycle
        on_path.discard(path.pop())
        done.add(name)
        return None

    return visit(start)


done: set[str] = set()


def test_the_import_graph_has_no_cycles() -> None:
    done.clear()
    cycles = [cycle for name in sorted(GRAPH) if (cycle := _cycle_from(name)) is not None]
    assert cycles == []


def test_the_graph_sees_imports_inside_functions() -> None:
    """The check above would pass vacuously if it missed lazy imports: a known one must be in the graph."""
    assert f'{PACKAGE}.stores.memory' in GRAPH[f'{PACKAGE}.spec']


ARCHITECTURE = ROOT.parents[1] / 'docs' / 'architecture.md'
MAP_ROW = re.compile(r'^\| `(?P<path>[^`]+\.py)` \| (?P<layer>\d) \|', re.MULTILINE)
BACKENDS = {
    f'{PACKAGE}.stores.sql': 'sql',
    f'{PACKAGE}.migrations': 'sql',
    f'{PACKAGE}.stores.mongo': 'mongo',
    f'{PACKAGE}.stores.file': 'file',
    f'{PACKAGE}.stores.memory': 'memory',
}


def _documented_layers() -> dict[str, int]:
    layers: dict[str, int] = {}
    for row in MAP_ROW.finditer(ARCHITECTURE.read_text()):
        layers[_module_name(ROOT / row['path'])] = int(row['layer'])
    return layers


LAYERS = _documented_layers()


def _backend(name: str) -> str | None:
    return next(
        (backend for prefix, backend in BACKENDS.items() if name == prefix or name.startswith(f'{prefix}.')), None
    )


def test_the_module_map_lists_every_module_and_nothing_else() -> None:
    assert sorted(set(MODULES) - set(LAYERS)) == [], 'modules missing from docs/architecture.md'
    assert sorted(set(LAYERS) - set(MODULES)) == [], 'docs/architecture.md lists modules that do not exist'


def test_every_import_points_to_the_same_layer_or_below() -> None:
    upward = sorted(
        (name, LAYERS[name], target, LAYERS[target])
        for name, targets in GRAPH.items()
        for target in targets
        if name in LAYERS and target in LAYERS and LAYERS[target] > LAYERS[name]
    )
    assert upward == []


def test_no_backend_imports_another() -> None:
    crossing = sorted(
        (name, target)
        for name, targets in GRAPH.items()
        for target in targets
        if _backend(name) is not None and _backend(target) not in (None, _backend(name))
    )
    assert crossing == []
