-- Schedules: validation (AWREQ / AWNTF), the cron evaluator (5 and 6 fields, steps, lists, ranges,
-- names, the day-of-month / day-of-week OR rule, time zones and DST), interval firing, exactly one run
-- per fire time, missed fires (only the latest), the idempotency-key guard, coordinator_tick's count.
-- (Two concurrent coordinator passes need two sessions: db/tests/26_schedule_two_passes.sql, with dblink,
-- and python/tests/integration/test_schedules.py.)
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(98);

-- 2030-01-01 is a Tuesday.
SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SET LOCAL TimeZone = 'UTC';
SELECT tests.make_workflow('wf') \gset

-- tests.runs_of(schedule): the runs a schedule started.
CREATE FUNCTION tests.runs_of(p_schedule_id text) RETURNS bigint
LANGUAGE sql AS $$ SELECT count(*) FROM awp.runs WHERE schedule_id = p_schedule_id $$;

-- ================================================================ validation
SELECT throws_ok($$SELECT * FROM awp.create_schedule('bad id!', 'wf', interval_ms => 1000)$$, 'AWREQ', NULL,
                 'a schedule id outside [A-Za-z0-9._-] is AWREQ');
SELECT throws_ok(format($$SELECT * FROM awp.create_schedule(%L, 'wf', interval_ms => 1000)$$, repeat('s', 129)),
                 'AWREQ', NULL, 'a 129-character schedule id is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.create_schedule('s', 'wf', '* * * * *', 1000)$$, 'AWREQ', NULL,
                 'both cron and interval_ms is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.create_schedule('s', 'wf')$$, 'AWREQ', NULL,
                 'neither cron nor interval_ms is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.create_schedule('s', 'wf', interval_ms => 999)$$, 'AWREQ', NULL,
                 'interval_ms below 1000 is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.create_schedule('s', 'wf', '* * * *')$$, 'AWREQ', NULL,
                 'a cron expression of 4 fields is AWREQ');
SELECT matches(tests.error_detail($$SELECT * FROM awp.create_schedule('s', 'wf', '* * * * * * *')$$),
               '5 fields .* or 6 .*; .* has 7', 'the detail says how many fields a cron expression has');
SELECT is(tests.error_detail($$SELECT * FROM awp.create_schedule('s', 'wf', '61 * * * *')$$),
          'minute field: 61 is out of range 0-59', 'an out-of-range minute is named in the detail');
SELECT throws_ok($$SELECT * FROM awp.create_schedule('s', 'wf', '*/0 * * * *')$$, 'AWREQ', NULL, 'a step of 0 is AWREQ');
SELECT is(tests.error_detail($$SELECT * FROM awp.create_schedule('s', 'wf', '0 5-1 * * *')$$),
          'hour field: range 5-1 goes backwards (5 > 1)', 'a backwards range is AWREQ with a clear detail');
SELECT throws_ok($$SELECT * FROM awp.create_schedule('s', 'wf', '0 0 L * *')$$, 'AWREQ', NULL,
                 'L (last day) is not supported: AWREQ');
SELECT throws_ok($$SELECT * FROM awp.create_schedule('s', 'wf', '0 0 ? * *')$$, 'AWREQ', NULL, '? is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.create_schedule('s', 'wf', '0 0 1 FOO *')$$, 'AWREQ', NULL,
                 'an unknown month name is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.create_schedule('s', 'wf', '0 0 * * 8')$$, 'AWREQ', NULL,
                 'day-of-week 8 is AWREQ');
SELECT is(tests.error_detail($$SELECT * FROM awp.create_schedule('s', 'wf', '0 0 31 2,4 *')$$),
          'the expression never fires: no selected month has day 31', 'an expression that never fires is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.create_schedule('s', 'wf', '')$$, 'AWREQ', NULL, 'an empty cron expression is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.create_schedule('s', 'wf', interval_ms => 1000, timezone => 'Mars/Olympus')$$,
                 'AWREQ', NULL, 'an unknown time zone is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.create_schedule('s', 'wf', interval_ms => 1000, timezone => NULL)$$,
                 'AWREQ', NULL, 'a null time zone is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.create_schedule('s', 'wf', interval_ms => 1000, input => '[1]')$$,
                 'AWREQ', NULL, 'an input that is not an object is AWREQ');
