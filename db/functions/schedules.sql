-- Schedules (docs/schedules.md): awp.create_schedule, awp.delete_schedule, awp.list_schedules and
-- awp.fire_schedules (a step of awp.coordinator_tick), plus the cron evaluator they use.
--
-- Fire times. An interval schedule fires at created_at + k * interval_ms (k >= 1). A cron schedule
-- fires at each wall-clock time of its time zone that the expression matches, mapped to an instant by
-- awp._wall_instant: a wall-clock time that happens twice (the clock goes back) fires once, at its
-- first occurrence; one that never happens (the clock jumps forward) fires at the instant of the jump.
-- That mapping never decreases, so "the first fire time after t" is the first matching wall-clock time
-- at or after awp._wall_bound(t), and "the last fire time at or before t" the last one before it.
--
-- Lock order of the project with schedules: settings -> worker -> schedule -> run -> dispatch ->
-- task. awp.fire_schedules locks schedule rows (SKIP LOCKED) and then starts runs.

-- ---------------------------------------------------------------- cron expressions

-- awp._cron_value(token, field, lo, hi, names, name_base): one number or name of a cron field.
-- Raises AWREQ naming the field. Takes no locks.
CREATE OR REPLACE FUNCTION awp._cron_value(p_token text, p_field text, p_lo integer, p_hi integer,
                                           p_names text[], p_name_base integer)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v integer;
BEGIN
  IF p_token ~ '^[0-9]{1,9}$' THEN
    v := p_token::integer;
  ELSIF p_names IS NOT NULL AND upper(p_token) = ANY (p_names) THEN
    v := array_position(p_names, upper(p_token)) - 1 + p_name_base;
  ELSE
    PERFORM awp._raise_invalid_request('invalid cron expression',
      format('%s field: %L is not a number%s', p_field, p_token,
             CASE WHEN p_names IS NULL THEN '' ELSE ' or a name (' || array_to_string(p_names, ', ') || ')' END));
  END IF;
  IF v NOT BETWEEN p_lo AND p_hi THEN
    PERFORM awp._raise_invalid_request('invalid cron expression',
      format('%s field: %s is out of range %s-%s', p_field, v, p_lo, p_hi));
  END IF;
  RETURN v;
END $$;
COMMENT ON FUNCTION awp._cron_value(text, text, integer, integer, text[], integer) IS 'One value (number or name) of a cron field; AWREQ when invalid.';

-- awp._cron_field(text, field, lo, hi, names, name_base): the sorted values of one cron field:
-- `*`, numbers, names, ranges a-b, steps */n, a-b/n and a/n (a to the maximum), lists x,y,z.
-- Raises AWREQ naming the field and the problem. Takes no locks.
CREATE OR REPLACE FUNCTION awp._cron_field(p_text text, p_field text, p_lo integer, p_hi integer,
                                           p_names text[] DEFAULT NULL, p_name_base integer DEFAULT 0)
RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_part  text;
  v_base  text;
  v_step  integer;
  v_a     integer;
  v_b     integer;
  v_vals  integer[] := '{}';
