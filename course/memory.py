"""A finished notebook gives its memory back: ``release(globals())`` in its last cell.

A notebook's kernel keeps every object its cells bound until it is shut down: the model (540 MB of
float32 weights), its packed copies, the engines and their KV pools, the figures. On an 8 GB laptop
with five notebooks open that was 9.4 GB. ``release`` drops the notebook's engine objects (models,
engines, tensors, the course's objects that hold them, IPython's output history), collects them,
closes the figures and hands freed heap pages back to the operating system (glibc's
``malloc_trim``; elsewhere the allocator keeps them for reuse), then prints what the kernel holds.
"""

from __future__ import annotations

import ctypes
import gc
import inspect
import sys
import types

# the modules whose objects hold models, engines or tensors
HOLDERS = ("torch", "minispec", "course", "transformers", "tokenizers", "matplotlib")


def rss_mb() -> float | None:
    """This process's resident memory in MB (Linux: /proc/self/status), None where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


def _holds_memory(value, depth: int = 0) -> bool:
    """True for an object of one of the HOLDERS' types, a list, tuple or dict of them, or a closure
    over them (a lambda a helper returned, holding its engine): not a module, a class or a plain
    function (the notebook's imports and its own functions stay usable)."""
    if depth > 3 or isinstance(value, (types.ModuleType, types.BuiltinFunctionType, type)):
        return False
    if isinstance(value, types.FunctionType):
        return any(_holds_memory(v, depth + 1) for v in inspect.getclosurevars(value).nonlocals.values())
    if isinstance(value, (list, tuple, set)):
        return any(_holds_memory(v, depth + 1) for v in list(value)[:64])
    if isinstance(value, dict):
        return any(_holds_memory(v, depth + 1) for v in list(value.values())[:64])
    return type(value).__module__.split(".")[0] in HOLDERS


def release(namespace: dict, quiet: bool = False) -> dict:
    """Drop from ``namespace`` (a notebook's ``globals()``) every name bound to a model, engine,
    tensor or an object of the course that holds them, and give the memory back.

    Returns {"released": the names dropped, "before_mb", "after_mb"} (None where unreadable).
    Prints one line unless ``quiet``. A cell that needs a dropped name again runs from the top.
    """
    import matplotlib.pyplot as plt

    before = rss_mb()
    # IPython keeps each cell's result as _N too
    names = sorted(k for k, v in list(namespace.items()) if (not k.startswith("_") or k[1:].isdigit())
                   and k not in ("In", "Out") and _holds_memory(v))
    for name in names:
        del namespace[name]
    for history in ("_", "__", "___", "_oh", "Out"):  # IPython's output history keeps results alive
        held = namespace.get(history)
        if isinstance(held, dict):
            held.clear()
        elif history in namespace and _holds_memory(held):
            namespace[history] = None
    plt.close("all")
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
    after = rss_mb()
    if not quiet:
        held = f"; the kernel now holds {after:.0f} MB (it held {before:.0f} MB)" if after and before else ""
        print(f"Released {len(names)} objects (the model, its engines and what held them){held}. "
              "Shut this kernel down before the next notebook (Kernel > Shut Down Kernel), or run "
              "from the top to use the engine again.")
    return {"released": names, "before_mb": before, "after_mb": after}
