"""Renders docs/configuration.md from the key registry. `python -m weirflow.config.reference [--check FILE]`."""

from __future__ import annotations

import sys
from pathlib import Path

from weirflow.config.keys import KEYS

INTRO = """# Configuration reference

<!-- generated from weirflow/config/keys.py by `make docs`; do not edit by hand -->

Keys are dotted names, Samza style. Write them nested in YAML (`job: {name: x}` is `job.name`), dotted in
YAML or in a Java `.properties` file, or override any of them with `--set key=value` on every command.
String values may use `${ENV_VAR}` or `${ENV_VAR:-default}`. A name part written `<name>` or `<id>` is a
placeholder for one segment: `systems.<name>.factory` covers `systems.local.factory`. Keys starting with
`spark.` are passed to Spark unchecked. Durations (`duration_ms`) take milliseconds or `500ms`, `15s`,
`2m`, `1h`; lists take a YAML list or a comma-separated string. An unknown key warns and names the closest
known key; a bad value stops the command and names the key and the file.
"""


def _default(value: object, required: bool) -> str:
    if required:
        return "**required**"
    if value is None:
        return "—"
    if value == []:
        return "`[]`"
    return f"`{value}`"


def render_markdown() -> str:
    out = [INTRO]
    sections: dict[str, list[str]] = {}
    for key in KEYS:
        row = f"| `{key.name}` | {key.type} | {_default(key.default, key.required)} | {key.doc} |"
        sections.setdefault(key.section, []).append(row)
    for section, rows in sections.items():
        out.append(f"\n## {section}\n\n| key | type | default | meaning |\n| --- | --- | --- | --- |")
        out.extend(rows)
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    text = render_markdown()
    if len(argv) == 2 and argv[0] == "--check":
        if Path(argv[1]).read_text() != text:
            print(f"{argv[1]} is out of date: run `make docs`", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
