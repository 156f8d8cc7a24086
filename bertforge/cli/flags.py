"""Command-line flags generated from the settings dataclasses (bertforge.training.settings).

A setting is declared once, as a dataclass field whose `metadata` holds its help (and, where they differ
from what the field implies, its flag's spelling, metavar, nargs, const, choices or action). From it:

* `--name-with-dashes`, `dest` the field's name, `type` the field's (int, float; str for paths);
* a bool field: `--NAME` (store_true) when its default is False, `--no-NAME` (store_false) when True,
  `--NAME/--no-NAME` when its metadata says `negatable` (then the flag's default is None: "as the
  field's default", so a command can tell "not given" apart);
* a field without a default is a required flag.

`add_settings_flags(parser, Settings, include, defaults)` adds the flags of the fields in `include`, in
that order (a command's own recipe may change a default: `defaults`); `settings_from_args(Settings,
args)` builds the dataclass back from the parsed flags. A small generator rather than a library
(simple-parsing, tyro, ...): argparse stays the parser, so every flag keeps its spelling and behaviour.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Iterable, Mapping, TypeVar

T = TypeVar("T")


def _flag_type(annotation: Any) -> Any:
    """The argparse `type` of a field's annotation: int or float (also inside `X | None`); bool for a switch;
    None (a string) for anything else (paths, names, a union of a path and a switch)."""
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) or \
        typing.get_origin(annotation) is typing.Union else (annotation,)
    kinds = [a for a in args if a is not type(None)]
    if len(kinds) == 1 and kinds[0] in (int, float, bool):
        return kinds[0]
    return None


def add_settings_flags(parser: argparse.ArgumentParser, settings: type, include: Iterable[str],
                       defaults: Mapping[str, Any] | None = None) -> None:
    """Add to `parser` the flags of `settings`' fields named in `include` (in that order); `defaults`
    replaces a field's default as the flag's default (e.g. a task's learning rate, or None: "the
    command decides")."""
    defaults = defaults or {}
    fields = {f.name: f for f in dataclasses.fields(settings)}
    hints = typing.get_type_hints(settings)
    for name in include:
        spec = fields[name]
        meta = dict(spec.metadata)
        flag = meta.get("flag") or "--" + name.replace("_", "-")
        field_default = None if spec.default is dataclasses.MISSING else spec.default
        default = defaults.get(name, field_default)
        kind = _flag_type(hints[name])
        options: dict[str, Any] = {"dest": name, "help": meta.get("help")}
        if meta.get("negatable"):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=defaults.get(name), **options)
        elif meta.get("action"):
            parser.add_argument(flag, action=meta["action"], default=default, **options)
        elif kind is bool:
            if default:
                parser.add_argument("--no-" + flag[2:], action="store_false", **options)
            else:
                parser.add_argument(flag, action="store_true", **options)
        else:
            for key in ("choices", "metavar", "nargs", "const"):
                if meta.get(key) is not None:
                    options[key] = meta[key]
            if spec.default is dataclasses.MISSING and name not in defaults:
                options["required"] = True
            else:
                options["default"] = default
            parser.add_argument(flag, type=kind, **options)


def settings_from_args(settings: type[T], args: argparse.Namespace, **values: Any) -> T:
    """`settings` from the parsed flags named as its fields (a flag left None takes the field's default),
    and `values` (which win)."""
    names = {f.name for f in dataclasses.fields(settings)}
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    return settings(**{**given, **values})
