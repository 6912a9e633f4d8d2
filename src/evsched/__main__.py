"""``python -m evsched``: the same command line as the ``evsched`` script."""

from evsched.cli import main

main()
