"""How content goes into the prompt fragments Loom renders, so that it stays content.

A block's or a section's content is written by whoever holds a writer token for it, and the
fragment it lands in is read by other agents as structure: in XML, ``</working-memory>`` in a
block would close it and let the writer forge an element of their own (an ``operator-policy``
block) in the pack another agent reads. So every renderer (``working_memory.render``,
``profile.render``, ``context.pack``, and the MCP tools, which answer what those render) puts
text through here:

- XML: ``&``, ``<`` and ``>`` become entities in content, and ``"`` too in attributes, so no
  content can open or close an element.
- Markdown: a content line that would be a heading (``#`` after at most three spaces) or turn
  the line above into one (a setext ``===`` or ``---`` underline) is escaped with a backslash,
  so content cannot end its section or start another; a heading's own text stays one line.
"""

from __future__ import annotations

import re

_XML_TEXT = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
_XML_ATTRIBUTE = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"})
# An ATX heading, or a setext underline (which makes the line above it a heading).
_MARKDOWN_HEADING_LINE = re.compile(r"^( {0,3})(#|=+[ \t]*$|-+[ \t]*$)", re.MULTILINE)


def xml_text(text: str) -> str:
    return text.translate(_XML_TEXT)


def xml_attribute(text: str) -> str:
    return text.translate(_XML_ATTRIBUTE)


def markdown_body(text: str) -> str:
    return _MARKDOWN_HEADING_LINE.sub(lambda m: m.group(1) + "\\" + m.group(2), text)


def markdown_heading(text: str) -> str:
    return " ".join(text.splitlines())
