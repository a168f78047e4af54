// AWP dashboard: the only script, no library, no build step. Progressive enhancement of server-rendered pages:
// live tables (runs, workers), the live run page (DAG statuses, summary, events), the task panel.
(() => {
  "use strict";
  const $ = (selector, root = document) => root.querySelector(selector);
  const TERMINAL = ["succeeded", "failed", "canceled"];
  // An instance of a mapped (for_each) task: "<key>[<index>]" (a task's own key cannot end so: docs/dynamic.md).
  const INSTANCE = /^(.*)\[(\d+)\]$/;
  // Why a task was skipped, in words (SKIP_REASONS in python/awp/server/ui/render.py).
  const SKIP_WORDS = { condition_false: "condition false", dependency_failed: "dependency failed" };
  const SVG = "http://www.w3.org/2000/svg";

  function statusText(status, skipReason) {
    const words = status.replace(/_/g, " ");
    if (status !== "skipped" || !skipReason) return words;
    return `${words} (${SKIP_WORDS[skipReason] || skipReason.replace(/_/g, " ")})`;
  }

  function signedOut() {
    location.assign("/ui/?next=" + encodeURIComponent(location.pathname + location.search));
  }

  function setLiveState(text, on) {
    const el = $("#live-state");
    if (!el) return;
    el.textContent = text;
    el.classList.toggle("on", !!on);
  }

  // Replace the content of `el`, keeping the keyboard focus on the "same" element (by id, href or name).
  function swap(el, html) {
    const active = document.activeElement;
    let selector = null;
    if (active && el.contains(active)) {
      if (active.id) selector = "#" + CSS.escape(active.id);
      else if (active.getAttribute("href")) selector = `[href="${CSS.escape(active.getAttribute("href"))}"]`;
      else if (active.name) selector = `[name="${CSS.escape(active.name)}"]`;
    }
    el.innerHTML = html;
    if (selector) {
      const again = el.querySelector(selector);
      if (again) again.focus({ preventScroll: true });
    }
  }

  // ---- live tables: re-fetch ?fragment=1 (ETag) every few seconds ---------------------------------------
  const live = $("#live[data-live]");
  if (live) {
    const period = Number(live.dataset.live) || 2000;
    let etag = null;
    const refresh = async () => {
      if (!document.hidden) {
        try {
          const url = new URL(location.href);
          url.searchParams.set("fragment", "1");
          const response = await fetch(url, {
            headers: etag ? { "If-None-Match": etag } : {},
            cache: "no-store",
            credentials: "same-origin",
          });
          if (response.status === 401) return signedOut();
          if (response.status === 200) {
            etag = response.headers.get("ETag");
            swap(live, await response.text());
          }
        } catch (err) {
          // the gateway is unreachable for now: try again next period
        }
      }
      setTimeout(refresh, period);
    };
    setTimeout(refresh, period);
  }

  // ---- the run page -------------------------------------------------------------------------------------
  const stateEl = $("#run-state");
  if (stateEl) runPage(JSON.parse(stateEl.textContent));

  function runPage(st) {
    const runPath = "/ui/runs/" + encodeURIComponent(st.run_id);
    const nodes = new Map();
    document.querySelectorAll("#dag [data-task-key]").forEach((n) => nodes.set(n.dataset.taskKey, n));
    const panel = $("#task-panel");
    const events = $("#events");
    let revision = st.revision;
    let after = st.after;
    let openKey = new URL(location.href).searchParams.get("task");
    let openPage = Number(new URL(location.href).searchParams.get("ipage")) || 1; // of the open task's instances
    let opener = null;
    const waitText = new Map(); // what holds each waiting task, when the last answer said

    // mapped tasks: their instances are no nodes; per mapped task, each instance's last known status by index (from
    // the page's state, then from the events), which its node's badge counts ("succeeded/instances")
    const instances = new Map();
    Object.entries(st.mapped || {}).forEach(([key, codes]) => {
      instances.set(key, Array.from(codes, (c) => st.statuses[parseInt(c, 36)] || "unknown"));
    });
    // a mapped task whose list was empty has no instance: its badge says 0/0
    nodes.forEach((node, key) => {
      if (node.classList.contains("mapped") && !instances.has(key)) instances.set(key, []);
    });
    const mappedOf = (key) => {
      const m = key && INSTANCE.exec(key);
      return m ? m[1] : null;
    };

    // overview of a large run: each task's box and last known status, and the counts of each box
    const bandOf = new Map();
    const known = new Map();
    const bandCounts = [];
    const bands = [];
    if (st.bands) {
      st.bands.forEach((keys, i) => {
        const codes = st.band_status[i];
        const counts = {};
        keys.forEach((k, j) => {
          const status = st.statuses[parseInt(codes[j], 36)] || "unknown";
          bandOf.set(k, i);
          known.set(k, status);
          counts[status] = (counts[status] || 0) + 1;
        });
        bandCounts[i] = counts;
      });
      document.querySelectorAll("#overview [data-band]").forEach((box) => (bands[Number(box.dataset.band)] = box));
    }

    function instanceCount(key) {
      const list = instances.get(key);
      if (!list) return null;
      let ok = 0;
      for (const s of list) if (s === "succeeded") ok++;
      return { ok, total: list.length };
    }

    function setNodeStatus(node, status) {
      node.dataset.status = status;
      if (status !== "skipped") delete node.dataset.skipReason;
      const key = node.dataset.taskKey;
      const words = statusText(status, node.dataset.skipReason);
      const wait = waitText.get(key);
      const n = node.classList.contains("mapped") ? instanceCount(key) : null;
      node.setAttribute("aria-label", `${key}: ${words}` + (n ? `, ${n.ok} of ${n.total} instances succeeded` : ""));
      const glyph = node.querySelector(".glyph");
      if (glyph) glyph.textContent = st.glyph[status] || "?";
      const title = node.querySelector("title");
      if (title) {
        title.textContent =
          `${key} · ${words}` + (n ? ` · ${n.ok}/${n.total} instances succeeded` : "") + (wait ? ` — ${wait}` : "");
      }
    }

    // a mapped task's count on its node: "succeeded/instances", added when its instances appear while the page is open
    function setBadge(node) {
      const key = node.dataset.taskKey;
      const n = instanceCount(key);
      if (!n) return;
      const text = `${n.ok}/${n.total}`;
      let badge = node.querySelector(".badge");
      if (!badge) {
        const rect = node.querySelector("rect");
        badge = document.createElementNS(SVG, "text");
        badge.setAttribute("class", "badge");
        badge.setAttribute("x", String(Number(rect.getAttribute("x")) + Number(rect.getAttribute("width")) - 7));
        badge.setAttribute("y", String(Number(rect.getAttribute("y")) + 18));
        badge.setAttribute("text-anchor", "end");
        badge.setAttribute("aria-hidden", "true");
        node.appendChild(badge);
        node.classList.add("mapped");
      }
      if (badge.dataset.instances !== text) {
        badge.dataset.instances = text;
        badge.textContent = text;
        // the key beside it: as many characters as label_room in python/awp/server/ui/dag.py leaves
        const room = Math.max(4, Math.floor((113 - 7 * (2 * String(n.total).length + 1)) / 7.5));
        const label = node.querySelector(".label");
        if (label) label.textContent = key.length > room ? key.slice(0, room - 1) + "…" : key;
        setNodeStatus(node, node.dataset.status);
      }
    }

    // the open task panel's count line of a mapped task's instances
    function setPanelCount(key) {
      const n = instanceCount(key);
      const line = panel.querySelector(`[data-instance-count="${CSS.escape(key)}"]`);
      if (n && line) line.textContent = `${n.ok} of ${n.total} succeeded`;
    }

    // what holds each waiting task ("reason: detail"), when the answer carries it: every node's title
    function setWaits(waits) {
      waitText.clear();
      nodes.forEach((node, key) => {
        if (waits[key]) waitText.set(key, waits[key]);
        setNodeStatus(node, node.dataset.status);
      });
    }

    function redrawBand(i) {
      const box = bands[i];
      const counts = bandCounts[i];
      if (!box) return;
      const bar = box.querySelector(".band-bar");
      const width = Number(bar.dataset.width);
      let total = 0;
      for (const n of Object.values(counts)) total += n;
      let x = 0;
      bar.querySelectorAll(".seg").forEach((seg) => {
        const n = counts[seg.dataset.status] || 0;
        const w = total ? (width * n) / total : 0;
        seg.setAttribute("x", String(Number(seg.dataset.x0) + x));
        seg.setAttribute("width", String(w));
        seg.dataset.n = String(n);
        x += w;
      });
      const done = ["succeeded", "failed", "canceled", "skipped"].reduce((a, s) => a + (counts[s] || 0), 0);
      const text = box.querySelector(".band-count");
      text.textContent = `${done}/${text.dataset.total} done`;
    }

    function eventRow(e) {
      const tr = document.createElement("tr");
      tr.dataset.sequence = e.sequence;
      tr.className = "new";
      const cell = (text, cls) => {
        const td = document.createElement("td");
        if (cls) td.className = cls;
        if (text !== null) td.textContent = text;
        tr.appendChild(td);
        return td;
      };
      cell(String(e.sequence), "num");
      const time = document.createElement("time");
      time.dateTime = e.at;
      time.title = e.at;
      time.textContent = e.time;
      cell(null).appendChild(time);
      const entity = cell(null);
      const type = document.createElement("span");
      type.className = "muted";
      type.textContent = e.entity_type + " ";
      const key = document.createElement("span");
      key.className = "mono";
      key.textContent = e.entity_key;
      entity.append(type, key);
      const change = cell(`${e.from_status || "created"} → `);
      const to = document.createElement("b");
      to.textContent = e.to_status;
      change.appendChild(to);
      cell(e.reason);
      return tr;
    }

    function apply(list) {
      const dirty = new Set();
      const counted = new Set(); // mapped tasks whose instances changed
      let panelStale = false;
      for (const e of list) {
        if (e.entity_type === "task") {
          const node = nodes.get(e.entity_key);
          if (node) {
            if (e.to_status === "skipped") {
              node.dataset.skipReason = e.reason === "condition_false" ? "condition_false" : "dependency_failed";
            }
            waitText.delete(e.entity_key);
            setNodeStatus(node, e.to_status);
          }
          const mapped = mappedOf(e.entity_key);
          if (mapped !== null) {
            const index = Number(INSTANCE.exec(e.entity_key)[2]);
            if (!instances.has(mapped)) instances.set(mapped, []);
            instances.get(mapped)[index] = e.to_status;
            counted.add(mapped);
            // the open panel lists this instance: show its new status
            if (mapped === openKey && Math.floor(index / st.instances_page) + 1 === openPage) panelStale = true;
          }
          const b = bandOf.get(e.entity_key);
          const was = known.get(e.entity_key);
          if (b !== undefined && was !== e.to_status) {
            // from the last known status, not the event's from_status: a change the page already shows
            // (made between the page's reads) is then not counted twice
            const c = bandCounts[b];
            c[was] = Math.max(0, (c[was] || 0) - 1);
            c[e.to_status] = (c[e.to_status] || 0) + 1;
            known.set(e.entity_key, e.to_status);
            dirty.add(b);
          }
        }
        if (openKey && (e.entity_key === openKey || e.entity_key.startsWith(openKey + "#"))) panelStale = true;
      }
      dirty.forEach(redrawBand);
      counted.forEach((key) => {
        const node = nodes.get(key);
        if (node) setBadge(node);
        setPanelCount(key);
      });
      const tail = list.slice(-st.timeline);
      const rows = document.createDocumentFragment();
      for (let i = tail.length - 1; i >= 0; i--) rows.appendChild(eventRow(tail[i]));
      events.insertBefore(rows, events.firstChild);
      while (events.rows.length > st.timeline) events.deleteRow(-1);
      if (panelStale) loadTask(openKey, false);
    }

    async function poll() {
      let delay = 500;
      if (document.hidden) {
        delay = 2000;
      } else {
        try {
          const url = `${runPath}/changes?revision=${revision}&after=${after}`;
          const response = await fetch(url, { cache: "no-store", credentials: "same-origin" });
          if (response.status === 401) return signedOut();
          if (!response.ok) {
            setLiveState(`updates failed (HTTP ${response.status}); retrying`, false);
            delay = 3000;
          } else {
            const c = await response.json();
            if (!c.unchanged) {
              apply(c.events);
              after = c.after;
              if (c.waits) setWaits(c.waits);
              if (c.summary !== undefined) swapSummary(c.summary);
              if (c.more) delay = 0;
              else revision = c.revision;
            }
            const done = TERMINAL.includes(c.status);
            setLiveState(done ? `${c.status} · revision ${c.revision}` : "live", !done);
            if (done && c.unchanged) delay = 5000;
          }
        } catch (err) {
          setLiveState("connection lost; retrying", false);
          delay = 3000;
        }
      }
      setTimeout(poll, delay);
    }
    setLiveState("live", true);
    setTimeout(poll, 300);

    // ---- the task panel ---------------------------------------------------------------------------------
    // the node of a task, or of its mapped task for an instance (which has none)
    const nodeOf = (key) => nodes.get(key) || nodes.get(mappedOf(key));

    function selectNode(key) {
      const node = key ? nodeOf(key) : null;
      nodes.forEach((n) => n.classList.toggle("selected", n === node));
    }

    function setTaskParam(key, page) {
      const url = new URL(location.href);
      if (key) url.searchParams.set("task", key);
      else url.searchParams.delete("task");
      if (key && page > 1) url.searchParams.set("ipage", String(page));
      else url.searchParams.delete("ipage");
      // a signal's confirmation step or outcome (views.signal_view) belongs to the panel it was shown in
      ["confirm", "sent", "refused"].forEach((name) => url.searchParams.delete(name));
      history.replaceState(null, "", url);
    }

    // focus: "#task-h" (a task opened), "#instances-h" (another page of its instances) or null (a refresh)
    async function loadTask(key, focus) {
      const page = openPage;
      try {
        const query = page > 1 ? `?ipage=${page}` : "";
        const response = await fetch(`${runPath}/tasks/${encodeURIComponent(key)}${query}`, {
          cache: "no-store",
          credentials: "same-origin",
        });
        if (response.status === 401) return signedOut();
        if (!response.ok || key !== openKey || page !== openPage) return;
        const html = await response.text();
        // a refresh keeps the notice of a signal just sent from this panel (the refreshed panel has none)
        const notice = focus ? null : panel.querySelector(`[data-signal-for="${CSS.escape(key)}"]`);
        panel.innerHTML = html;
        const head = $(".drawer-head", panel);
        if (notice && head && !$("[data-signal-notice]", panel)) head.after(notice);
        panel.hidden = false;
        startLogTail();
        if (focus) {
          const heading = $(focus, panel) || $("#task-h", panel);
          if (heading) heading.focus();
        }
      } catch (err) {
        // keep what is shown; the next change retries
      }
    }

    // page: of a mapped task's instances (1 when not given)
    function openTask(key, from, page) {
      const paging = key === openKey && !panel.hidden && page > 0;
      openKey = key;
      openPage = page || 1;
      if (!paging) opener = from || nodes.get(key) || null; // paging keeps what opened the task
      selectNode(key);
      setTaskParam(key, openPage);
      loadTask(key, paging ? "#instances-h" : "#task-h");
    }

    function closeTask() {
      const key = openKey;
      openKey = null;
      panel.hidden = true;
      selectNode(null);
      setTaskParam(null);
      // what opened it; a link in the panel is gone: the task's node then (its mapped task's for an instance)
      const back = opener && document.contains(opener) ? opener : nodeOf(key);
      if (back) back.focus();
      opener = null;
    }

    if (openKey) selectNode(openKey);

    // ---- the task panel's live output (docs/progress.md; templates/_task.html, views.task_logs_part) ----------
    // The log tail of the open task's latest attempt and its latest progress: read from the start when the panel
    // is (re)drawn, then every 500 ms while the task runs; at most LOG_TAIL lines are kept on the page.
    // A redrawn panel of the same task (a refresh at a change of the run) goes on from the lines already shown, so
    // the tail never blinks empty while it is read again.
    const LOG_TAIL = 500;
    let tailRun = 0; // the panel drawing the current tail belongs to; an older loop stops
    let shown = null; // what the tail shows: {key, attempt, after, text}
    function startLogTail() {
      const box = $("[data-live-output]", panel);
      if (!box) return;
      const mine = ++tailRun;
      const tail = $("[data-log-tail]", box);
      const empty = $("[data-log-empty]", box);
      const progress = $("[data-progress]", box);
      const key = box.dataset.liveOutput;
      let after = 0;
      let attempt = null;
      if (shown && shown.key === key) {
        ({ after, attempt } = shown);
        tail.textContent = shown.text;
        tail.scrollTop = tail.scrollHeight;
        empty.hidden = shown.text.length > 0;
      }
      let running = box.dataset.running === "yes";
      async function step() {
        if (mine !== tailRun || !document.contains(box)) return;
        let delay = 500;
        try {
          const url = `${runPath}/tasks/${encodeURIComponent(key)}/logs?after=${after}`;
          const response = await fetch(url, { cache: "no-store", credentials: "same-origin" });
          if (response.status === 401) return signedOut();
          if (response.ok) {
            const page = await response.json();
            if (mine !== tailRun) return;
            if (attempt !== null && page.attempt !== attempt) tail.textContent = ""; // a new attempt: its own tail
            attempt = page.attempt;
            let text = "";
            for (const item of page.items) text += item.kind === "log" ? `${item.text}\n` : item.text;
            if (text) {
              tail.textContent += text;
              const lines = tail.textContent.split("\n");
              if (lines.length > LOG_TAIL) tail.textContent = lines.slice(-LOG_TAIL).join("\n");
              tail.scrollTop = tail.scrollHeight;
            }
            empty.hidden = tail.textContent.length > 0;
            if (page.progress !== null && page.progress !== undefined) {
              progress.textContent = JSON.stringify(page.progress);
              progress.hidden = false;
            }
            after = page.next_after;
            shown = { key, attempt, after, text: tail.textContent };
            running = page.task_status === "running";
            if (page.more) delay = 0;
          }
        } catch (err) {
          delay = 3000;
        }
        if (running || delay === 0) setTimeout(step, document.hidden ? 2000 : delay);
      }
      step();
    }
    startLogTail();

    // ---- Approve / Reject of a task waiting for a signal (templates/_task.html, views.signal_task) -----------
    // The first step only asks: it is shown in place, nothing is posted. The second posts its form with
    // fragment=1 and shows the panel the gateway answers with (its notice says whether the signal was sent).
    function signalStep(box, name, from) {
      box.querySelectorAll("[data-signal-form]").forEach((form) => {
        form.hidden = name ? form.dataset.signalStep !== name : form.dataset.signalForm !== "choose";
        const error = $("[data-signal-error]", form);
        if (error) error.remove();
      });
      const target = name
        ? $(`[data-signal-step="${CSS.escape(name)}"] .signal-question`, box)
        : $(`[data-signal="${CSS.escape(from || "approve")}"]`, box);
      if (target) target.focus();
    }

    function signalError(form, text) {
      let error = $("[data-signal-error]", form);
      if (!error) {
        error = document.createElement("p");
        error.className = "alert";
        error.setAttribute("role", "alert");
        error.dataset.signalError = "";
        form.insertBefore(error, form.firstChild);
      }
      error.textContent = text;
      form.querySelectorAll("button").forEach((b) => (b.disabled = false));
      delete form.dataset.busy;
    }

    panel.addEventListener("submit", async (event) => {
      const form = event.target;
      const box = form.closest("[data-signal-box]");
      if (!box) return;
      event.preventDefault();
      if (form.dataset.signalForm === "choose") {
        const name = event.submitter ? event.submitter.value : "";
        if (name) signalStep(box, name);
        return;
      }
      if (form.dataset.busy) return; // sent already: a second click waits for the answer
      form.dataset.busy = "1";
      form.querySelectorAll("button").forEach((b) => (b.disabled = true));
      const key = openKey;
      const body = new URLSearchParams(new FormData(form));
      body.set("fragment", "1");
      try {
        const response = await fetch(form.action, {
          method: "POST",
          body,
          cache: "no-store",
          credentials: "same-origin",
        });
        if (response.status === 401) return signedOut();
        const html = await response.text();
        if (response.ok) {
          if (key !== openKey) return; // another task was opened meanwhile
          panel.innerHTML = html;
          const notice = $("[data-signal-notice]", panel) || $("#task-h", panel);
          if (notice) notice.focus();
          return;
        }
        // refused before anything was sent (views.signal_task): the error page's message
        const alert = new DOMParser().parseFromString(html, "text/html").querySelector("[role=alert]");
        signalError(form, `Not sent (HTTP ${response.status}): ${alert ? alert.textContent : response.statusText}`);
      } catch (err) {
        signalError(form, "No answer from the gateway: reload the page to see whether the signal arrived.");
      }
    });

    panel.addEventListener("click", (event) => {
      // the second click of a double click on Approve or Reject lands on the confirmation's button, shown under
      // the pointer by the first: it confirms nothing
      const confirm = event.target.closest ? event.target.closest("[data-signal-confirm]") : null;
      if (confirm && event.detail > 1) {
        event.preventDefault();
        return;
      }
      if (event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey) return;
      const back = event.target.closest ? event.target.closest("[data-signal-back]") : null;
      if (!back) return;
      event.preventDefault(); // the document's handler below then leaves it alone
      signalStep(back.closest("[data-signal-box]"), null, back.closest("[data-signal-form]").dataset.signalStep);
    });

    // ---- Re-run of a failed or canceled run, Cancel of a live one (templates/_run_summary.html, views.retry_run,
    // views.cancel_run) -------------------------------------------------------------------------------------
    // As Approve / Reject: the first step only asks, shown in place. The second posts its form as is (the gateway
    // answers with the run page: running again, being canceled, or with a notice when the run can no longer be
    // re-run). Each box is [data-<kind>-box] with its forms [data-<kind>-form="choose"|"confirm"].
    const summary = $("#summary");
    const STEPS = ["rerun", "cancel"];
    const kindOf = (box) => STEPS.find((kind) => box.hasAttribute(`data-${kind}-box`));
    function step(box, kind, confirm, focus = true) {
      box.querySelectorAll(`[data-${kind}-form]`).forEach((form) => {
        form.hidden = (form.getAttribute(`data-${kind}-form`) === "confirm") !== confirm;
      });
      const target = confirm ? $(`.${kind}-question`, box) : $(`[data-${kind}]`, box);
      if (target && focus) target.focus();
      const url = new URL(location.href);
      if (url.searchParams.has(kind)) {
        url.searchParams.delete(kind);
        history.replaceState(null, "", url);
      }
    }

    // the summary is redrawn at every change of a live run: a confirmation step open in it stays open
    function swapSummary(html) {
      const open = STEPS.filter((kind) => $(`[data-${kind}-form="confirm"]:not([hidden])`, summary));
      const active = document.activeElement;
      const focused = STEPS.flatMap((kind) => [`.${kind}-question`, `[data-${kind}-confirm]`, `[data-${kind}-back]`])
        .find((selector) => active && summary.contains(active) && active.matches(selector));
      swap(summary, html);
      open.forEach((kind) => {
        const box = $(`[data-${kind}-box]`, summary);
        if (box) step(box, kind, true, false);
      });
      const again = focused ? $(focused, summary) : null;
      if (again && again.offsetParent !== null) again.focus({ preventScroll: true });
    }

    summary.addEventListener("submit", (event) => {
      const form = event.target;
      const box = form.closest("[data-rerun-box], [data-cancel-box]");
      if (!box) return;
      const kind = kindOf(box);
      if (form.getAttribute(`data-${kind}-form`) === "choose") {
        event.preventDefault();
        step(box, kind, true);
      } else if (form.dataset.busy) {
        event.preventDefault(); // posted already: the page is on its way
      } else {
        form.dataset.busy = "1";
      }
    });

    summary.addEventListener("click", (event) => {
      if (!event.target.closest) return;
      // the second click of a double click on Re-run or Cancel lands on the confirmation's button: it confirms nothing
      const confirm = event.target.closest("[data-rerun-confirm], [data-cancel-confirm]");
      if (confirm && event.detail > 1) {
        event.preventDefault();
        return;
      }
      if (event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey) return;
      const back = event.target.closest("[data-rerun-back], [data-cancel-back]");
      if (!back) return;
      event.preventDefault();
      const box = back.closest("[data-rerun-box], [data-cancel-box]");
      step(box, kindOf(box), false);
    });

    document.addEventListener("click", (event) => {
      if (event.defaultPrevented || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey) return;
      const target = event.target.closest ? event.target.closest("[data-task-key], [data-task-link], [data-close]") : null;
      if (!target) return;
      event.preventDefault();
      if (target.hasAttribute("data-close")) closeTask();
      else {
        const key = target.dataset.taskKey || target.dataset.taskLink;
        openTask(key, nodes.get(target.dataset.taskKey) || target, Number(target.dataset.ipage) || 0);
      }
    });

    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && openKey) closeTask();
      // Space activates a task like Enter does (SVG links only answer Enter by themselves)
      if (event.key === " " && event.target.dataset && event.target.dataset.taskKey) {
        event.preventDefault();
        openTask(event.target.dataset.taskKey, event.target);
      }
    });
  }
})();
