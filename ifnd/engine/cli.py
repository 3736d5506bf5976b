"""Helpers shared by the command-line tools: device choice and JSON results."""
import json
import os
import os.path as osp

import torch


def resolve_device(name: str) -> torch.device:
    """The device to run on: CUDA when available for 'auto'."""
    if name == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    device = torch.device(name)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda was asked for but CUDA is not available')
    return device


def write_json(result: dict, path: str) -> None:
    """Write a tool's results as JSON, creating the folder, and say where."""
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        json.dump(result, f, indent=2)
    print(f'Results written to {path}')
