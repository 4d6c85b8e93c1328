"""``python -m spotlight``: the ``spotlight`` command, for environments without the console script."""

from spotlight.cli import main

main()