SELECT throws_ok(format($$SELECT * FROM awp.create_schedule('s', 'wf', interval_ms => 1000, input => %L)$$,
                        jsonb_build_object('x', repeat('x', 65536))),
                 'AWREQ', NULL, 'an input over 64 KiB is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.create_schedule('s', 'nope', interval_ms => 1000)$$, 'AWNTF', NULL,
                 'an unknown workflow is AWNTF');
SELECT throws_ok($$SELECT * FROM awp.delete_schedule('nope')$$, 'AWNTF', NULL, 'deleting an unknown schedule is AWNTF');
SELECT is((SELECT count(*) FROM awp.schedules), 0::bigint, 'no failed call left a schedule behind');

-- ================================================================ the cron evaluator
SELECT is(awp._cron_next('*/15 * * * *', '2030-01-01 00:07:12.5+00'), '2030-01-01 00:15:00+00'::timestamptz,
          '*/15: the next quarter hour');
SELECT is(awp._cron_next('*/15 * * * *', '2030-01-01 00:15:00+00'), '2030-01-01 00:30:00+00'::timestamptz,
          'strictly after: a fire time itself is not next');
SELECT is(awp._cron_next('*/10 * * * * *', '2030-01-01 00:00:05+00'), '2030-01-01 00:00:10+00'::timestamptz,
          '6 fields: seconds first');
SELECT is(awp._cron_next('30 15 10 * * *', '2030-01-01 10:15:31+00'), '2030-01-02 10:15:30+00'::timestamptz,
          '6 fields: second 30 of 10:15, daily');
SELECT is(awp._cron_next('0 8,12,18 * * *', '2030-01-01 12:00:00+00'), '2030-01-01 18:00:00+00'::timestamptz,
          'a list of hours');
SELECT is(awp._cron_next('0 0-12/4 * * *', '2030-01-01 05:00:00+00'), '2030-01-01 08:00:00+00'::timestamptz,
          'a range with a step (0,4,8,12)');
SELECT is(awp._cron_next('0 0-12/4 * * *', '2030-01-01 12:00:00+00'), '2030-01-02 00:00:00+00'::timestamptz,
          '... past its end: the next day');
SELECT is(awp._cron_next('0 9 * * MON-FRI', '2030-01-04 10:00:00+00'), '2030-01-07 09:00:00+00'::timestamptz,
          'weekdays by name: Friday after 9:00 -> Monday 9:00');
SELECT is(awp._cron_next('0 0 * * 7', '2030-01-01 00:00:00+00'), '2030-01-06 00:00:00+00'::timestamptz,
          'day-of-week 7 is Sunday');
SELECT is(awp._cron_next('0 0 * * 0', '2030-01-01 00:00:00+00'), '2030-01-06 00:00:00+00'::timestamptz,
          'day-of-week 0 is Sunday too');
SELECT is(awp._cron_next('0 0 1 feb *', '2030-01-01 00:00:00+00'), '2030-02-01 00:00:00+00'::timestamptz,
          'month names, case-insensitive');
SELECT is(awp._cron_next('0 0 13 * *', '2030-01-01 00:00:00+00'), '2030-01-13 00:00:00+00'::timestamptz,
          'day-of-month alone (day-of-week *)');
SELECT is(awp._cron_next('0 0 13 * 5', '2030-01-01 00:00:00+00'), '2030-01-04 00:00:00+00'::timestamptz,
          'both day fields restricted: either matches (Friday the 4th comes before the 13th)');
SELECT is(awp._cron_next('0 0 13 * 5', '2030-01-11 00:00:00+00'), '2030-01-13 00:00:00+00'::timestamptz,
          '... and the 13th (a Sunday) matches by day-of-month');
SELECT is(awp._cron_next('0 0 */2 * 5', '2030-01-01 00:00:00+00'), '2030-01-11 00:00:00+00'::timestamptz,
          'a day field starting with * is ANDed: odd days that are Fridays (the 4th is even)');
SELECT is(awp._cron_next('0 0 29 2 *', '2030-01-01 00:00:00+00'), '2032-02-29 00:00:00+00'::timestamptz,
          'February 29: the next leap year');
SELECT is(awp._cron_next('@hourly', '2030-01-01 00:30:00+00'), '2030-01-01 01:00:00+00'::timestamptz,
          '@hourly');
