"""spec.py — a spec given as a dict of keys, written as spec text.

    spec_text({"name": "tiny", "experts": 8, "top_k": 2, "hidden": 512,
               "ffn": 256, "tokens": 256,
               "router": {"score": "softmax", "renormalize": True}})

gives the same file a person would write (README.md, "Spec keys"); the keys
and values are checked by the library when the plan is created, with errors
naming the key. Here only the form is checked: names are identifiers,
values are str, bool, int, float, or a dict (a table of keys) or list (a
list) of them."""
import math
import os
import re
import tempfile

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _value(v, where):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("spec key %s: %r is not a finite number" % (where, v))
        return repr(v)
    if isinstance(v, str):
        if "\0" in v:
            raise ValueError("spec key %s: a string with a NUL character" % where)
        return '"%s"' % v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    if isinstance(v, dict):
        return "{ %s }" % ", ".join("%s = %s" % (_name(k, where), _value(x, "%s.%s" % (where, k)))
                                    for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return "{ %s }" % ", ".join(_value(x, "%s[%d]" % (where, i)) for i, x in enumerate(v))
    raise TypeError("spec key %s: %s is not a spec value (str, bool, int, float, dict or list)"
                    % (where, type(v).__name__))


def _name(k, where=None):
    if not isinstance(k, str) or not _IDENT.match(k):
        raise ValueError("spec key %r%s is not a name (letters, digits, _)" % (k, " in " + where if where else ""))
    return k


def spec_text(keys):
    """The spec text of a dict of keys (nested dicts are tables)."""
    if not isinstance(keys, dict):
        raise TypeError("a spec is a dict of keys, not %s" % type(keys).__name__)
    return "".join("%s = %s\n" % (_name(k), _value(v, k)) for k, v in keys.items())


def write_spec(keys):
    """Write spec_text(keys) to a new private file (mode 0600 in a 0700
    folder) and return its path; the caller removes the folder
    (os.path.dirname(path)) when the plan is created."""
    folder = tempfile.mkdtemp(prefix="moegen-spec-")
    name = keys.get("name", "spec") if isinstance(keys, dict) else "spec"
    path = os.path.join(folder, "%s.moe" % (name if isinstance(name, str) and _IDENT.match(name) else "spec"))
    text = spec_text(keys)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path
