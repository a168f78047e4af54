"""The ``awp`` command: every subcommand, the terminal rendering and ``awp demo``. The only package that may
import all the others."""