SELECT is(awp._cron_next('5/20 * * * *', '2030-01-01 00:30:00+00'), '2030-01-01 00:45:00+00'::timestamptz,
          'a/n steps from a to the end (5,25,45)');
SELECT is(awp._cron_prev('0 0 * * *', '2030-01-05 12:00:00+00'), '2030-01-05 00:00:00+00'::timestamptz,
          '_cron_prev: the last fire time at or before');
SELECT is(awp._cron_prev('0 0 * * *', '2030-01-05 00:00:00+00'), '2030-01-05 00:00:00+00'::timestamptz,
          '_cron_prev includes the instant itself');
-- Time zones: wall-clock time of the schedule's zone.
SELECT is(awp._cron_next('0 9 * * *', '2030-01-01 10:00:00+00', 'Europe/Berlin'), '2030-01-02 08:00:00+00'::timestamptz,
          '9:00 in Berlin in winter is 08:00 UTC');
SELECT is(awp._cron_next('0 9 * * *', '2030-07-01 10:00:00+00', 'Europe/Berlin'), '2030-07-02 07:00:00+00'::timestamptz,
          '9:00 in Berlin in summer is 07:00 UTC');
SELECT is(awp._cron_next('0 9 * * MON', '2030-01-06 23:30:00+00', 'Asia/Tokyo'), '2030-01-07 00:00:00+00'::timestamptz,
          'day of week and time are the zone''s: Sunday 23:30 UTC is Monday 08:30 in Tokyo, 30 minutes before the fire');
SELECT is(awp._cron_next('30 2 * * *', '2030-03-30 12:00:00+00', 'Europe/Berlin'), '2030-03-31 01:00:00+00'::timestamptz,
          'DST: 02:30 does not exist on 31 March: it fires at the jump (03:00 CEST = 01:00 UTC)');
SELECT is(awp._cron_next('30 2 * * *', '2030-10-26 12:00:00+00', 'Europe/Berlin'), '2030-10-27 00:30:00+00'::timestamptz,
          'DST: 02:30 happens twice on 27 October: the first occurrence (CEST)');
SELECT is(awp._cron_next('30 2 * * *', '2030-10-27 00:30:00+00', 'Europe/Berlin'), '2030-10-28 01:30:00+00'::timestamptz,
          '... and only once (next: the following day)');
SELECT is(awp._cron_next('*/15 * * * *', '2030-03-31 00:45:00+00', 'Europe/Berlin'), '2030-03-31 01:00:00+00'::timestamptz,
          'DST: every 15 minutes keeps going across the jump forward');

-- ================================================================ an interval schedule
SELECT * FROM awp.create_schedule('every-min', 'wf', interval_ms => 60000, input => '{"n": 1}') \gset s_
SELECT is(:'s_next_fire_at'::timestamptz, :'t0'::timestamptz + interval '60 s', 'the first fire time is created_at + interval');
SELECT results_eq($$SELECT schedule_id, workflow_id, cron, interval_ms, input, timezone, last_fired_at, last_run_id FROM awp.list_schedules()$$,
                  $$VALUES ('every-min'::text, 'wf'::text, NULL::text, 60000, '{"n": 1}'::jsonb, 'UTC'::text, NULL::timestamptz, NULL::text)$$,
                  'list_schedules shows it');
SELECT is((SELECT created_at FROM awp.create_schedule('every-min', 'wf', interval_ms => 60000, input => '{"n": 1}')),
          :'t0'::timestamptz, 'creating it again with the same definition returns the same schedule');
SELECT throws_ok($$SELECT * FROM awp.create_schedule('every-min', 'wf', interval_ms => 60000, input => '{"n": 2}')$$,
                 'AWREQ', NULL, 'creating it again with another definition is AWREQ');
SELECT is(awp.fire_schedules(), 0, 'nothing is due yet');
SELECT tests.advance('59.999 s');
SELECT is(awp.fire_schedules(), 0, 'still nothing 1 ms before the fire time');
SELECT tests.advance('0.001 s');
SELECT is(awp.fire_schedules(), 1, 'at the fire time: one run');
SELECT results_eq($$SELECT workflow_id, workflow_version, input, schedule_id, idempotency_key FROM awp.runs WHERE schedule_id = 'every-min'$$,
                  format($$VALUES ('wf'::text, 1, '{"n": 1}'::jsonb, 'every-min'::text, 'schedule:every-min:%s'::text)$$,
                         extract(epoch FROM :'t0'::timestamptz + interval '60 s')::bigint * 1000),
                  'the run has the schedule''s input, its schedule_id and the fire time''s idempotency key');
