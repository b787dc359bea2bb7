"""decaying-pool: a caching GPU allocator whose idle blocks decay back.

This package loads the crate's C library (``libdecaying_pool``, built by
``pip install``) and installs it behind the allocator doors of PyTorch and
CuPy::

    import decaying_pool.torch
    decaying_pool.torch.enable()          # before the first CUDA tensor

    import decaying_pool.cupy
    decaying_pool.cupy.enable()

The functions here talk to the library directly:

- :func:`configure` sets the pool's configuration (``key=value`` pairs, the
  same as the ``DECAYING_POOL`` environment variable);
- :func:`stats` returns a device's figures as a dict (PyTorch's
  ``torch.cuda.memory_stats`` does not work under a pluggable allocator);
- :func:`empty_cache` gives every idle block back;
- :func:`record` writes a trace of the requests, which the command-line tool
  replays through other configurations (:func:`replay_command`);
- :func:`library_path` names the library (what PyTorch loads).

Nothing here imports torch or cupy; :mod:`decaying_pool.torch` and
:mod:`decaying_pool.cupy` import them when their ``enable`` is called.
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import sys
from typing import Any, Dict, Union

from ._native import LIBRARY_ENV, last_error, library_path
from ._native import lib as _lib

__all__ = [
    "ConfigError",
    "LIBRARY_ENV",
    "CONFIG_ENV",
    "configure",
    "config_string",
    "empty_cache",
    "last_error",
    "library_path",
    "record",
    "replay_command",
    "set_memory_fraction",
    "stats",
]

__version__ = "0.1.0"

#: The environment variable the library reads its configuration from at its
#: first call (``key=value,...``, as :func:`configure` takes).
CONFIG_ENV = "DECAYING_POOL"

ConfigValue = Union[str, int, float, bool, "os.PathLike[str]"]


class ConfigError(ValueError):
    """The library refused a configuration; the message is the library's."""


def _value_text(key: str, value: ConfigValue) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, os.PathLike):
        text = os.fspath(value)
    else:
        text = str(value)
    if "," in text:
        raise ValueError(f"configuration value for {key!r} contains a comma: {text!r}")
    return text


def config_string(**config: ConfigValue) -> str:
    """Return the ``key=value,...`` text that :func:`configure` passes on.

    Keyword arguments become pairs in their order; ``True``/``False`` become
    ``true``/``false``, paths their text, numbers their ``str``; ``None``
    values are left out. For example ``config_string(backend="host",
    limit="8GiB")`` is ``"backend=host,limit=8GiB"``.
    """
    pairs = []
    for key, value in config.items():
        if value is None:
            continue
        if not key or "=" in key or "," in key:
            raise ValueError(f"bad configuration key {key!r}")
        pairs.append(f"{key}={_value_text(key, value)}")
    return ",".join(pairs)


def configure(**config: ConfigValue) -> None:
    """Configure the pool: each keyword argument is one ``key=value`` pair.

    The keys are the library's (``ffi/README.md``): ``backend`` (``cuda`` or
    ``host``, system memory without a GPU), ``policy``, ``packing``,
    ``limit`` (a size with its unit, ``"8GiB"``), ``reaper``,
    ``gc_threshold`` and ``record`` (a trace file, see :func:`record`).
    Without arguments nothing is sent and the library keeps the
    configuration of ``$DECAYING_POOL`` or its defaults.

    Call it before the first allocation: the library may refuse a change
    once its pools serve blocks.

    Raises:
        ConfigError: the library refused the configuration (its message).
    """
    text = config_string(**config)
    if not text:
        return
    if _lib().dp_configure(text.encode("utf-8")) != 0:
        raise ConfigError(f"dp_configure({text!r}) failed: {last_error() or 'no message'}")


def stats(device: int = 0) -> Dict[str, Any]:
    """Return the pool figures of one device as a dict.

    The parsed JSON of ``dp_stats_json``: the crate's ``Stats`` fields (bytes
    in use and reserved, hits, misses, backing calls, ...), and packing and
    page figures when the configuration has them. The key names are the
    library's; see ``ffi/README.md``.

    Raises:
        RuntimeError: the library could not give the figures.
    """
    lib = _lib()
    size = 4096
    for _ in range(8):
        buf = ctypes.create_string_buffer(size)
        needed = int(lib.dp_stats_json(int(device), buf, size))
        if needed == 0:
            raise RuntimeError(f"dp_stats_json({device}) failed: {last_error() or 'no message'}")
        if needed < size:
            return json.loads(bytes(buf[:needed]).split(b"\0", 1)[0].decode("utf-8"))
        size = needed + 1
    raise RuntimeError("dp_stats_json kept asking for a larger buffer")


def empty_cache() -> None:
    """Give every idle block of every pool back to its backing allocator.

    Under :func:`decaying_pool.torch.enable`, ``torch.cuda.empty_cache()``
    calls this too (the allocator's reset hook).
    """
    _lib().dp_empty_cache()


def set_memory_fraction(fraction: float, device: int = 0) -> None:
    """Cap the pool of ``device`` at ``fraction`` of the device's memory.

    Under :func:`decaying_pool.torch.enable`,
    ``torch.cuda.set_per_process_memory_fraction`` calls this too.
    """
    if not 0.0 <= float(fraction) <= 1.0:
        raise ValueError(f"fraction {fraction} is outside 0..1")
    _lib().dp_set_memory_fraction(float(fraction), int(device))


def replay_command(path: Union[str, "os.PathLike[str]"]) -> str:
    """Return the shell command that replays a recorded trace.

    The command-line tool (``cli/`` of the repository) replays the requests
    through pool configurations and recommends one; run it from the
    repository (``cargo run``), or with ``decaying-pool`` on ``PATH``.
    """
    quoted = shlex.quote(os.fspath(path))
    return f"cargo run --release -p decaying-pool-cli -- replay {quoted}"


def record(path: Union[str, "os.PathLike[str]"], *, quiet: bool = False) -> str:
    """Record every request the pool gets to ``path``, a native trace.

    The same as ``configure(record=path)`` (call it before the first
    allocation). Run your model, let the process end (or call
    :func:`empty_cache`) so the trace is complete, then replay it through
    other configurations with the command this returns (printed to stderr
    unless ``quiet``) to pick the ``policy=``/``packing=``/``gc_threshold=``
    that fits your model.

    Returns:
        The replay command (:func:`replay_command`).
    """
    configure(record=os.fspath(path))
    command = replay_command(path)
    if not quiet:
        print(
            f"decaying_pool: recording requests to {os.fspath(path)}; replay with:\n  {command}",
            file=sys.stderr,
        )
    return command


def __getattr__(name: str) -> Any:
    # `decaying_pool.torch` and `decaying_pool.cupy` without importing
    # them (and so torch or cupy) with the package.
    if name in ("torch", "cupy"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

