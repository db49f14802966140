"""Loading cached Numba kernels without Numba's registries (a verifier's fixed cost, issue 11).

Before a cached kernel (``cache=True``) is loaded, Numba "refreshes" its CPU target: it imports
and installs the typing and lowering registries of every feature it has (typed containers,
``np.linalg``, random generators, jitclass, CFFI, ...): about 0.15 s of CPU, and the import of
SciPy's linear algebra and CFFI on top. A cached kernel needs none of them: it is machine code
linked against Numba's runtime (NRT, initialised here) and, for a parallel kernel, the
threading layer (which the cached library's own ``reload_init`` starts). So dk's kernels load
from the cache after initialising the runtime only.

Compiling is untouched: Numba's compiler refreshes its contexts itself, so a cold cache or a
new signature compiles exactly as before. Only where the machine code comes from changes,
never what it computes (``tests/unit/exact/test_exact_cache_load.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def load_cached_without_registries(dispatchers: Iterable[Any]) -> int:
    """Switch the Numba dispatchers among ``dispatchers`` (other objects are skipped) to load
    from the cache without Numba's registries; returns how many were switched (0 if this Numba
    lacks the internals used: every kernel then keeps Numba's own loading)."""
    try:
        from numba.core.caching import FunctionCache
        from numba.core.runtime import rtsys
    except ImportError:  # pragma: no cover - a Numba without these internals
        return 0

    class _Cache(FunctionCache):
        def load_overload(self, sig: Any, target_context: Any) -> Any:
            rtsys.initialize(target_context)  # idempotent; what cached machine code links to
            load: Any = self._load_overload  # Numba's own (untyped)
            return load(sig, target_context)

    light: Any = _Cache
    n = 0
    for fn in dispatchers:
        if type(getattr(fn, "_cache", None)) is FunctionCache:  # a cache=True CPU dispatcher
            fn._cache = light(fn.py_func)
            n += 1
    return n