SELECT results_eq($$SELECT next_fire_at, last_fired_at, last_run_id FROM awp.schedules WHERE schedule_id = 'every-min'$$,
                  format($$SELECT %L::timestamptz + interval '120 s', %L::timestamptz + interval '60 s', run_id FROM awp.runs WHERE schedule_id = 'every-min'$$,
                         :'t0', :'t0'),
                  'next_fire_at moves one interval on; last_fired_at / last_run_id record the fire');
SELECT is(awp.fire_schedules(), 0, 'a second pass at the same time starts nothing');
SELECT is(tests.runs_of('every-min'), 1::bigint, 'still one run');
SELECT is(tests.task_statuses((SELECT run_id FROM awp.runs WHERE schedule_id = 'every-min')), ARRAY['a=ready'],
          'the run is a normal run (its root task is ready)');

-- Missed fire times: only the latest is started.
SELECT tests.advance('10 min 30 s');   -- now t0 + 11:30; fire times 2:00 .. 11:00 are due
SELECT is(awp.fire_schedules(), 1, 'ten missed fire times start one run');
SELECT is(tests.runs_of('every-min'), 2::bigint, 'two runs in all');
SELECT results_eq($$SELECT last_fired_at, next_fire_at FROM awp.schedules WHERE schedule_id = 'every-min'$$,
                  format($$VALUES (%L::timestamptz + interval '11 min', %L::timestamptz + interval '12 min')$$, :'t0', :'t0'),
                  'the latest due fire time (11:00) was started; the next is the first after now (12:00)');
SELECT is((SELECT idempotency_key FROM awp.runs r JOIN awp.schedules s ON s.last_run_id = r.run_id),
          format('schedule:every-min:%s', extract(epoch FROM :'t0'::timestamptz + interval '11 min')::bigint * 1000),
          'its key names the 11:00 fire time');

-- The idempotency key is a second guard: a fire time already started starts nothing again.
UPDATE awp.schedules SET next_fire_at = :'t0'::timestamptz + interval '11 min' WHERE schedule_id = 'every-min';
SELECT is(awp.fire_schedules(), 0, 'a fire time whose key was used starts nothing (a stale next_fire_at)');
SELECT is(tests.runs_of('every-min'), 2::bigint, 'still two runs');
SELECT is((SELECT next_fire_at FROM awp.schedules WHERE schedule_id = 'every-min'), :'t0'::timestamptz + interval '12 min',
          '... and the schedule moved on');

-- coordinator_tick fires schedules and counts them.
SELECT tests.advance('30 s');   -- t0 + 12:00
SELECT is((awp.coordinator_tick()->>'schedules_fired')::integer, 1, 'coordinator_tick fires a due schedule and counts it');
SELECT is((awp.coordinator_tick()->>'schedules_fired')::integer, 0, '... once');
SELECT is(tests.runs_of('every-min'), 3::bigint, 'three runs in all');

-- A schedule starts the workflow's latest version at fire time.
SELECT tests.make_workflow('wf', jsonb_build_array(tests.task('b'))) \gset
SELECT tests.advance('1 min');
SELECT is(awp.fire_schedules(), 1, 'the next fire time');
SELECT is((SELECT r.workflow_version FROM awp.runs r JOIN awp.schedules s ON s.last_run_id = r.run_id), 2,
          'the run uses the latest version (2)');

-- Deleting: returns the schedule, stops the firing, keeps the runs' schedule_id.
SELECT results_eq($$SELECT schedule_id, interval_ms FROM awp.delete_schedule('every-min')$$,
                  $$VALUES ('every-min'::text, 60000)$$, 'delete_schedule returns the deleted schedule');
SELECT tests.advance('5 min');
SELECT is(awp.fire_schedules(), 0, 'a deleted schedule fires no more');
SELECT is(tests.runs_of('every-min'), 4::bigint, 'its runs remain, with their schedule_id');
SELECT throws_ok($$SELECT * FROM awp.delete_schedule('every-min')$$, 'AWNTF', NULL, 'deleting it twice is AWNTF');

-- ================================================================ a cron schedule in a time zone
SELECT tests.freeze('2030-01-01 00:00:00+00');
SELECT * FROM awp.create_schedule('nine', 'wf', '0 9 * * *', input => '{"report": "daily"}',
                                  timezone => 'europe/berlin') \gset n_
