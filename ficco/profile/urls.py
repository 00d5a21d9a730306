"""How a store's name may be shown: a database URL's password never reaches output (pure
Python, imports nothing of ficco's, so every layer can use it)."""

from __future__ import annotations

import re

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
#: ``scheme://user:password@`` of a URL: the password, up to the last ``@`` (a password may
#: hold ``@``, ``/`` or ``:``; hiding too much is safe, too little is not), is what
#: :func:`masked` hides
_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://[^/?#@:]*):.*@", re.DOTALL)


def masked(spec: object) -> str:
    """``spec`` as it may be shown (errors, warnings, logs, JSON, reports): a database URL with
    its password as ``***`` (SQLAlchemy's ``render_as_string(hide_password=True)`` form), a
    directory as it is. The one door through which a store's name reaches any output."""
    location = getattr(spec, "location", None)  # an open store names itself, masked
    if isinstance(location, str):
        return location
    text = str(spec)
    if not _URL.match(text):
        return text
    return _PASSWORD.sub(r"\1:***@", text)
