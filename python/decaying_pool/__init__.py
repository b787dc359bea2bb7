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

ConfigValue = Union[str, int, float, bool, "os.PathLike[str]", Dict[str, Any]]


class ConfigError(ValueError):
    """The library refused a configuration; the message is the library's."""


def _value_text(key: str, value: ConfigValue) -> str:
    if isinstance(value, dict):
        # packing={"small_threshold": "64KiB", ...}: the `KEY:VALUE;...`
        # form the library reads inside one value.
        return ";".join(f"{k}:{_value_text(f'{key}.{k}', v)}" for k, v in value.items())
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
    ``true``/``false``, paths their text, numbers their ``str``, a dict
    ``KEY:VALUE;...`` (``packing={"small": "64KiB"}``); ``None`` values are
    left out. Keys with a dot go through ``**{"packing.small": "64KiB"}``.
    For example ``config_string(backend="host", limit="8GiB")`` is
    ``"backend=host,limit=8GiB"``.
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

    A configuration is whole: the keys not given take the library's
    defaults (``backend=cuda``, packed pools, a reaper), not the values of
    ``$DECAYING_POOL`` or of an earlier call. The library refuses a new
    configuration while any block is allocated or held back; otherwise its
    pools are trimmed and replaced. So call it first, before the framework
    allocates.

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

    The parsed JSON of ``dp_stats_json``: the device's configuration
    (``backend``, ``policy``, ``limit``, ``capacity``, ...), ``reserved``
    (bytes the device's pools hold from the backing allocator),
    ``library_live_pointers``, ``pending_blocks`` (held back for other
    streams), ``stats`` (the crate's ``Stats`` fields summed over the
    device's stream pools: ``bytes_in_use``, ``bytes_reserved``,
    ``bytes_cached``, ``hits``, ``misses``, ``backing_allocs``, ...),
    ``packing`` (segment figures, ``None`` without packing) and
    ``streams`` (one entry per stream pool, with its own ``stats``). See
    ``ffi/README.md`` for every key.

    Example: ``decaying_pool.stats()["stats"]["bytes_reserved"]``.

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
        if needed <= size:  # `needed` counts the NUL
            figures: Dict[str, Any] = json.loads(buf.value.decode("utf-8"))
            return figures
        size = needed
    raise RuntimeError("dp_stats_json kept asking for a larger buffer")


def empty_cache() -> None:
    """Give every idle block of every pool back to its backing allocator.

    Blocks held back for other streams (``record_stream``) are released
    first, after their events complete; a ``record=`` trace is flushed.
    Under :func:`decaying_pool.torch.enable`, ``torch.cuda.empty_cache()``
    calls this too (the allocator's reset hook).
    """
    _lib().dp_empty_cache()


def set_memory_fraction(fraction: float, device: int = 0) -> None:
    """Cap the pool of ``device`` at ``fraction`` of the device's memory.

    The cap is the device's byte limit, shared by its stream pools; idle
    blocks above it are trimmed at once. Under
    :func:`decaying_pool.torch.enable`,
    ``torch.cuda.set_per_process_memory_fraction`` calls this too.

    Raises:
        ValueError: ``fraction`` is not in (0, 1].
        RuntimeError: the library refused (its message, e.g. a device whose
            capacity it does not know).
    """
    if not 0.0 < float(fraction) <= 1.0:
        raise ValueError(f"fraction {fraction} is outside (0, 1]")
    _lib().dp_set_memory_fraction(float(fraction), int(device))
    message = last_error()
    if message:
        raise RuntimeError(message)


def replay_command(path: Union[str, "os.PathLike[str]"]) -> str:
    """Return the shell command that replays a recorded trace.

    The command-line tool (``cli/`` of the repository) replays the requests
    through pool configurations and recommends one; run it from the
    repository (``cargo run``), or with ``decaying-pool`` on ``PATH``.
    """
    quoted = shlex.quote(os.fspath(path))
    return f"cargo run --release -p decaying-pool-cli -- replay {quoted}"


def record(
    path: Union[str, "os.PathLike[str]"], *, quiet: bool = False, **config: ConfigValue
) -> str:
    """Record every request the pool gets to ``path``, a native trace.

    The same as ``configure(record=path, **config)`` (a whole
    configuration: pass the other keys you want, ``backend="host"`` on a
    machine without a GPU; call it before the first allocation). Run your
    model; the trace is complete when the process ends (the library
    flushes it at exit) or after :func:`empty_cache`. Then replay it
    through other configurations with the command this returns (printed to
    stderr unless ``quiet``) to pick the ``policy=``/``packing=``/
    ``gc_threshold=`` that fits your model. The file has the format the
    tool reads (``time_ns,action,addr,size``).

    Returns:
        The replay command (:func:`replay_command`).
    """
    configure(**config, record=os.fspath(path))
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

