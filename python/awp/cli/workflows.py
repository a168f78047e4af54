"""``awp workflow apply|list|versions|show``: workflow definitions, read from a JSON or YAML file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import yaml

from awp.cli.user import echo_columns, echo_json, gateway_options, run_call, with_client
from awp.worker.client import Client


@click.group()
def workflow() -> None:
    """Workflow definitions."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping (safe_load keeps the last one silently, where the HTTP
    API refuses duplicate JSON keys)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"the key {twice[0]!r} is given twice in one object")
    return dict(pairs)


def load_definition(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text, object_pairs_hook=_unique_pairs)
        else:
            data = yaml.load(text, Loader=_UniqueKeyLoader)
    except (ValueError, yaml.YAMLError) as e:
        raise click.ClickException(f"{path}: not valid JSON/YAML: {e}") from e
    if not isinstance(data, dict):
        raise click.ClickException(f"{path}: the definition must be an object")
    return data


@workflow.command("apply")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@gateway_options
def workflow_apply(client: Client, as_json: bool, file: Path) -> None:
    """Create a new version of the workflow in FILE (JSON or YAML); an unchanged definition keeps its version."""
    definition = load_definition(file)
    answer = run_call(with_client(client, lambda c: c.apply_workflow(definition)))
    if as_json:
        echo_json(answer)
    else:
        click.echo(f"workflow {answer['workflow_id']} version {answer['version']}")


@workflow.command("list")
@gateway_options
def workflow_list(client: Client, as_json: bool) -> None:
    """Every workflow with its latest version."""
    items = run_call(with_client(client, lambda c: c.list_workflows()))
    if as_json:
        echo_json(items)
        return
    rows = [("workflow", "latest version", "created", "updated")]
    rows += [
        (str(w.get("workflow_id")), str(w.get("latest_version")), str(w.get("created_at")), str(w.get("updated_at")))
        for w in items
    ]
    echo_columns(rows)


@workflow.command("versions")
@click.argument("workflow_id")
@gateway_options
def workflow_versions(client: Client, as_json: bool, workflow_id: str) -> None:
    """The versions of WORKFLOW_ID, oldest first."""
    items = run_call(with_client(client, lambda c: c.workflow_versions(workflow_id)))
    if as_json:
        echo_json(items)
        return
    rows = [("version", "tasks", "created", "definition hash")]
    rows += [
        (str(v.get("version")), str(v.get("task_count")), str(v.get("created_at")), str(v.get("definition_hash"))[:16])
        for v in items
    ]
    echo_columns(rows)


@workflow.command("show")
@click.argument("workflow_id")
@click.option("--version", type=click.IntRange(1), default=None, help="A version [default: the latest].")
@gateway_options
def workflow_show(client: Client, as_json: bool, workflow_id: str, version: int | None) -> None:
    """The definition of WORKFLOW_ID (its latest version, or --version N), as YAML (--json: the API's answer)."""

    async def go(c: Client) -> dict[str, Any]:
        v = version
        if v is None:
            v = int((await c.get_workflow(workflow_id))["latest_version"])
        return await c.get_workflow_version(workflow_id, v)

    answer = run_call(with_client(client, go))
    if as_json:
        echo_json(answer)
        return
    click.echo(
        f"# workflow {answer.get('workflow_id')} version {answer.get('version')} ({answer.get('task_count')} tasks)"
    )
    click.echo(yaml.safe_dump(answer.get("definition"), sort_keys=False, allow_unicode=True).rstrip())
