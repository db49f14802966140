"""``python -m dk.cli``: the ``dk`` command."""

from dk.cli.app import main

if __name__ == "__main__":
    main()
