"""What every `weirflow` command shares: its consoles, the CONFIG argument and the ``--set`` and ``--json``
options, loading the config with its warnings printed, and turning weirflow's errors into one line and an exit
status (2: bad input, 1: a runtime failure)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from weirflow.base.errors import ConfigError, WeirflowError
from weirflow.config import load_config

console = Console()
err_console = Console(stderr=True)

ConfigArg = Annotated[Path, typer.Argument(help="The job's config file (.yaml, .yml or .properties).")]
SetOpt = Annotated[list[str], typer.Option("--set", help="Override a config key: --set key=value (repeatable).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")]


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except ConfigError as exc:
        err_console.print(f"[bold red]config error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    except WeirflowError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None


def load(config: Path, overrides: list[str] | None) -> Any:
    cfg = load_config(config, overrides or [])
    for warning in cfg.warnings:
        err_console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    return cfg
