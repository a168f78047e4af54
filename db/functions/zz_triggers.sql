-- Triggers, re-created after every function file (their functions are defined in those files).

-- events_flush_log_state: at commit, writes any run counters that awp._append_events kept in awp.log_state and
-- that no awp._log_flush() call wrote (see db/functions/00_helpers.sql). Deferred, so it runs once the
-- transaction's own calls are done; a no-op (one setting read) when they flushed, as they all do.
-- Queued only for an event inserted while awp.log_state holds something (a constraint trigger's WHEN is
-- evaluated at the insert, not at commit): awp._append_events stores its run's state before it inserts, so
-- events appended and left unflushed have queued the flush; awp._write_log (the hot paths) inserts with the
-- state empty and queues nothing. Without the WHEN, each of the 8 events of a completion with its refill
-- queued a trigger call run at commit: measured (backend CPU per item, two databases interleaved) 4-6% of the
-- group path's and the single path's cost in three runs out of five, no difference in the other two.
DROP TRIGGER IF EXISTS events_flush_log_state ON awp.events;
CREATE CONSTRAINT TRIGGER events_flush_log_state
  AFTER INSERT ON awp.events DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (coalesce(current_setting('awp.log_state', true), '') <> '')
  EXECUTE FUNCTION awp._log_flush_at_commit();
