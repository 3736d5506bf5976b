"""torch.hub entry points: ``torch.hub.load(repo_dir, NAME, source='local')`` for every zoo model."""
import functools

from ifnd.zoo import get_model, list_models

dependencies = ['torch', 'timm', 'mmengine', 'yaml']

for _name in list_models():
    globals()[_name] = functools.wraps(get_model)(functools.partial(get_model, _name))
