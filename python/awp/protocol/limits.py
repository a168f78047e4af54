"""Every limit of the wire, defined once. The database holds the same numbers (``awp._limit_*()``,
``awp._setting_ranges()``, db/functions/00_limits.sql); python/tests/integration/test_limits.py compares the two."""

from __future__ import annotations

from typing import Final

BODY_LIMIT: Final = 1024 * 1024  # bytes of a request body (1 MiB)
WORKFLOW_BODY_LIMIT: Final = 16 * 1024 * 1024  # a workflow definition or a batch of runs: 10,000 tasks fit
MAX_BATCH_RESULTS: Final = 256  # results of one POST /workers/{id}/completions (= awp._limit_batch_results())
MAX_BATCH_LEASES: Final = MAX_BATCH_RESULTS  # leases of one POST /workers/{id}/progress
MAX_BATCH_RUNS: Final = 1000  # runs of one batch start (= awp._limit_batch_runs())
MAX_HEARTBEAT_LIST: Final = (
    1024  # each list of one heartbeat: leases, dropped, claims_pending (awp._limit_heartbeat_list())
)
MAX_PENDING_CLAIMS: Final = MAX_HEARTBEAT_LIST
MAX_PROGRESS_BYTES: Final = 16384  # a progress value (= awp._limit_progress_bytes())
MAX_ENTRY_BYTES: Final = 65536  # one log line or chunk (= awp._limit_progress_entry_bytes())
MAX_ENTRIES: Final = 4096  # lines and chunks of one write (= awp._limit_progress_entries())
PROTOCOL_VERSION: Final = 1
PROTOCOL_HEADER: Final = "X-Worker-Protocol-Version"
