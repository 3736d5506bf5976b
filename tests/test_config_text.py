"""A run's config text (mmengine's ``pretty_text``, written to the log, vis_data, the work dir and
every checkpoint) is formatted once: the same text as mmengine's, formatted again after a change."""
import copy
import os.path as osp

import mmengine.config.config as mmengine_config
from mmengine.config import Config

from ifnd.engine.config_files import RunConfig, load_config

CONFIG = osp.join(osp.dirname(__file__), '..', 'configs', 'simclr', 'simclr_r18_8e_digits.py')


def test_a_run_config_is_formatted_once_for_each_content(monkeypatch):
    plain = Config.fromfile(CONFIG)
    expected = plain.pretty_text
    cfg = load_config(CONFIG)
    assert isinstance(cfg, RunConfig) and cfg.to_dict() == plain.to_dict()
    formatted = []
    format_code = mmengine_config.FormatCode
    monkeypatch.setattr(mmengine_config, 'FormatCode',
                        lambda *args, **kwargs: formatted.append(1) or format_code(*args, **kwargs))
    assert cfg.pretty_text == expected and len(formatted) == 1
    assert cfg.pretty_text == expected and len(formatted) == 1  # the second time: no formatting
    runner_copy = copy.deepcopy(cfg)  # as mmengine's Runner keeps its config
    assert isinstance(runner_copy, RunConfig)
    assert runner_copy.pretty_text == expected and len(formatted) == 1
    # A changed setting is in the text: formatted again, as mmengine formats it.
    runner_copy.merge_from_dict({'train_cfg.max_epochs': 3})
    plain.merge_from_dict({'train_cfg.max_epochs': 3})
    assert runner_copy.pretty_text == plain.pretty_text != expected
    assert 'max_epochs=3' in runner_copy.pretty_text and cfg.pretty_text == expected
