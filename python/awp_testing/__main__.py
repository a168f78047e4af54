"""``python -m awp_testing pgprove [DIR|FILE] [-- pg_prove args]``: :func:`awp_testing.cluster.main`."""

import sys

from awp_testing.cluster import main

if __name__ == "__main__":
    sys.exit(main())
