"""One home per run setting: what users read and type is derived from the declarations in
proxy/config/settings.py, and these tests fail when any of it differs.

- the published reference (docs/running.md's flag table, docs/reference/settings.md) and the declared keys of
  schemas/config.schema.json are what `python -m tapfix.proxy.cli.settings_reference` renders;
- `tapfix run`'s options are the declared flags, with their defaults, ranges and help;
- every declared config key is read from a real file, lands in `Settings`, loses to a flag typed on the
  command line, and is refused outside its range by the file and the flag alike, in the same words.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from tapfix.proxy.cli import main
from tapfix.proxy.cli import settings_reference as ref
from tapfix.proxy.cli.run import run
from tapfix.proxy.cli.settings_options import settings_command, with_config_file
from tapfix.proxy.config.declare import Setting
from tapfix.proxy.config.file import ConfigError, load
from tapfix.proxy.config.settings import Settings, declared
from tapfix.proxy.store import held

ROOT = Path(__file__).resolve().parents[2]
UPSTREAMS = '[upstreams.gpu0]\nbase_url = "http://127.0.0.1:9/v1"\nengine = "vllm"\n\n[models.qwen]\n'
KEYED = [s for s in declared() if s.key is not None]
FLAGGED = [s for s in declared() if s.flag is not None]


# --- the published reference -----------------------------------------------------------------------


@pytest.mark.parametrize("path", list(ref.rendered()), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_published_reference_is_the_declarations(path: Path) -> None:
    """The page, the schema and docs/running.md's flag table."""
    assert path.read_text(encoding="utf-8") == ref.rendered()[path], (
        f"{path.relative_to(ROOT)} differs from proxy/config/settings.py: run .venv/bin/python -m "
        "tapfix.proxy.cli.settings_reference --write"
    )


def test_a_hand_edited_table_is_caught() -> None:
    """The check above can fail: a table whose default was edited by hand is rewritten, and only the block."""
    current = ref.flag_block()
    edited = current.replace("| `--shutdown-grace SECONDS` | `5` |", "| `--shutdown-grace SECONDS` | `10` |")
    assert edited != current, "the table lists --shutdown-grace with its default"
    text = f"# tapfix\n\nbefore\n\n{edited}\n\nafter\n"
    assert ref.replace_block(text) == f"# tapfix\n\nbefore\n\n{current}\n\nafter\n"


def test_the_page_lists_every_setting_once() -> None:
    page = ref.rendered()[ref.PAGE]
    for s in FLAGGED:
        assert page.count("\n" + ref._row(ref._flag_cell(s))) == 1, s.flag  # one row starts with it
    for s in KEYED:
        assert f"`{s.key}`" in page or f"`[{s.key.replace('.', '] ')}`" in page, s.key
    for s in declared():
        if s.per is not None:
            assert f"| `[{s.per.table}.NAME]` | `{s.per.key}` |" in page, s.per.key


def test_the_schema_keys_carry_the_declared_ranges() -> None:
    schema = json.loads(ref.SCHEMA.read_text(encoding="utf-8"))
    for s in KEYED:
        *tables, last = s.key.split(".")  # type: ignore[union-attr]
        where = schema
        for name in tables:
            where = where["properties"][name]
        entry = where["properties"][last]
        assert {k: v for k, v in entry.items() if k != "description"} == s.schema(), s.key
    model = schema["$defs"]["model"]["properties"]
    assert model["regenerate"]["maximum"] == schema["properties"]["regenerate"]["maximum"] == 10


# --- the options --------------------------------------------------------------------------------------


def _options() -> dict[str, click.Option]:
    return {p.name: p for p in run.params if isinstance(p, click.Option) and p.name and not p.hidden}


def test_every_run_option_is_a_declared_setting() -> None:
    options = _options()
    options.pop("help", None)
    assert sorted(options) == sorted(s.name for s in FLAGGED)
    for s in FLAGGED:
        option = options[s.name]
        assert s.flag in option.opts and (s.short is None or s.short in option.opts), s.name
        assert option.help == s.help, s.name
        if s.kind == "flag":
            assert option.is_flag and option.default == s.default and option.flag_value == (not s.default), s.name
        elif s.is_number:
            assert option.default == s.default, s.name
            assert s.range is not None
            assert (option.type.min, option.type.max, option.type.min_open) == (  # type: ignore[attr-defined]
                s.range.min,
                s.range.max,
                s.range.min_open,
            ), s.name
        elif s.kind == "choice":
            assert list(option.type.choices) == list(s.choices), s.name  # type: ignore[attr-defined]


def test_the_help_lists_them_in_the_declared_order() -> None:
    shown = CliRunner().invoke(main, ["run", "--help"]).output
    places = [shown.index(f"  {s.short + ', ' if s.short else ''}{s.flag} ") for s in FLAGGED]
    assert places == sorted(places)


