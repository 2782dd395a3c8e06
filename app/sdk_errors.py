"""The SDKs' error classes, generated from the error catalogue (``app.error_catalogue``).

Both SDKs keep their roots by hand, since those carry behaviour (``LoomError``, the transport
errors, ``LoomAPIError`` with ``retry_after``): ``sdk/loom/error_base.py`` and
``sdk-ts/src/error_base.ts``. Every class below ``LoomAPIError`` is generated: one per status
family (``STATUS_FAMILIES``, what a code new to the SDK falls back to), the groups
(``SDK_GROUPS``), and one per code of the catalogue, each with its code, status, what a caller
should do (``remedy``) and a typed accessor for each detail field its entry declares. Then the
``BY_CODE`` and ``BY_STATUS`` tables the SDKs pick a class from.

``sdk_classes()`` is that model; ``render_python`` writes ``sdk/loom/error_classes.py`` (run by
``python -m app.sdk_manifest``), ``app.sdk_ts.render_errors`` the TypeScript. Each generator's
``--check`` fails when its committed file differs from a fresh generation. The SDK is its own
distribution, so it gets the generated file, never an import of ``app``.
"""

from __future__ import annotations

import json
import keyword
from dataclasses import dataclass
from pathlib import Path

from app.error_catalogue import CATALOGUE, REMEDY_TEXT, SDK_GROUPS, STATUS_FAMILIES, Detail

ROOT = Path(__file__).resolve().parents[1]
PYTHON_PATH = ROOT / "sdk" / "loom" / "error_classes.py"
# The hand-written roots the generated classes extend, the same names in both SDKs.
ROOT_CLASSES = ("LoomError", "LoomTransportError", "LoomConnectionError", "LoomTimeout",
                "LoomAPIError")
API_ROOT = "LoomAPIError"
# Details every LoomAPIError already answers (its hand-written ``retry_after`` also reads the
# Retry-After header), so no class gets an accessor of its own for them.
ROOT_DETAILS = frozenset({"retry_after"})


class CatalogueDrift(Exception):
    """The catalogue cannot be turned into SDK classes, or the hand-written roots of the two
    SDKs no longer match."""


@dataclass(frozen=True)
class SdkClass:
    name: str
    parent: str
    code: str
    status: int | None
    doc: str
    remedy: str | None
    # The detail accessors this class declares (those of its parents are inherited).
    accessors: tuple[Detail, ...]


def _family_of(status: int) -> str:
    for family in STATUS_FAMILIES:
        if family.status == status:
            return family.sdk_class
    return "ServerError" if status >= 500 else API_ROOT


def sdk_classes() -> list[SdkClass]:
    """Every class below ``LoomAPIError``, each after its parent: the families, the groups,
    then one per code of the catalogue (a code whose class is a family's gives that family its
    remedy and accessors)."""
    entries_by_class = {entry.sdk_class: entry for entry in CATALOGUE if entry.sdk_class}
    classes: dict[str, SdkClass] = {}
    inherited: dict[str, frozenset[str]] = {API_ROOT: ROOT_DETAILS}

    def add(name: str, parent: str, code: str, status: int | None, doc: str,
            remedy: str | None, details: tuple[Detail, ...]) -> None:
        if parent not in inherited:
            raise CatalogueDrift(f"{name}'s parent {parent} is not declared before it")
        if name in classes or name in ROOT_CLASSES:
            raise CatalogueDrift(f"SDK class {name} is declared twice")
        own = tuple(detail for detail in details if detail.name not in inherited[parent])
        for detail in own:
            if not detail.name.isidentifier() or keyword.iskeyword(detail.name):
                raise CatalogueDrift(f"{name}: detail {detail.name!r} cannot be an accessor")
        classes[name] = SdkClass(name, parent, code, status, doc, remedy, own)
        inherited[name] = inherited[parent] | {detail.name for detail in own}

    for family in STATUS_FAMILIES:
        entry = entries_by_class.get(family.sdk_class)
        if entry is not None and entry.code != family.code:
            raise CatalogueDrift(f"{family.sdk_class} stands for {family.code}, not {entry.code}")
        where = "Any 5xx answer" if family.status == 500 else f"Any {family.status} answer"
        add(family.sdk_class, API_ROOT, family.code, family.status,
            f"{where}, and `{entry.code}`: {_doc(entry)}" if entry else f"{where}.",
            entry.remedy.value if entry else None, entry.details if entry else ())
    for group in SDK_GROUPS:
        add(group.sdk_class, group.parent, group.code, None, group.meaning, None, group.details)
    families = {family.sdk_class for family in STATUS_FAMILIES}
    for entry in CATALOGUE:
        if entry.sdk_class is None or entry.sdk_class in families:
            continue
        add(entry.sdk_class, entry.sdk_parent or _family_of(entry.status), entry.code,
            entry.status, _doc(entry), entry.remedy.value, entry.details)
    return list(classes.values())


def _doc(entry: object) -> str:
    from app.error_catalogue import ErrorSpec

    assert isinstance(entry, ErrorSpec)
    todo = entry.advice or REMEDY_TEXT[entry.remedy]
    return f"{entry.meaning} What to do: {todo.rstrip('.')}."


