"""``python -m ifnd.zoo``: the ``ifnd-zoo`` command."""
from .cli import main

main()
