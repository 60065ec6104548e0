"""``python -m fi_toolkit`` (and ``torchrun ... -m fi_toolkit``): the ``fi`` command line."""

from fi_toolkit.cli.entry import main

if __name__ == "__main__":
    main()