def test_old_spellings_are_declared_hidden_aliases() -> None:
    hidden = {opt for p in run.params if isinstance(p, click.Option) and p.hidden for opt in p.opts}
    assert hidden == {old for s in declared() for old in s.old_flags} == {"--max-db-size", "--upstream-key-env"}


def test_settings_fields_are_the_declarations() -> None:
    hints = typing.get_type_hints(Settings)
    kinds = {"int": int, "number": float, "flag": bool}
    for f in dataclasses.fields(Settings):
        s = next(s for s in declared() if s.name == f.name)
        assert f.default == s.default, f.name
        if s.kind in kinds:
            assert hints[f.name] is kinds[s.kind], f.name


def test_the_store_queue_defaults_are_the_writers_own() -> None:
    """`--store-queue` and `--store-queue-bytes` say their defaults; the writer built without them holds
    the same (proxy/store/held.py)."""
    assert (Settings().store_queue, Settings().store_queue_bytes) == (held.MAX_HELD, held.MAX_HELD_BYTES)


# --- the config file under the flags ----------------------------------------------------------------


def _other_value(s: Setting) -> Any:
    """A value the setting takes that isn't its default."""
    if s.kind == "flag":
        return not s.default
    if s.kind == "choice":
        return next(c for c in s.choices if c != s.default)
    if s.kind == "listen":
        return ("127.0.0.1", 18080)
    if s.kind == "store":
        return "other.db"
    assert s.is_number and s.range is not None, s.name
    top = s.range.max if s.range.max is not None else (s.range.min or 0) + 7
    return int(top) if s.kind == "int" else float(top)


def _toml(s: Setting, value: Any) -> str:
    if s.kind == "listen":
        text = f'"{value[0]}:{value[1]}"'
    elif isinstance(value, str):
        text = f'"{value}"'
    else:
        text = json.dumps(value)
    *tables, last = s.key.split(".")  # type: ignore[union-attr]
    return f"{last} = {text}\n" if not tables else f"[{tables[0]}]\n{last} = {text}\n"


def _settings(args: list[str]) -> Settings:
    """What `tapfix run ARGS` would run with: its own derived options and config-file merge, no proxy."""
    got: list[Settings] = []

    @click.command()
    @settings_command
    def probe_run(settings: Settings) -> None:
        got.append(with_config_file(settings) if settings.config_path else settings)

    result = CliRunner().invoke(probe_run, args)
    assert result.exit_code == 0, result.output
    return got[0]


def _config(tmp_path: Path, text: str) -> Path:
    file = tmp_path / "tapfix.toml"
    file.write_text(text + UPSTREAMS, encoding="utf-8")  # the key (or its [table]) first, then the tables
    return file


@pytest.mark.parametrize("s", KEYED, ids=lambda s: s.key)
def test_a_config_key_sets_its_setting_and_a_typed_flag_wins(s: Setting, tmp_path: Path) -> None:
    value = _other_value(s)
    file = _config(tmp_path, _toml(s, value))
    expected = str(tmp_path / value) if s.kind == "store" else value
    written = {"store": expected, "listen": f"{value[0]}:{value[1]}" if s.kind == "listen" else None}
    assert load(file).run_settings == {s.name: written.get(s.kind) or value}  # as written (a path made absolute)
    assert getattr(_settings(["--config", str(file)]), s.name) == expected
    if s.kind == "flag":
        return  # a flag can only be typed on, and the file's value here is the one it would set
    assert s.flag is not None
    typed, expected = {"listen": (s.shown_default(), s.default), "store": ("typed.db", "typed.db")}.get(
        s.kind, (str(s.default), s.default)
    )
    assert getattr(_settings(["--config", str(file), s.flag, str(typed)]), s.name) == expected


@pytest.mark.parametrize("s", [s for s in KEYED if s.is_number], ids=lambda s: s.key)
def test_out_of_range_is_refused_by_the_file_and_the_flag_alike(s: Setting, tmp_path: Path) -> None:
    assert s.range is not None and s.flag is not None
    bad = (s.range.max + 1) if s.range.max is not None else (s.range.min or 0) - 1
    bad = int(bad) if s.kind == "int" else float(bad)
    file = _config(tmp_path, _toml(s, bad))
    with pytest.raises(ConfigError) as raised:
        load(file)
    assert len(raised.value.problems) == 1, raised.value.problems  # said once, by the schema
    assert raised.value.problems[0].startswith(f"{file}: {s.key}: found {bad!r}"), raised.value.problems
    flag = CliRunner().invoke(main, ["run", "--upstream", "http://127.0.0.1:9", s.flag, str(bad)])
    assert flag.exit_code == 2
    assert f"Invalid value for '{s.flag}': must be {s.expectation()}, got {bad!r}" in flag.stderr
