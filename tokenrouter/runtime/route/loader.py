"""Turn rendered route-kernel source into a module. The source is registered in `linecache` under a
content-addressed pseudo file name, so tracebacks and Triton's JIT (which reads a kernel's source through
`inspect`) see it, and nothing is written to disk."""

from __future__ import annotations

import hashlib
import linecache
import sys
import types


def load_source(source: str, label: str) -> types.ModuleType:
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    name = f"tokenrouter_route_{label}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    filename = f"<tokenrouter route kernel {label} {digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module  # Triton resolves a kernel's globals through its module
    try:
        exec(compile(source, filename, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module
