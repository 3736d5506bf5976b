"""Child registries of mmengine's roots, scoped as ``ifnd``.

Configs set ``default_scope = 'ifnd'``; building through the root registries then looks here
first and imports the modules in ``locations`` on demand, so tools need no explicit imports.
"""
import inspect
import typing
from typing import Any

from mmengine.registry import DATA_SAMPLERS as MMENGINE_DATA_SAMPLERS
from mmengine.registry import DATASETS as MMENGINE_DATASETS
from mmengine.registry import EVALUATOR as MMENGINE_EVALUATOR
from mmengine.registry import FUNCTIONS as MMENGINE_FUNCTIONS
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import LOG_PROCESSORS as MMENGINE_LOG_PROCESSORS
from mmengine.registry import LOOPS as MMENGINE_LOOPS
from mmengine.registry import METRICS as MMENGINE_METRICS
from mmengine.registry import MODEL_WRAPPERS as MMENGINE_MODEL_WRAPPERS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS as MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS
from mmengine.registry import OPTIM_WRAPPERS as MMENGINE_OPTIM_WRAPPERS
from mmengine.registry import OPTIMIZERS as MMENGINE_OPTIMIZERS
from mmengine.registry import PARAM_SCHEDULERS as MMENGINE_PARAM_SCHEDULERS
from mmengine.registry import RUNNERS as MMENGINE_RUNNERS
from mmengine.registry import TRANSFORMS as MMENGINE_TRANSFORMS
from mmengine.registry import VISBACKENDS as MMENGINE_VISBACKENDS
from mmengine.registry import VISUALIZERS as MMENGINE_VISUALIZERS
from mmengine.registry import Registry

RUNNERS = Registry('runner', parent=MMENGINE_RUNNERS, locations=['ifnd.engine'])
LOOPS = Registry('loop', parent=MMENGINE_LOOPS, locations=['ifnd.engine'])
HOOKS = Registry('hook', parent=MMENGINE_HOOKS, locations=['ifnd.hooks'])
DATASETS = Registry('dataset', parent=MMENGINE_DATASETS, locations=['ifnd.datasets'])
DATA_SAMPLERS = Registry('data sampler', parent=MMENGINE_DATA_SAMPLERS, locations=['ifnd.datasets'])
TRANSFORMS = Registry('transform', parent=MMENGINE_TRANSFORMS, locations=['ifnd.datasets'])
FUNCTIONS = Registry('function', parent=MMENGINE_FUNCTIONS, locations=['ifnd.datasets'])
MODELS = Registry('model', parent=MMENGINE_MODELS, locations=['ifnd.models'])
MODEL_WRAPPERS = Registry('model wrapper', parent=MMENGINE_MODEL_WRAPPERS, locations=['ifnd.models'])
OPTIMIZERS = Registry('optimizer', parent=MMENGINE_OPTIMIZERS, locations=['ifnd.engine'])
OPTIM_WRAPPERS = Registry('optim wrapper', parent=MMENGINE_OPTIM_WRAPPERS, locations=['ifnd.engine'])
OPTIM_WRAPPER_CONSTRUCTORS = Registry(
    'optimizer wrapper constructor', parent=MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS, locations=['ifnd.engine'])
PARAM_SCHEDULERS = Registry('parameter scheduler', parent=MMENGINE_PARAM_SCHEDULERS, locations=['ifnd.engine'])
METRICS = Registry('metric', parent=MMENGINE_METRICS, locations=['ifnd.evaluation'])
EVALUATOR = Registry('evaluator', parent=MMENGINE_EVALUATOR, locations=['ifnd.evaluation'])
VISUALIZERS = Registry('visualizer', parent=MMENGINE_VISUALIZERS, locations=['ifnd.engine'])
VISBACKENDS = Registry('vis_backend', parent=MMENGINE_VISBACKENDS, locations=['ifnd.engine'])
LOG_PROCESSORS = Registry('log_processor', parent=MMENGINE_LOG_PROCESSORS, locations=['ifnd.engine'])
# Which samples' labels count (ifnd/clustering/acceptance.py): the hook's and the detectors' part.
ACCEPTANCES = Registry('acceptance', scope='ifnd', locations=['ifnd.clustering'])



def _keyword_signatures(cls: Any) -> list[tuple[Any, dict[str, inspect.Parameter]]]:
    """The callables whose keywords a registered class (or function) takes, each with those
    keywords: its ``__init__`` and the bases' that its ``**kwargs`` reach (the subclass's first)."""
    found = []
    targets = [c.__init__ for c in cls.__mro__ if '__init__' in vars(c) and c is not object] \
        if isinstance(cls, type) else [cls]
    for target in targets:
        try:
            params = inspect.signature(target).parameters
        except (TypeError, ValueError):
            break
        found.append((target, {name: param for name, param in params.items()
                               if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)}))
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            break
    return found


def parameter_types(cls: Any) -> dict[str, Any]:
    """The keywords a registered class (or function) takes, with their annotations, following
    ``**kwargs`` that a class passes on to its base classes (the subclass's first)."""
    found: dict[str, Any] = {}
    for target, params in _keyword_signatures(cls):
        try:
            hints = typing.get_type_hints(target, include_extras=True)
        except Exception:  # unresolvable forward references: keep the plain annotations
            hints = {}
        for name, param in params.items():
            found.setdefault(name, hints.get(name, param.annotation))
    return found


def parameter_defaults(cls: Any) -> dict[str, Any]:
    """The keywords a registered class (or function) takes with their defaults, as
    :func:`parameter_types` finds them (a keyword without a default is left out)."""
    found: dict[str, Any] = {}
    for _, params in _keyword_signatures(cls):
        for name, param in params.items():
            found.setdefault(name, param.default)
    return {name: default for name, default in found.items() if default is not inspect.Parameter.empty}
