-- 0022_task_progress: live progress, logs and partial output of a running task (docs/progress.md; AWP issue 45;
-- db/functions/progress.sql).
-- awp.settings:
--   progress_log_bytes, progress_chunk_bytes  how many bytes of log lines and of output chunks one attempt keeps
--                     (default 1 MiB each); past that the oldest are dropped first and the attempt is marked truncated.
-- awp.run_outputs:   one row per run that has output: the last sequence number given to its log lines, chunks and
--                     progress values (contiguous per run; the cursor of GET /runs/{id}/stream). Its row lock is the
--                     only lock a progress write shares with other writers of the same run, for one short transaction.
-- awp.task_progress: one row per attempt that reported anything: the latest progress value (latest wins) and its
--                     sequence number, the bytes kept and the entries dropped per kind, and `entries`, the lines and
--                     chunks received so far (a write that gives its offset is applied once: a retry skips them).
-- awp.task_output:   the log lines and chunks kept: one row per write and kind (a write's lines, its chunks), its
--                     entries numbered first_seq .. seq (one row per line made 10 lines per task cost as much as the
--                     task's completion). No foreign key to runs (like awp.events: a foreign key would take a share
--                     lock on the run row, which completions lock for update); pruned with the run by
--                     awp._prune_batch.

SET LOCAL ROLE awp_owner;

ALTER TABLE awp.settings
  ADD COLUMN progress_log_bytes integer NOT NULL DEFAULT 1048576,
  ADD COLUMN progress_chunk_bytes integer NOT NULL DEFAULT 1048576,
  ADD CONSTRAINT progress_log_bytes_in_range CHECK (progress_log_bytes BETWEEN 1024 AND 67108864),
  ADD CONSTRAINT progress_chunk_bytes_in_range CHECK (progress_chunk_bytes BETWEEN 1024 AND 67108864);

CREATE TABLE awp.run_outputs (
  run_id   text PRIMARY KEY,
  last_seq bigint NOT NULL,
  CONSTRAINT run_output_seq_not_negative CHECK (last_seq >= 0)
);

CREATE TABLE awp.task_progress (
  dispatch_id   text PRIMARY KEY,
  run_id        text NOT NULL,
  task_key      text NOT NULL,
  attempt       integer NOT NULL,
  progress      jsonb,
  progress_seq  bigint,
  progress_at   timestamptz,
  log_bytes     bigint NOT NULL DEFAULT 0,
  chunk_bytes   bigint NOT NULL DEFAULT 0,
  logs_dropped  bigint NOT NULL DEFAULT 0,
  chunks_dropped bigint NOT NULL DEFAULT 0,
  entries       bigint NOT NULL DEFAULT 0,
  updated_at    timestamptz NOT NULL,
  CONSTRAINT task_progress_counts CHECK (log_bytes >= 0 AND chunk_bytes >= 0 AND logs_dropped >= 0
                                         AND chunks_dropped >= 0 AND entries >= 0),
  CONSTRAINT task_progress_value_size CHECK (octet_length(progress::text) <= 16384)
);
CREATE UNIQUE INDEX task_progress_attempt_uq ON awp.task_progress (run_id, task_key, attempt);
CREATE INDEX task_progress_seq_idx ON awp.task_progress (run_id, progress_seq) WHERE progress_seq IS NOT NULL;

CREATE TABLE awp.task_output (
  run_id     text NOT NULL,
  seq        bigint NOT NULL,   -- the sequence number of its last entry
  first_seq  bigint NOT NULL,   -- of its first: its entries are numbered first_seq .. seq
  task_key   text NOT NULL,
  attempt    integer NOT NULL,
  kind       text NOT NULL,
  entries    text[] NOT NULL,   -- the log lines (or chunks) of one write, in order
  bytes      integer NOT NULL,  -- their UTF-8 bytes together
  created_at timestamptz NOT NULL,
  PRIMARY KEY (run_id, seq),
  CONSTRAINT task_output_kind_is_valid CHECK (kind IN ('log', 'chunk')),
  CONSTRAINT task_output_numbered CHECK (first_seq >= 1 AND seq - first_seq + 1 = cardinality(entries))
);
CREATE INDEX task_output_attempt_idx ON awp.task_output (run_id, task_key, attempt, seq);

RESET ROLE;