BEGIN
  IF p_text !~ '^[A-Za-z0-9*/,-]+$' THEN
    PERFORM awp._raise_invalid_request('invalid cron expression',
      format('%s field: %L has a character other than digits, names, * / , -', p_field, p_text));
  END IF;
  FOREACH v_part IN ARRAY string_to_array(p_text, ',') LOOP
    IF v_part = '' THEN
      PERFORM awp._raise_invalid_request('invalid cron expression', format('%s field: %L has an empty list item', p_field, p_text));
    END IF;
    v_base := split_part(v_part, '/', 1);
    v_step := 1;
    IF v_part LIKE '%/%' THEN
      IF v_part LIKE '%/%/%' OR split_part(v_part, '/', 2) !~ '^[0-9]{1,3}$' OR split_part(v_part, '/', 2)::integer = 0 THEN
        PERFORM awp._raise_invalid_request('invalid cron expression',
          format('%s field: %L needs a step of 1-999 after a single /', p_field, v_part));
      END IF;
      v_step := split_part(v_part, '/', 2)::integer;
    END IF;
    IF v_base = '*' THEN
      v_a := p_lo;
      v_b := p_hi;
    ELSIF v_base LIKE '%-%' THEN
      IF v_base LIKE '%-%-%' OR v_base LIKE '-%' OR v_base LIKE '%-' THEN
        PERFORM awp._raise_invalid_request('invalid cron expression', format('%s field: %L is not a range a-b', p_field, v_part));
      END IF;
      v_a := awp._cron_value(split_part(v_base, '-', 1), p_field, p_lo, p_hi, p_names, p_name_base);
      v_b := awp._cron_value(split_part(v_base, '-', 2), p_field, p_lo, p_hi, p_names, p_name_base);
      IF v_a > v_b THEN
        PERFORM awp._raise_invalid_request('invalid cron expression',
          format('%s field: range %s goes backwards (%s > %s)', p_field, v_base, v_a, v_b));
      END IF;
    ELSIF v_base = '' OR v_base LIKE '%*%' THEN
      PERFORM awp._raise_invalid_request('invalid cron expression', format('%s field: %L is not valid', p_field, v_part));
    ELSE
      v_a := awp._cron_value(v_base, p_field, p_lo, p_hi, p_names, p_name_base);
      v_b := CASE WHEN v_part LIKE '%/%' THEN p_hi ELSE v_a END;
    END IF;
    v_vals := v_vals || ARRAY(SELECT generate_series(v_a, v_b, v_step));
  END LOOP;
  RETURN ARRAY(SELECT DISTINCT x FROM unnest(v_vals) x ORDER BY x);
END $$;
COMMENT ON FUNCTION awp._cron_field(text, text, integer, integer, text[], integer) IS 'The sorted values of one cron field; AWREQ with the field and the problem when invalid.';

