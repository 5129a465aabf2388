"""The package's version: gen/version.h's MOEGEN_VERSION, read when the
package was built (_build_version.py, written by setup.py), or from the
repository's gen/version.h when the package is used from a clone."""
import os
import re

try:
    from ._build_version import __version__
except ImportError:
    _h = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "gen",
                      "version.h")
    try:
        with open(_h) as _f:
            __version__ = re.search(r'#define MOEGEN_VERSION "([^"]+)"', _f.read()).group(1)
    except (OSError, AttributeError):
        raise ImportError("moegen: no _build_version.py (not built by setup.py) and no %s to read the "
                          "version from" % _h) from None