SELECT is(:'n_timezone'::text, 'Europe/Berlin', 'the time zone is matched case-insensitively and stored as listed');
SELECT is(:'n_next_fire_at'::timestamptz, '2030-01-01 08:00:00+00'::timestamptz, 'next_fire_at: 9:00 Berlin = 08:00 UTC');
SELECT tests.freeze('2030-01-01 08:00:00+00');
SELECT is(awp.fire_schedules(), 1, 'at 9:00 Berlin: one run');
SELECT is((SELECT input FROM awp.runs WHERE schedule_id = 'nine'), '{"report": "daily"}'::jsonb, 'with the schedule''s input');
SELECT is((SELECT next_fire_at FROM awp.schedules WHERE schedule_id = 'nine'), '2030-01-02 08:00:00+00'::timestamptz,
          'next: tomorrow 9:00 Berlin');
-- Missed for four days: one run, for the latest due day.
SELECT tests.freeze('2030-01-05 12:00:00+00');
SELECT is(awp.fire_schedules(), 1, 'four missed days start one run');
SELECT results_eq($$SELECT last_fired_at, next_fire_at FROM awp.schedules WHERE schedule_id = 'nine'$$,
                  $$VALUES ('2030-01-05 08:00:00+00'::timestamptz, '2030-01-06 08:00:00+00'::timestamptz)$$,
                  'the latest due fire time (5 January) was started; next is 6 January');
SELECT is(tests.runs_of('nine'), 2::bigint, 'two runs of the cron schedule');

-- ================================================================ a schedule whose workflow is gone
INSERT INTO awp.schedules (schedule_id, workflow_id, interval_ms, next_fire_at, created_at)
VALUES ('ghost', 'gone', 1000, '2030-01-05 11:59:59+00', '2030-01-05 11:59:58+00');
SET LOCAL client_min_messages = error;   -- the WARNING of the skipped fire time
SELECT lives_ok($$SELECT awp.fire_schedules()$$, 'a schedule whose workflow is missing does not fail the pass');
RESET client_min_messages;
SELECT is((SELECT next_fire_at FROM awp.schedules WHERE schedule_id = 'ghost'), '2030-01-05 12:00:01+00'::timestamptz,
          'its fire time is skipped: next_fire_at moved past now');
SELECT is((SELECT last_run_id FROM awp.schedules WHERE schedule_id = 'ghost'), NULL, 'no run recorded');
SELECT is(tests.runs_of('ghost'), 0::bigint, 'no run started');

-- ================================================================ the table's named checks
SELECT throws_ok($$INSERT INTO awp.schedules (schedule_id, workflow_id, cron, interval_ms, next_fire_at, created_at)
                   VALUES ('x', 'wf', '* * * * *', 1000, now(), now())$$, '23514', NULL,
                 'schedule_has_one_trigger: not both cron and interval');
SELECT throws_ok($$INSERT INTO awp.schedules (schedule_id, workflow_id, interval_ms, next_fire_at, created_at)
                   VALUES ('x', 'wf', 999, now(), now())$$, '23514', NULL, 'schedule_interval_in_range');
SELECT throws_ok($$INSERT INTO awp.schedules (schedule_id, workflow_id, interval_ms, input, next_fire_at, created_at)
                   VALUES ('x', 'wf', 1000, '[]', now(), now())$$, '23514', NULL, 'schedule_input_is_object');
SELECT throws_ok($$INSERT INTO awp.schedules (schedule_id, workflow_id, interval_ms, next_fire_at, created_at)
                   VALUES ('x y', 'wf', 1000, now(), now())$$, '23514', NULL, 'schedule_id_is_valid');

-- ================================================================ through the gateway role
SET LOCAL ROLE awp_gateway;
SELECT is((SELECT schedule_id FROM awp.create_schedule('gw', 'wf', '@daily')), 'gw', 'awp_gateway creates a schedule');
SELECT is((SELECT count(*) FROM awp.list_schedules()), 3::bigint, 'awp_gateway lists schedules');
SELECT is((SELECT schedule_id FROM awp.delete_schedule('gw')), 'gw', 'awp_gateway deletes a schedule');
SELECT is(awp.fire_schedules(), 0, 'awp_gateway may run fire_schedules');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
