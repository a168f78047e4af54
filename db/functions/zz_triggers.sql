-- Triggers, re-created after every function file (their functions are defined in those files).

-- events_flush_log_state: at commit, writes any run counters that awp._append_events kept in awp.log_state and
-- that no awp._log_flush() call wrote (see db/functions/00_helpers.sql). Deferred, so it runs once the
-- transaction's own calls are done; a no-op (one setting read) when they flushed, as they all do.
DROP TRIGGER IF EXISTS events_flush_log_state ON awp.events;
CREATE CONSTRAINT TRIGGER events_flush_log_state
  AFTER INSERT ON awp.events DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION awp._log_flush_at_commit();
