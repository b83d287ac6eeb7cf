"""mkdocs hook: the docstrings' Sphinx roles, shown as plain code in the API reference.

The docstrings cross-reference with reST roles (``:class:`Gateway```, ``:meth:`wait```),
which mkdocstrings renders as Markdown: the role's name would show before the code
(":class:Gateway"). This drops the role and keeps the code.
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj|const):(?=<code>)")


def on_page_content(html: str, **kwargs: Any) -> str:
    return ROLE.sub("", html)
