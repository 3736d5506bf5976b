"""The package's floors: every import inside ``ifnd`` points down (or stays on its own package).

Modules are parsed with ``ast``, not imported, so imports inside functions count too and nothing
runs. tools/, benchmarks/, tests/ and hubconf.py stand above the package and may import anything.
"""
import ast
import os.path as osp
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / 'ifnd'

# Lowest first. A package may import its own modules and those of the floors below it; packages
# sharing a floor do not import each other.
FLOORS = (
    ('registry', 'settings'),  # mmengine's child registries: names only; the numeric settings'
                               # checks and bounds
    ('fileio', 'dist', 'launch', 'device'),  # atomic writes, the safe checkpoint reader, configs as
                                   # data, JSON; collectives; starting and ending the processes of a
                                   # run; compile settings, copies to the device
    ('datasets', 'clustering'),  # the data sets; k-means, κ, acceptance schedules and the
                                  # clustering round (no model code: the models import them)
    ('engine',),           # the Runner, work-dir runs, feature extraction, optimiser wrappers (no
                           # model code: it reads a model through its methods)
    ('models',),
    ('evaluation',),
    ('hooks',),
    ('transfer', 'zoo'),   # detectron2 COCO transfer; the model zoo
    ('ifnd',),             # the package's own __init__
)
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}


def module_name(path: Path) -> str:
    """``ifnd.models.encoder`` for ``ifnd/models/encoder.py`` (a package for its ``__init__.py``);
    ``benchmarks.fn_harness.plan`` for ``benchmarks/fn_harness/plan.py``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def unit(module: str) -> str:
    """The floor-holding unit of a module: its sub-package or top-level module (``ifnd`` itself)."""
    parts = module.split('.')
    return parts[1] if len(parts) > 1 else parts[0]


def imported_modules(path: Path) -> list[tuple[str, int]]:
    """The modules of its own top-level package (``ifnd``, or ``benchmarks`` for a benchmark) a file
    imports, relative imports resolved, with their line numbers."""
    module = module_name(path)
    top = module.split('.')[0]
    package = module if path.name == '__init__.py' else module.rpartition('.')[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')[:len(package.split('.')) - node.level + 1]
                source = '.'.join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ''
            # `from ifnd import registry` imports the module ifnd.registry.
            names = [f'{source}.{alias.name}' for alias in node.names] if source == top else [source]
            found += [(name, node.lineno) for name in names]
    return [(name, line) for name, line in found if name.split('.')[0] == top]


MODULES = sorted(PACKAGE.rglob('*.py'))


def test_every_package_has_a_floor():
    """A new sub-package or top-level module is placed on a floor before it is used."""
    units = {unit(module_name(path)) for path in MODULES}
    assert units - set(FLOOR) == set(), 'add these to FLOORS in tests/test_layers.py'


@pytest.mark.parametrize('path', MODULES, ids=lambda p: osp.relpath(p, PACKAGE.parent))
def test_imports_point_down(path):
    """No module imports from its own floor's neighbours or from a floor above."""
    own = unit(module_name(path))
    wrong = [f'line {line}: {name} ({unit(name)}, floor {FLOOR.get(unit(name))})'
             for name, line in imported_modules(path)
             if unit(name) != own and FLOOR.get(unit(name), len(FLOORS)) >= FLOOR[own]]
    assert not wrong, (f'{own} (floor {FLOOR[own]}) imports upward or sideways; move the code to the '
                       'floor it belongs on:\n' + '\n'.join(wrong))


def test_the_package_imports_nothing_that_stands_above_it():
    """No module of ``ifnd`` imports benchmarks/, tools/ or tests/: they import the package, so an
    import back would close a circle through them."""
    above = ('benchmarks', 'tools', 'tests')
    wrong = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or '']
            else:
                continue
            wrong += [f'{osp.relpath(path, PACKAGE.parent)}:{node.lineno}: {name}' for name in names
                      if name.split('.')[0] in above]
    assert not wrong, 'the package imports what stands above it:\n' + '\n'.join(wrong)


CLUSTERING = sorted((PACKAGE / 'clustering').rglob('*.py'))


@pytest.mark.parametrize('path', CLUSTERING, ids=lambda p: osp.relpath(p, PACKAGE.parent))
def test_clustering_imports_no_model_code(path):
    """Clustering sits below the models: none of its modules imports ifnd.models."""
    wrong = [f'line {line}: {name}' for name, line in imported_modules(path)
             if unit(name) in ('models', 'engine', 'hooks')]
    assert not wrong, f'{module_name(path)} imports model, engine or hook code:\n' + '\n'.join(wrong)


def test_importing_clustering_loads_neither_models_nor_timm():
    """``import ifnd.clustering`` stays light: no model code and no timm are loaded."""
    code = ("import ifnd.clustering, sys; "
            "assert 'timm' not in sys.modules and 'ifnd.models' not in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith(('timm', 'ifnd.models')))")
    subprocess.run([sys.executable, '-c', code], check=True, cwd=PACKAGE.parent)
