"""Files, the ground floor: atomic writes, the safe checkpoint reader, configs as data (and their
former names, ``former_names.py``), JSON, files opened as plain files (never a FIFO, never through a
link where the project writes its own).

Nothing here imports from ifnd but ``ifnd.registry`` (the names a config read as data may use).
"""
from .atomic import TEMP_PREFIX, AtomicLocalBackend
from .checkpoint import check_state_fits, check_weights, mmengine_checkpoint_globals, read_checkpoint
from .config_data import checkpoint_config, config_data, config_text_to_data, config_to_data
from .json_files import json_safe, write_json
from .plain_files import (NotAPlainFile, check_open_file, check_own_path, check_own_tree, check_plain_file,
                          check_replaceable, open_plain)

__all__ = ['TEMP_PREFIX', 'AtomicLocalBackend', 'check_state_fits', 'check_weights',
           'mmengine_checkpoint_globals', 'read_checkpoint', 'checkpoint_config', 'config_data', 'config_text_to_data',
           'config_to_data', 'json_safe', 'write_json', 'NotAPlainFile', 'check_open_file', 'check_own_path',
           'check_own_tree', 'check_plain_file', 'check_replaceable', 'open_plain']
