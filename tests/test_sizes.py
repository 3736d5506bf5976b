"""Sizes and shape of the code: no module of ``ifnd`` over 500 lines, no function over 60 lines in
``ifnd``, ``benchmarks`` or ``tools``, no import circle among ``ifnd``'s modules, and no private
name of one ``ifnd`` module used by another.

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
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60

# Over the limits today, to be split; nothing may join these lists.
LONG_FILES: set[str] = set()
LONG_FUNCTIONS: set[str] = set()
# Import circles today, to be untangled: the modules along each.
CIRCLES: set[frozenset] = set()


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


MODULES = {module_name(path) for path in PACKAGE.rglob('*.py')}


def imported_modules(path: Path) -> set[str]:
    """The ``ifnd`` modules a file imports, each named as the module that holds the imported name
    (``from ifnd.zoo import info`` imports ``ifnd.zoo``)."""
    found = set()
    for name, _ in layers.imported_modules(path):
        while name and name not in MODULES:
            name = name.rpartition('.')[0]
        found.add(name)
    return found - {'', module_name(path)}


def import_circles() -> list[list[str]]:
    """Each import circle among ``ifnd``'s modules, once, as the modules along it."""
    graph = {module_name(path): sorted(imported_modules(path)) for path in PACKAGE.rglob('*.py')}
    circles, done = [], set()
    state: dict[str, str] = {}  # 'open' while on the current path, 'closed' once explored

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 'open'
        trail.append(module)
        for target in graph[module]:
            if state.get(target) == 'open':
                circle = trail[trail.index(target):]
                key = frozenset(circle)
                if key not in done:
                    done.add(key)
                    circles.append(circle + [target])
            elif target not in state:
                visit(target, trail)
        trail.pop()
        state[module] = 'closed'

    for module in graph:
        if module not in state:
            visit(module, [])
    return circles


def test_no_long_files():
    """No module of ``ifnd`` over the line limit, but those listed to be split."""
    long = {relative(path): line_count(path) for path in PACKAGE.rglob('*.py')
            if line_count(path) > MAX_FILE_LINES}
    new = {path: lines for path, lines in long.items() if path not in LONG_FILES}
    assert not new, f'split these modules by idea (at most {MAX_FILE_LINES} lines): {new}'


@pytest.mark.parametrize('folder', ['ifnd', 'benchmarks', 'tools'])
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
    circles = {frozenset(circle) for circle in import_circles()}
    assert CIRCLES <= circles, f'remove from CIRCLES: {CIRCLES - circles}'


def test_no_import_circles():
    """No module of ``ifnd`` imports, directly or through others, a module that imports it."""
    circles = [circle for circle in import_circles() if frozenset(circle) not in CIRCLES]
    assert not circles, ('move what both sides share into a module below them:\n'
                         + '\n'.join(' -> '.join(circle) for circle in circles))


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
