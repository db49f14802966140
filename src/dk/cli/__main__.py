"""``python -m dk.cli``: the ``dk`` command."""

from dk.cli.app import console_main

if __name__ == "__main__":
    console_main()