def by_code() -> dict[str, str]:
    """Each code with the name of its class (the catalogue's codes that have one)."""
    return {entry.code: entry.sdk_class for entry in sorted(CATALOGUE, key=lambda e: e.code)
            if entry.sdk_class}


def by_status() -> dict[int, str]:
    """Each 4xx family's status with its class: what a code new to the SDK falls back to
    (any 5xx falls back to ``ServerError`` in the hand-written ``error_class``)."""
    return {family.status: family.sdk_class for family in STATUS_FAMILIES
            if family.status < 500}


# --- Python ---------------------------------------------------------------------------------

PY_TYPES = {"string": "str | None", "integer": "int | None", "number": "float | None",
            "boolean": "bool | None", "object": "dict[str, Any]", "array": "list[Any]"}
# How each JSON type is read from ``details``: anything else there reads as absent.
PY_READS = {
    "string": "return found if isinstance(found, str) else None",
    "integer": "return found if isinstance(found, int) and not isinstance(found, bool) else None",
    "number": ("if isinstance(found, bool) or not isinstance(found, int | float):\n"
               "            return None\n"
               "        return float(found)"),
    "boolean": "return found if isinstance(found, bool) else None",
    "object": "return dict(found) if isinstance(found, dict) else {}",
    "array": "return list(found) if isinstance(found, list) else []",
}


def _py_accessor(detail: Detail) -> list[str]:
    return ["", "    @property", f"    def {detail.name}(self) -> {PY_TYPES[detail.type]}:",
            f'        """{detail.meaning[:1].upper() + detail.meaning[1:]}."""',
            f'        found = self.details.get("{detail.name}")',
            f"        {PY_READS[detail.type]}"]


def _wrap(text: str, indent: str, width: int = 99) -> list[str]:
    lines: list[str] = []
    current = indent
    for word in text.split():
        if len(current) + len(word) + 1 > width and current.strip():
            lines.append(current.rstrip())
            current = indent
        current += word + " "
    if current.strip():
        lines.append(current.rstrip())
    return lines


PY_HEADER = '''"""Every error class below ``LoomAPIError``: one per status family and one per code
of Loom's error catalogue, with its status, what a caller should do (``remedy``) and an
accessor for each detail field the code carries.

Generated by ``python -m app.sdk_manifest`` from the server's ``app/error_catalogue.py``.
Do not edit by hand; the roots these extend are in ``loom.error_base``.

Hierarchy (below ``LoomAPIError``)::

{tree}
"""

from __future__ import annotations

from typing import Any

from loom.error_base import LoomAPIError
'''


def tree() -> list[str]:
    """The classes below ``LoomAPIError`` as an indented tree, each with its code."""
    classes = sdk_classes()
    children: dict[str, list[SdkClass]] = {}
    for cls in classes:
        children.setdefault(cls.parent, []).append(cls)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for cls in children.get(parent, []):
            status = f"{cls.status} " if cls.status is not None else ""
            lines.append(f"    {'    ' * depth}{cls.name:<{40 - 4 * depth}} {status}{cls.code}")
            walk(cls.name, depth + 1)

    walk(API_ROOT, 0)
    return lines


def _rst(text: str) -> str:
    """Markdown's `code` as reST's ``code``, for a docstring."""
    return text.replace("`", "``")


def render_python() -> str:
    blocks: list[str] = []
    for cls in sdk_classes():
        lines = [f"class {cls.name}({cls.parent}):"]
        doc = _wrap(_rst(cls.doc), "    ", width=95)
        doc[0] = '    """' + doc[0].lstrip()
        if len(doc[-1]) + 3 > 99:
            doc.append('    """')
        else:
            doc[-1] += '"""'
        lines += doc + ["", f"    default_code = {json.dumps(cls.code)}"]
        if cls.status is not None:
            lines.append(f"    default_status = {cls.status}")
        if cls.remedy is not None:
            lines.append(f"    remedy = {json.dumps(cls.remedy)}")
        for detail in cls.accessors:
            lines += _py_accessor(detail)
        blocks.append("\n".join(lines))
    names = [cls.name for cls in sdk_classes()] + ["BY_CODE", "BY_STATUS"]
    exported = ["__all__ = ["] + _wrap(" ".join(json.dumps(name) + "," for name in names),
                                       "    ") + ["]"]
    tables = ["# The class of each code the server answers with.",
              "BY_CODE: dict[str, type[LoomAPIError]] = {"]
    tables += [f"    {json.dumps(code)}: {name}," for code, name in by_code().items()]
    tables += ["}", "", "# The class for a 4xx status whose code this SDK does not know.",
               "BY_STATUS: dict[int, type[LoomAPIError]] = {"]
    tables += [f"    {status}: {name}," for status, name in by_status().items()]
    tables.append("}")
    header = PY_HEADER.replace("{tree}", "\n".join(line.rstrip() for line in tree()))
    parts = ["\n".join(exported), "\n\n\n".join(blocks), "\n".join(tables)]
    return header + "\n" + "\n\n\n".join(parts) + "\n"


def python_files() -> dict[Path, str]:
    return {PYTHON_PATH: render_python()}
