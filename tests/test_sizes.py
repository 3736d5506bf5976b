"""Sizes and shape of the code: no file over 500 lines and no function over 60 lines in ``ifnd``,
``benchmarks`` or ``tools``; no import circle among the modules of ``ifnd`` or of ``benchmarks``,
nor among their packages (a sub-package counts as a package of its own); and no private name of
one ``ifnd`` module used by another.

Files are parsed with ``ast``, not imported: imports inside functions count too and nothing runs.
"""
import ast
import importlib.util
from pathlib import Path

import pytest
import test_layers as layers  # the import graph's edges, read as the floors read them
from test_layers import module_name

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'ifnd'
FOLDERS = ('ifnd', 'benchmarks', 'tools')  # held to the size limits
PACKAGES = ('ifnd', 'benchmarks')  # held to no circles (tools/ holds scripts, not a package)
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60

# Over the limits today, to be split; nothing may join these lists.
LONG_FILES: set[str] = set()
LONG_FUNCTIONS: set[str] = set()
# Import circles today, to be untangled: the modules along each.
CIRCLES: set[frozenset] = set()
# Package circles today, to be untangled: the packages along each.
PACKAGE_CIRCLES: set[frozenset] = set()


def relative(path: Path) -> str:
    """``path`` relative to the repository, with forward slashes."""
    return path.relative_to(ROOT).as_posix()


def line_count(path: Path) -> int:
    """Lines of a file, as ``wc -l`` counts them."""
    return path.read_text(encoding='utf-8').count('\n')


def long_functions(path: Path) -> dict[str, int]:
    """``file::name`` -> lines, from ``def`` to the body's end, of each function over the limit."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found[f'{relative(path)}::{node.name}'] = lines
    return found


FILES = {package: sorted((ROOT / package).rglob('*.py')) for package in PACKAGES}
MODULES = {module_name(path) for paths in FILES.values() for path in paths}
# The packages: a module belongs to the one that holds it, a package's __init__ to the package.
PACKAGE_NAMES = {module_name(path) for paths in FILES.values() for path in paths
                 if path.name == '__init__.py'}


def imported_modules(path: Path) -> set[str]:
    """The modules of its own package a file imports, each named as the module that holds the
    imported name (``from ifnd.zoo import info`` imports ``ifnd.zoo``)."""
    found = set()
    for name, _ in layers.imported_modules(path):
        while name and name not in MODULES:
            name = name.rpartition('.')[0]
        found.add(name)
    return found - {'', module_name(path)}


def package_of(module: str) -> str:
    """The package that holds ``module`` (itself for a package)."""
    return module if module in PACKAGE_NAMES else module.rpartition('.')[0]


def module_graph(package: str) -> dict[str, list[str]]:
    """Each module of ``package`` -> the modules of ``package`` it imports."""
    return {module_name(path): sorted(imported_modules(path)) for path in FILES[package]}


def package_graph(package: str) -> dict[str, list[str]]:
    """Each package of ``package`` (sub-packages included) -> the others its modules import."""
    graph: dict[str, set[str]] = {}
    for module, targets in module_graph(package).items():
        own = package_of(module)
        graph.setdefault(own, set()).update(package_of(target) for target in targets)
    return {name: sorted(targets - {name}) for name, targets in graph.items()}


def circles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Each circle of an import graph, once, as the nodes along it."""
    found, done = [], set()
    state: dict[str, str] = {}  # 'open' while on the current path, 'closed' once explored

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 'open'
        trail.append(node)
        for target in graph[node]:
            if state.get(target) == 'open':
                circle = trail[trail.index(target):]
                key = frozenset(circle)
                if key not in done:
                    done.add(key)
                    found.append(circle + [target])
            elif target not in state:
                visit(target, trail)
        trail.pop()
        state[node] = 'closed'

    for node in graph:
        if node not in state:
            visit(node, [])
    return found


def import_circles(package: str = 'ifnd') -> list[list[str]]:
    """Each import circle among ``package``'s modules, once, as the modules along it."""
    return circles(module_graph(package))


def package_circles(package: str) -> list[list[str]]:
    """Each import circle among ``package``'s packages, once, as the packages along it."""
    return circles(package_graph(package))


def package_imports(source: str, target: str) -> list[str]:
    """``module:line`` of each import by a module of package ``source`` from package ``target``."""
    found = []
    for path in FILES[source.split('.')[0]]:
        if package_of(module_name(path)) != source:
            continue
        for name, line in layers.imported_modules(path):
            while name and name not in MODULES:
                name = name.rpartition('.')[0]
            if name and package_of(name) == target:
                found.append(f'{module_name(path)}:{line}')
    return found


