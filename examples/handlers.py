"""Example handlers for the ``python`` executor: ``awp worker --executor python --handlers examples/handlers.py``.

A handler is a sync or async function ``(input, ctx)`` registered under an action name. Its return value
(any JSON) is the task's output; ``PermanentError`` fails the task for good; any other exception is a
temporary failure, retried while attempts remain.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from awp.handlers import Context, PermanentError, handler


@handler("summarize")
async def summarize(input: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Pretend to summarise the partitions; deterministic, and safe to repeat (keyed by ctx.idempotency_key)."""
    partitions = input.get("partitions", [])
    if not isinstance(partitions, list):
        raise PermanentError("partitions must be a list", error_code="bad_input")
    await asyncio.sleep(min(float(input.get("sleep_ms", 200)) / 1000.0, max(ctx.remaining() - 0.1, 0)))
    digest = hashlib.sha256(ctx.idempotency_key.encode()).hexdigest()[:12]
    return {
        "partitions": len(partitions),
        "summary": f"{len(partitions)} partitions summarised",
        "idempotency_key": ctx.idempotency_key,
        "digest": digest,
        "attempt": ctx.attempt,
        "fencing_token": ctx.fencing_token,
        "batch": ctx.run_input.get("batch"),  # the run's input
        "inputs_from": sorted(ctx.upstream),  # the keys of the tasks this one depends on
    }


@handler("word-count")
def word_count(input: dict[str, Any], ctx: Context) -> dict[str, int]:
    """A sync handler (it runs in a thread): counts the words of input["text"]."""
    text = input.get("text")
    if not isinstance(text, str):
        raise PermanentError("input.text must be a string", error_code="bad_input")
    return {"words": len(text.split())}


@handler("merge-counts")
def merge_counts(input: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """A fan-in: adds up the ``words`` of every upstream task's output (ctx.upstream maps each dependency's key
    to its output) and tags the total with the run's input ``label`` (ctx.run_input)."""
    counts = {key: out.get("words", 0) for key, out in ctx.upstream.items() if isinstance(out, dict)}
    return {"label": ctx.run_input.get("label"), "by_task": counts, "total": sum(counts.values())}


# ---- the dynamic example (examples/demo-dynamic.yaml, docs/dynamic.md) ----------------------------------------


@handler("chunk")
def chunk(input: dict[str, Any], ctx: Context) -> list[str]:
    """Splits the run input's ``document`` into chunks of ``words_per_chunk`` words: the list a for_each maps over."""
    document = ctx.run_input.get("document")
    if not isinstance(document, str) or not document.strip():
        raise PermanentError("the run input needs a non-empty string document", error_code="bad_input")
    size = int(input.get("words_per_chunk", 40))
    words = document.split()
    return [" ".join(words[i : i + size]) for i in range(0, len(words), size)]


@handler("summarize-chunk")
async def summarize_chunk(input: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """One instance of the for_each: ``ctx.item`` is its chunk, ``ctx.item_index`` its place in the list."""
    await asyncio.sleep(min(float(input.get("sleep_ms", 0)) / 1000.0, max(ctx.remaining() - 0.1, 0)))
    words = str(ctx.item).split()
    return {"index": ctx.item_index, "words": len(words), "summary": " ".join(words[:5]) + " …"}


@handler("merge-summaries")
def merge_summaries(input: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """The fan-in after a for_each: ``ctx.upstream["summarize"]`` is the list of the instances' outputs, in order."""
    parts = ctx.upstream.get("summarize") or []
    total = sum(int(p.get("words", 0)) for p in parts)
    return {
        "chunks": len(parts),
        "words": total,
        "long": total > int(input.get("long_after_words", 100)),
        "summary": " / ".join(str(p.get("summary")) for p in parts),
    }
