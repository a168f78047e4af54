-- A failed attempt's detail (migration 0018, AWP issue 41): a result's error_detail (a handler's traceback) is
-- checked (a string of at most 8,192 bytes), stored with the attempt and returned by awp.task_attempts.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(6);

SELECT * FROM tests.register_worker('w1', '{mock}', 4) \gset w1_
SELECT tests.make_run('detail', jsonb_build_array(tests.task('a', '{}', '{"retry": {"max_attempts": 2, "interval_ms": 0}}'))) AS run \gset
SELECT * FROM tests.claim_one(:'w1_worker_id', :'w1_token') \gset l_
SELECT throws_ok(format($$SELECT awp.complete_task(%L, %L, %L, %L, %L)$$, :'w1_worker_id', :'w1_token', :'l_dispatch_id',
                        :'l_lease_token', '{"kind": "temporary_failure", "error_detail": 7}'),
                 'AWREQ', NULL, 'error_detail must be a string');
SELECT is(tests.error_detail(format($$SELECT awp.complete_task(%L, %L, %L, %L, %L)$$, :'w1_worker_id', :'w1_token',
                                    :'l_dispatch_id', :'l_lease_token',
                                    jsonb_build_object('kind', 'temporary_failure', 'error_detail', repeat('x', 8193)))),
          'error_detail must be a string of at most 8192 bytes', 'at most 8,192 bytes');
SELECT ok(awp.complete_task(:'w1_worker_id', :'w1_token', :'l_dispatch_id', :'l_lease_token',
                            '{"kind": "temporary_failure", "error_code": "handler_error", "error_message": "ValueError(''boom'')", "error_detail": "Traceback (most recent call last):\n  File \"h.py\", line 3\nValueError: boom"}'),
          'a failure with its traceback is accepted');
SELECT is((SELECT error_detail FROM awp.task_attempts(:'run', 'a') WHERE attempt = 1),
          E'Traceback (most recent call last):\n  File "h.py", line 3\nValueError: boom', 'stored with the attempt');
SELECT is((SELECT attempt_history->0->>'error_detail' FROM awp.get_task(:'run', 'a')),
          E'Traceback (most recent call last):\n  File "h.py", line 3\nValueError: boom', 'and in get_task''s attempt history');
SELECT is((SELECT error_detail FROM awp.attempts WHERE run_id = :'run' AND attempt = 1), E'Traceback (most recent call last):\n  File "h.py", line 3\nValueError: boom',
          'awp.attempts has it');

SELECT * FROM finish();
ROLLBACK;