-- awp._cron_parse(cron): the parsed form of a cron expression, a jsonb object
-- {second, minute, hour, dom, month, dow: sorted int arrays, dom_star, dow_star: booleans}.
-- 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds first); @yearly, @annually,
-- @monthly, @weekly, @daily, @midnight and @hourly are shorthands. Day-of-week 0-7 (0 and 7 are
-- Sunday) or SUN-SAT; month 1-12 or JAN-DEC. A day matches when both day fields match, except that
-- when both are restricted (neither starts with *), either one is enough (the classic cron rule).
-- Raises AWREQ with a detail naming the problem, also for a day-of-month that no month selected has.
-- Takes no locks.
CREATE OR REPLACE FUNCTION awp._cron_parse(p_cron text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_text   text := btrim(regexp_replace(coalesce(p_cron, ''), '\s+', ' ', 'g'));
  v_f      text[];
  v_dom    integer[];
  v_month  integer[];
  v_dow    integer[];
BEGIN
  IF v_text = '' THEN
    PERFORM awp._raise_invalid_request('invalid cron expression', 'the cron expression is empty');
  END IF;
  IF length(v_text) > 256 THEN
    PERFORM awp._raise_invalid_request('invalid cron expression', 'the cron expression is longer than 256 characters');
  END IF;
  v_text := CASE lower(v_text)
    WHEN '@yearly' THEN '0 0 1 1 *' WHEN '@annually' THEN '0 0 1 1 *' WHEN '@monthly' THEN '0 0 1 * *'
    WHEN '@weekly' THEN '0 0 * * 0' WHEN '@daily' THEN '0 0 * * *' WHEN '@midnight' THEN '0 0 * * *'
    WHEN '@hourly' THEN '0 * * * *' ELSE v_text END;
  v_f := string_to_array(v_text, ' ');
  IF cardinality(v_f) = 5 THEN
    v_f := '0'::text || v_f;
  ELSIF cardinality(v_f) <> 6 THEN
    PERFORM awp._raise_invalid_request('invalid cron expression',
      format('a cron expression has 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds first); %L has %s',
             v_text, cardinality(v_f)));
  END IF;
  v_dom := awp._cron_field(v_f[4], 'day-of-month', 1, 31);
  v_month := awp._cron_field(v_f[5], 'month', 1, 12,
                             '{JAN,FEB,MAR,APR,MAY,JUN,JUL,AUG,SEP,OCT,NOV,DEC}', 1);
  v_dow := awp._cron_field(v_f[6], 'day-of-week', 0, 7, '{SUN,MON,TUE,WED,THU,FRI,SAT}', 0);
  v_dow := ARRAY(SELECT DISTINCT x % 7 FROM unnest(v_dow) x ORDER BY 1);
  -- Only the day of month decides (the day of week is * or ANDed with it): some selected month must have it.
  IF (left(v_f[4], 1) = '*' OR left(v_f[6], 1) = '*')
     AND NOT EXISTS (SELECT 1 FROM unnest(v_dom) d, unnest(v_month) m
                      WHERE d <= CASE WHEN m = 2 THEN 29 WHEN m IN (4, 6, 9, 11) THEN 30 ELSE 31 END) THEN
    PERFORM awp._raise_invalid_request('invalid cron expression',
      format('the expression never fires: no selected month has day %s', array_to_string(v_dom, ',')));
  END IF;
  RETURN jsonb_build_object(
    'second', awp._cron_field(v_f[1], 'second', 0, 59),
    'minute', awp._cron_field(v_f[2], 'minute', 0, 59),
    'hour', awp._cron_field(v_f[3], 'hour', 0, 23),
    'dom', v_dom, 'month', v_month, 'dow', v_dow,
    'dom_star', left(v_f[4], 1) = '*', 'dow_star', left(v_f[6], 1) = '*');
END $$;
COMMENT ON FUNCTION awp._cron_parse(text) IS 'Parses a cron expression (5 or 6 fields) into sorted value arrays; AWREQ with details when invalid.';

-- awp._cron_time(hours, minutes, seconds, from, forward): the first time of day >= from (forward) or
-- the last <= from (backward) whose hour, minute and second are in the (sorted) arrays; NULL when none.
CREATE OR REPLACE FUNCTION awp._cron_time(p_h integer[], p_mi integer[], p_s integer[], p_from time,
                                          p_fwd boolean)
RETURNS time
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_h0  integer := extract(hour FROM p_from);
  v_mi0 integer := extract(minute FROM p_from);
  v_s0  integer := floor(extract(second FROM p_from));
  h     integer;
  mi    integer;
  s     integer;
BEGIN
  IF NOT p_fwd THEN
    p_h := ARRAY(SELECT x FROM unnest(p_h) x ORDER BY x DESC);
    p_mi := ARRAY(SELECT x FROM unnest(p_mi) x ORDER BY x DESC);
    p_s := ARRAY(SELECT x FROM unnest(p_s) x ORDER BY x DESC);
  END IF;
  FOREACH h IN ARRAY p_h LOOP
    CONTINUE WHEN (p_fwd AND h < v_h0) OR (NOT p_fwd AND h > v_h0);
    IF h <> v_h0 THEN
      RETURN make_time(h, p_mi[1], p_s[1]);
    END IF;
    FOREACH mi IN ARRAY p_mi LOOP
      CONTINUE WHEN (p_fwd AND mi < v_mi0) OR (NOT p_fwd AND mi > v_mi0);
      IF mi <> v_mi0 THEN
        RETURN make_time(h, mi, p_s[1]);
      END IF;
      FOREACH s IN ARRAY p_s LOOP
        IF (p_fwd AND s >= v_s0) OR (NOT p_fwd AND s <= v_s0) THEN
          RETURN make_time(h, mi, s);
        END IF;
      END LOOP;
    END LOOP;
  END LOOP;
  RETURN NULL;
END $$;
COMMENT ON FUNCTION awp._cron_time(integer[], integer[], integer[], time, boolean) IS 'The first (last) matching time of day at or after (before) a time; NULL when none.';

-- awp._cron_local(parsed, from, forward): the first wall-clock time >= from (forward) or the last
-- <= from (backward), whole seconds, that the parsed expression matches; NULL when there is none
-- within 100 years. Whole months and days that do not match are skipped.
CREATE OR REPLACE FUNCTION awp._cron_local(p jsonb, p_from timestamp, p_fwd boolean) RETURNS timestamp
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_s     integer[] := ARRAY(SELECT jsonb_array_elements_text(p->'second')::integer);
  v_mi    integer[] := ARRAY(SELECT jsonb_array_elements_text(p->'minute')::integer);
  v_h     integer[] := ARRAY(SELECT jsonb_array_elements_text(p->'hour')::integer);
  v_dom   integer[] := ARRAY(SELECT jsonb_array_elements_text(p->'dom')::integer);
  v_month integer[] := ARRAY(SELECT jsonb_array_elements_text(p->'month')::integer);
  v_dow   integer[] := ARRAY(SELECT jsonb_array_elements_text(p->'dow')::integer);
  v_and   boolean := (p->>'dom_star')::boolean OR (p->>'dow_star')::boolean;
  v_d     date := p_from::date;
  v_t     time := date_trunc('second', p_from)::time;
  v_end   date := (p_from + CASE WHEN p_fwd THEN interval '100 years' ELSE interval '-100 years' END)::date;
  v_dm    boolean;
  v_wm    boolean;
  v_hit   time;
BEGIN
  LOOP
    IF (p_fwd AND v_d > v_end) OR (NOT p_fwd AND v_d < v_end) THEN
      RETURN NULL;
    END IF;
    IF NOT extract(month FROM v_d)::integer = ANY (v_month) THEN
      v_d := CASE WHEN p_fwd THEN (date_trunc('month', v_d) + interval '1 month')::date
                  ELSE (date_trunc('month', v_d) - interval '1 day')::date END;
      v_t := CASE WHEN p_fwd THEN time '00:00:00' ELSE time '23:59:59' END;
      CONTINUE;
    END IF;
    v_dm := extract(day FROM v_d)::integer = ANY (v_dom);
    v_wm := extract(dow FROM v_d)::integer = ANY (v_dow);
    IF (v_and AND v_dm AND v_wm) OR (NOT v_and AND (v_dm OR v_wm)) THEN
      v_hit := awp._cron_time(v_h, v_mi, v_s, v_t, p_fwd);
      IF v_hit IS NOT NULL THEN
        RETURN v_d + v_hit;
      END IF;
    END IF;
    v_d := v_d + CASE WHEN p_fwd THEN 1 ELSE -1 END;
    v_t := CASE WHEN p_fwd THEN time '00:00:00' ELSE time '23:59:59' END;
  END LOOP;
END $$;
COMMENT ON FUNCTION awp._cron_local(jsonb, timestamp, boolean) IS 'The first (last) wall-clock time at or after (before) a time that a parsed cron expression matches; NULL when none within 100 years.';

-- ---------------------------------------------------------------- wall clock <-> instants

-- awp._tz_offset(at, tz): the UTC offset of time zone tz at instant at.
CREATE OR REPLACE FUNCTION awp._tz_offset(p_at timestamptz, p_tz text) RETURNS interval
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT (p_at AT TIME ZONE p_tz) - (p_at AT TIME ZONE 'UTC')
$$;
COMMENT ON FUNCTION awp._tz_offset(timestamptz, text) IS 'The UTC offset of a time zone at an instant.';

-- awp._wall_instant(wall, tz): the instant a wall-clock time of zone tz fires at: its only instant; the
-- first of two when the clock went back over it; the instant of the jump when the clock jumped over
-- it. Never decreases as the wall-clock time grows (assumes offset changes at least a day apart).
CREATE OR REPLACE FUNCTION awp._wall_instant(p_wall timestamp, p_tz text) RETURNS timestamptz
LANGUAGE plpgsql STABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_u   timestamptz := p_wall AT TIME ZONE p_tz;   -- PostgreSQL: the later instant of a repeated time;
                                                    -- a skipped time read with the offset before the jump
  v_pre interval := awp._tz_offset(v_u - interval '1 day', p_tz);
  v_u2  timestamptz := (p_wall - v_pre) AT TIME ZONE 'UTC';
  v_lo  timestamptz;
  v_hi  timestamptz;
  v_mid timestamptz;
BEGIN
  IF (v_u AT TIME ZONE p_tz) = p_wall THEN
    IF v_u2 < v_u AND (v_u2 AT TIME ZONE p_tz) = p_wall THEN
      RETURN v_u2;   -- repeated: its first occurrence
    END IF;
    RETURN v_u;
  END IF;
  -- Skipped by a jump forward: the jump happened in (v_u - 1 day, v_u]; find it to the second.
  v_lo := v_u - interval '1 day';
  v_hi := v_u;
  WHILE v_hi - v_lo > interval '1 second' LOOP
    v_mid := v_lo + (v_hi - v_lo) / 2;
    IF awp._tz_offset(v_mid, p_tz) = v_pre THEN
      v_lo := v_mid;
    ELSE
      v_hi := v_mid;
    END IF;
  END LOOP;
  RETURN date_trunc('second', v_hi);
END $$;
COMMENT ON FUNCTION awp._wall_instant(timestamp, text) IS 'The instant a wall-clock time of a time zone fires at (first occurrence; the jump instant for a skipped time).';

-- awp._wall_bound(at, tz): the first whole-second wall-clock time of zone tz whose instant
-- (awp._wall_instant) is after at. Usually the wall-clock reading of at plus what is left of its
-- second; around a clock change, found by bisection (awp._wall_instant never decreases).
CREATE OR REPLACE FUNCTION awp._wall_bound(p_at timestamptz, p_tz text) RETURNS timestamp
LANGUAGE plpgsql STABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_w   timestamp := date_trunc('second', p_at AT TIME ZONE p_tz) + interval '1 second';
  v_lo  timestamp;
  v_hi  timestamp;
  v_mid timestamp;
BEGIN
  IF awp._wall_instant(v_w, p_tz) > p_at AND awp._wall_instant(v_w - interval '1 second', p_tz) <= p_at THEN
    RETURN v_w;
  END IF;
  v_lo := v_w - interval '2 days';   -- instant <= p_at
  v_hi := v_w + interval '2 days';   -- instant > p_at
  WHILE v_hi - v_lo > interval '1 second' LOOP
    v_mid := date_trunc('second', v_lo + (v_hi - v_lo) / 2);
    IF awp._wall_instant(v_mid, p_tz) > p_at THEN
      v_hi := v_mid;
    ELSE
      v_lo := v_mid;
    END IF;
  END LOOP;
  RETURN v_hi;
END $$;
COMMENT ON FUNCTION awp._wall_bound(timestamptz, text) IS 'The first wall-clock second of a time zone whose firing instant is after a given instant.';

-- awp._cron_next(cron, after, tz): the first fire time of a cron expression (text, or parsed by
-- awp._cron_parse) strictly after `after`, in time zone tz; NULL when none within 100 years.
-- awp._cron_prev(cron, at, tz): the last fire time at or before `at`. Take no locks.
CREATE OR REPLACE FUNCTION awp._cron_next(p jsonb, p_after timestamptz, p_tz text DEFAULT 'UTC')
RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT awp._wall_instant(awp._cron_local(p, awp._wall_bound(p_after, p_tz), true), p_tz)
$$;
COMMENT ON FUNCTION awp._cron_next(jsonb, timestamptz, text) IS 'The first fire time of a parsed cron expression after an instant, in a time zone.';

CREATE OR REPLACE FUNCTION awp._cron_next(p_cron text, p_after timestamptz, p_tz text DEFAULT 'UTC')
RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT awp._cron_next(awp._cron_parse(p_cron), p_after, p_tz)
$$;
COMMENT ON FUNCTION awp._cron_next(text, timestamptz, text) IS 'The first fire time of a cron expression after an instant, in a time zone (AWREQ for a bad expression).';

CREATE OR REPLACE FUNCTION awp._cron_prev(p jsonb, p_at timestamptz, p_tz text DEFAULT 'UTC')
RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT awp._wall_instant(awp._cron_local(p, awp._wall_bound(p_at, p_tz) - interval '1 second', false), p_tz)
$$;
COMMENT ON FUNCTION awp._cron_prev(jsonb, timestamptz, text) IS 'The last fire time of a parsed cron expression at or before an instant, in a time zone.';

CREATE OR REPLACE FUNCTION awp._cron_prev(p_cron text, p_at timestamptz, p_tz text DEFAULT 'UTC')
RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT awp._cron_prev(awp._cron_parse(p_cron), p_at, p_tz)
$$;
COMMENT ON FUNCTION awp._cron_prev(text, timestamptz, text) IS 'The last fire time of a cron expression at or before an instant, in a time zone (AWREQ for a bad expression).';

-- ---------------------------------------------------------------- schedules

-- awp._schedule_fire(schedule, at, forward): forward: the schedule's first fire time after `at`;
-- backward: its last fire time at or before `at` (NULL when none). Interval schedules fire at
-- created_at + k * interval_ms, k >= 1. Takes no locks.
CREATE OR REPLACE FUNCTION awp._schedule_fire(s awp.schedules, p_at timestamptz, p_fwd boolean)
RETURNS timestamptz
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_k bigint;
BEGIN
  IF s.interval_ms IS NULL THEN
    IF p_fwd THEN
      RETURN awp._cron_next(awp._cron_parse(s.cron), p_at, s.timezone);
    END IF;
    RETURN awp._cron_prev(awp._cron_parse(s.cron), p_at, s.timezone);
  END IF;
  v_k := floor(extract(epoch FROM (p_at - s.created_at)) * 1000 / s.interval_ms);  -- fires <= p_at: k <= v_k
  IF p_fwd THEN
    RETURN s.created_at + (greatest(v_k, 0) + 1) * s.interval_ms * interval '1 millisecond';
  ELSIF v_k < 1 THEN
    RETURN NULL;
  END IF;
  RETURN s.created_at + v_k * s.interval_ms * interval '1 millisecond';
END $$;
COMMENT ON FUNCTION awp._schedule_fire(awp.schedules, timestamptz, boolean) IS 'A schedule''s first fire time after (forward) or last at or before (backward) an instant.';

-- awp.create_schedule(schedule_id, workflow_id, cron, interval_ms, input, timezone): a schedule that
-- starts a run of the workflow's latest version (at fire time) with `input` at every fire time.
-- Exactly one of cron (5 fields, or 6 with seconds first) and interval_ms (>= 1000); timezone a name of
-- pg_timezone_names (matched case-insensitively, stored as listed); input a JSON object <= 64 KiB.
-- The first fire time is the first one after now. Creating an existing schedule_id with the same
-- definition (workflow, cron, interval, input, time zone) returns the existing schedule unchanged; with
-- another definition it is AWREQ (delete it first). AWREQ for bad arguments, AWNTF for an unknown
-- workflow. Returns the schedule.
-- Locks: the new schedule row (the primary key serialises two creates of one id).
CREATE OR REPLACE FUNCTION awp.create_schedule(schedule_id text, workflow_id text, cron text DEFAULT NULL,
                                               interval_ms integer DEFAULT NULL, input jsonb DEFAULT NULL,
                                               timezone text DEFAULT 'UTC')
RETURNS SETOF awp.schedules
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_id     text := schedule_id;
  v_wf     text := workflow_id;
  v_given  text := cron;
  v_iv     integer := interval_ms;
  v_zone   text := timezone;
  v_input  jsonb := coalesce(input, '{}'::jsonb);
  v_cron   text := nullif(btrim(regexp_replace(cron, '\s+', ' ', 'g')), '');
  v_now    timestamptz := awp._now();
  v_parsed jsonb;
  v_tz     text;
  v_next   timestamptz;
  e        awp.schedules;
BEGIN
  IF v_id IS NULL OR v_id !~ '^[A-Za-z0-9._-]{1,128}$' THEN
    PERFORM awp._raise_invalid_request('invalid schedule id', 'schedule_id must be a string of 1-128 characters from [A-Za-z0-9._-]');
  END IF;
  IF v_wf IS NULL OR v_wf = '' THEN
    PERFORM awp._raise_invalid_request('invalid workflow id', 'workflow_id is required');
  END IF;
  IF (v_given IS NULL) = (v_iv IS NULL) THEN
    PERFORM awp._raise_invalid_request('invalid schedule', 'give exactly one of cron and interval_ms');
  END IF;
  IF v_iv < 1000 THEN
    PERFORM awp._raise_invalid_request('invalid schedule', format('interval_ms must be at least 1000 (got %s)', v_iv));
  END IF;
  IF v_given IS NOT NULL THEN
    v_parsed := awp._cron_parse(v_cron);
  END IF;
  IF v_zone IS NOT NULL AND length(v_zone) <= 128 THEN
    SELECT z.name INTO v_tz FROM pg_catalog.pg_timezone_names z
     WHERE lower(z.name) = lower(v_zone) ORDER BY z.name = v_zone DESC, z.name LIMIT 1;
  END IF;
  IF v_tz IS NULL THEN
    PERFORM awp._raise_invalid_request('invalid time zone',
      format('timezone %s is not a time zone name (see pg_timezone_names), e.g. UTC or Europe/Berlin',
             coalesce(quote_literal(v_zone), 'null')));
  END IF;
  PERFORM awp._check_input(v_input, 'schedule input');
  IF NOT EXISTS (SELECT 1 FROM awp.workflows w WHERE w.workflow_id = v_wf) THEN
    PERFORM awp._raise_not_found('workflow not found', format('no workflow %s', v_wf));
  END IF;

  IF v_parsed IS NOT NULL THEN
    v_next := awp._cron_next(v_parsed, v_now, v_tz);
    IF v_next IS NULL THEN
      PERFORM awp._raise_invalid_request('invalid cron expression',
        format('the expression %s never fires in the next 100 years', v_cron));
    END IF;
  ELSE
    v_next := v_now + v_iv * interval '1 millisecond';
  END IF;

  INSERT INTO awp.schedules AS s (schedule_id, workflow_id, cron, interval_ms, input, timezone, next_fire_at, created_at)
  VALUES (v_id, v_wf, v_cron, v_iv, v_input, v_tz, v_next, v_now)
  ON CONFLICT ON CONSTRAINT schedules_pkey DO NOTHING;
  IF NOT FOUND THEN
    SELECT * INTO e FROM awp.schedules s WHERE s.schedule_id = v_id;
    IF (e.workflow_id, e.cron, e.interval_ms, e.input, e.timezone) IS DISTINCT FROM (v_wf, v_cron, v_iv, v_input, v_tz) THEN
      PERFORM awp._raise_invalid_request('schedule exists',
        format('schedule %s exists with another definition; delete it first to replace it', v_id));
    END IF;
  END IF;
  RETURN QUERY SELECT * FROM awp.schedules s WHERE s.schedule_id = v_id;
END $$;
COMMENT ON FUNCTION awp.create_schedule(text, text, text, integer, jsonb, text) IS 'Creates a schedule (cron or interval_ms) that starts runs of a workflow; the same definition again returns it, another is AWREQ; AWNTF for an unknown workflow.';

-- awp.delete_schedule(schedule_id): deletes a schedule (its runs keep their schedule_id) and returns
-- it as it was. AWNTF when unknown.
-- Locks: the schedule row (waits for a coordinator pass firing it to commit).
CREATE OR REPLACE FUNCTION awp.delete_schedule(schedule_id text)
RETURNS SETOF awp.schedules
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_id text := schedule_id;
BEGIN
  RETURN QUERY DELETE FROM awp.schedules s WHERE s.schedule_id = v_id RETURNING s.*;
  IF NOT FOUND THEN
    PERFORM awp._raise_not_found('schedule not found', format('no schedule %s', v_id));
  END IF;
END $$;
COMMENT ON FUNCTION awp.delete_schedule(text) IS 'Deletes a schedule and returns it; AWNTF when unknown.';

-- awp.list_schedules(after_schedule_id, limit): the schedules by schedule_id (columns: schedule_id,
-- workflow_id, cron, interval_ms, input, timezone, next_fire_at, last_fired_at, last_run_id, created_at);
-- page on with the schedule_id of the last row; no arguments: every schedule. last_run_id may name a run
-- that retention pruned since (docs/retention.md). Limit 1-1000 (AWREQ otherwise). Locks: none (reads).
CREATE OR REPLACE FUNCTION awp.list_schedules(p_after text DEFAULT NULL, p_limit integer DEFAULT NULL)
RETURNS SETOF awp.schedules
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM awp._check_page(p_limit);
  RETURN QUERY SELECT * FROM awp.schedules s WHERE p_after IS NULL OR s.schedule_id > p_after
                ORDER BY s.schedule_id LIMIT p_limit;
END $$;
COMMENT ON FUNCTION awp.list_schedules(text, integer) IS 'The schedules with their next and last fire times, by id, keyset-paged.';

-- awp.fire_schedules(): starts one run for each due schedule (next_fire_at <= now), exactly once per
-- fire time: only the LATEST due fire time is started (fire times missed while no coordinator ran are
-- not made up), with the schedule's input, the workflow's latest version, and the idempotency key
-- schedule:<schedule_id>:<fire time in epoch ms> (a second guard: a key already used starts nothing).
-- next_fire_at then becomes the first fire time after now. A schedule whose workflow is gone (or whose
-- run cannot start: AWNTF, AWREQ, AWIDM) skips that fire time with a WARNING; any other error leaves
-- the schedule due for the next pass. Never fails the caller's transaction for one schedule.
-- Returns the number of runs started.
-- Locks: due schedule rows FOR UPDATE SKIP LOCKED (a concurrent pass skips them; next_fire_at is
-- re-checked under the lock), then per run as awp.start_run.
CREATE OR REPLACE FUNCTION awp.fire_schedules() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now   timestamptz := awp._now();
  v_id    text;
  s       awp.schedules;
  v_fire  timestamptz;
  v_next  timestamptz;
  v_key   text;
  v_run   text;
  v_state text;
  v_msg   text;
  v_n     integer := 0;
BEGIN
  FOR v_id IN
    SELECT x.schedule_id FROM awp.schedules x
     WHERE x.next_fire_at <= v_now
     ORDER BY x.next_fire_at, x.schedule_id
       FOR UPDATE SKIP LOCKED
  LOOP
    SELECT * INTO s FROM awp.schedules x WHERE x.schedule_id = v_id;
    CONTINUE WHEN NOT FOUND OR s.next_fire_at > v_now;   -- fired by a pass that committed meanwhile
    v_fire := greatest(s.next_fire_at, awp._schedule_fire(s, v_now, false));
    v_next := coalesce(awp._schedule_fire(s, v_now, true), 'infinity');
    v_key := format('schedule:%s:%s', s.schedule_id, floor(extract(epoch FROM v_fire) * 1000)::bigint);
    v_run := NULL;
    BEGIN
      SELECT r.run_id INTO v_run FROM awp.runs r WHERE r.workflow_id = s.workflow_id AND r.idempotency_key = v_key;
      IF v_run IS NULL THEN
        v_run := awp._start_run(s.workflow_id, NULL, v_key, s.input, s.schedule_id);
        v_n := v_n + 1;
      END IF;
    EXCEPTION
      WHEN SQLSTATE 'AWNTF' OR SQLSTATE 'AWREQ' OR SQLSTATE 'AWIDM' THEN
        GET STACKED DIAGNOSTICS v_msg = MESSAGE_TEXT;
        RAISE WARNING 'schedule %: fire time % skipped: %', s.schedule_id, v_fire, v_msg;
        v_run := NULL;
      WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
        RAISE WARNING 'schedule %: fire time % not started (%: %); retried by the next pass',
          s.schedule_id, v_fire, v_state, v_msg;
        CONTINUE;
    END;
    UPDATE awp.schedules x
       SET next_fire_at = v_next,
           last_fired_at = CASE WHEN v_run IS NULL THEN x.last_fired_at ELSE v_fire END,
           last_run_id = coalesce(v_run, x.last_run_id)
     WHERE x.schedule_id = s.schedule_id;
  END LOOP;
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp.fire_schedules() IS 'Starts one run per due schedule (the latest due fire time only, exactly once per fire time); returns the number of runs started.';
