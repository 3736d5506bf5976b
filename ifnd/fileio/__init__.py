"""Files, the ground floor: atomic writes, the safe checkpoint reader, configs as data, JSON.

Nothing here imports from ifnd but ``ifnd.registry`` (the names a config read as data may use).
"""
from .atomic import TEMP_PREFIX, AtomicLocalBackend
from .checkpoint import check_state_fits, check_weights, mmengine_checkpoint_globals, read_checkpoint
from .config_data import checkpoint_config, config_data, config_text_to_data, config_to_data
from .json_files import json_safe, write_json

__all__ = ['TEMP_PREFIX', 'AtomicLocalBackend', 'check_state_fits', 'check_weights',
           'mmengine_checkpoint_globals', 'read_checkpoint', 'checkpoint_config', 'config_data', 'config_text_to_data',
           'config_to_data', 'json_safe', 'write_json']