@pytest.mark.parametrize('folder', FOLDERS)
def test_no_long_files(folder):
    """No file over the line limit, but those listed to be split."""
    long = {relative(path): line_count(path) for path in sorted((ROOT / folder).rglob('*.py'))
            if line_count(path) > MAX_FILE_LINES}
    new = {path: lines for path, lines in long.items() if path not in LONG_FILES}
    assert not new, f'split these files by idea (at most {MAX_FILE_LINES} lines): {new}'


@pytest.mark.parametrize('folder', FOLDERS)
def test_no_long_functions(folder):
    """No function over the line limit, but those listed to be split."""
    long = {}
    for path in sorted((ROOT / folder).rglob('*.py')):
        long.update(long_functions(path))
    new = {name: lines for name, lines in long.items() if name not in LONG_FUNCTIONS}
    assert not new, f'split these functions (at most {MAX_FUNCTION_LINES} lines): {new}'


def test_the_lists_of_exceptions_hold_only_offenders():
    """An entry split below the limits (or a circle untangled) leaves its list: the lists stay
    the work left."""
    files = {path for path in LONG_FILES if line_count(ROOT / path) > MAX_FILE_LINES}
    functions = set()
    for name in LONG_FUNCTIONS:
        functions.update(long_functions(ROOT / name.split('::')[0]))
    assert files == LONG_FILES, f'remove from LONG_FILES: {LONG_FILES - files}'
    assert LONG_FUNCTIONS <= functions, f'remove from LONG_FUNCTIONS: {LONG_FUNCTIONS - functions}'
    found = {frozenset(circle) for package in PACKAGES for circle in import_circles(package)}
    assert CIRCLES <= found, f'remove from CIRCLES: {CIRCLES - found}'
    found = {frozenset(circle) for package in PACKAGES for circle in package_circles(package)}
    assert PACKAGE_CIRCLES <= found, f'remove from PACKAGE_CIRCLES: {PACKAGE_CIRCLES - found}'


@pytest.mark.parametrize('package', PACKAGES)
def test_no_import_circles(package):
    """No module imports, directly or through others, a module that imports it."""
    found = [circle for circle in import_circles(package) if frozenset(circle) not in CIRCLES]
    assert not found, ('move what both sides share into a module below them:\n'
                       + '\n'.join(' -> '.join(circle) for circle in found))


@pytest.mark.parametrize('package', PACKAGES)
def test_no_package_circles(package):
    """No package imports, directly or through others, a package that imports it: a sub-package
    and the package above it are two packages (``benchmarks.fn_harness`` and ``benchmarks``)."""
    found = [circle for circle in package_circles(package)
             if frozenset(circle) not in PACKAGE_CIRCLES]
    steps = [f'{a} -> {b}: ' + ', '.join(package_imports(a, b))
             for circle in found for a, b in zip(circle, circle[1:])]
    assert not found, ('move what both sides share into a package below them:\n'
                       + '\n'.join(steps))


def private_imports(path: Path) -> list[str]:
    """``line: module.name`` for each private name (``_x``) of another ``ifnd`` module that a file
    imports (``from ifnd.x import _name``) or reads off an imported module (``x._name``)."""
    module = module_name(path)
    package = module if path.name == '__init__.py' else module.rpartition('.')[0]
    tree = ast.parse(path.read_text(encoding='utf-8'), filename=str(path))
    modules, found = {}, []  # local name -> the ifnd module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split('.')[0] == 'ifnd':
                    modules[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source = importlib.util.resolve_name('.' * node.level + (node.module or ''), package)
            if source.split('.')[0] != 'ifnd' or source == module:
                continue
            for alias in node.names:
                if f'{source}.{alias.name}' in MODULES:
                    modules[alias.asname or alias.name] = f'{source}.{alias.name}'
                elif alias.name.startswith('_') and not alias.name.startswith('__'):
                    found.append(f'{node.lineno}: {source}.{alias.name}')
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith('_')
                and not node.attr.startswith('__')):
            owner = ast.unparse(node.value)
            target = modules.get(owner, owner if owner in MODULES else None)
            if target is not None and target != module:
                found.append(f'{node.lineno}: {target}.{node.attr}')
    return found


def test_no_module_uses_another_modules_private_names():
    """What ``ifnd``'s modules share has a public name: a private name (``_x``) stays in its
    module."""
    found = {relative(path): names for path in sorted(PACKAGE.rglob('*.py'))
             if (names := private_imports(path))}
    assert not found, f'give these names a public spelling where they are defined: {found}'
