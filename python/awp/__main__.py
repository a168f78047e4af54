"""``python -m awp``: the ``awp`` command run by this interpreter (how the demo, tests and benchmarks start it)."""

from awp.cli.main import main

if __name__ == "__main__":
    main(prog_name="awp")
