"""The model zoo from the command line: list | info NAME | download NAME [--dir] | readme."""
from ifnd.zoo.cli import main

if __name__ == '__main__':
    main()
