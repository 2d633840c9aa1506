"""The one place where robot_sdf reaches into private internals of torch and rclpy, for per-call overhead.

Each shortcut is used only on the library versions it was checked against (SUPPORTED_*) and has
a public equivalent that a test compares it with (test/autograd_contract_test.py for torch,
test/world_updates_test.py for rclpy); on other versions the public path is taken. (Warp's
recorded-launch shortcut, robot_sdf.launch's direct CPU calls, is gated the same way, on the Warp
releases of kernels.warp_release.CHECKED_RELEASES: WARP_SHORTCUTS.)

- direct_apply: torch.autograd.Function.apply is a Python wrapper around the C entry point
  (torch._C._FunctionBase.apply): it binds default arguments with inspect.signature for
  Functions with a setup_context (about 30 us per call here, as much again as a whole
  evaluation of a few spheres), and, unless a torch.func transform is active, unwraps dead
  torch.func wrappers before calling the entry point. For all arguments given positionally, the
  shortcut does the same with two C calls; under an active transform it goes through the public
  apply. Used by SdfMeshWarpPy, SweptSdfMeshWarpPy and signed_distance (world.sphere_cost outside
  torch.func uses a forward-with-ctx Function, which the public apply enters without binding).
- transforms_active: torch._C._are_functorch_transforms_active (what Function.apply itself
  asks), so that forward computes a gradient under torch.func even though the tensors it sees
  do not require grad; without it, whenever grad mode is on.
- plain_tensors: torch._C._DisableFuncTorch, so that module-level caches of constant tensors made
  inside a torch.func transform hold plain tensors. Without it (other torch versions) a cache
  entry first made under a transform would be a wrapper that escapes it.
- info_logger: rclpy's C logging entry point (rclpy_logging_rcutils_log, where
  RcutilsLogger.log ends), called with a fixed caller. RcutilsLogger.log looks its caller up with
  inspect on every call (reading and stat-ing source files): profiled under the node's soak,
  that was ~20 % of the update worker's time, holding the GIL. The public path is logger.info,
  taken on other rclpy versions and whenever the entry point is missing or refuses its arguments.
  rclpy is imported only when info_logger is called: the core never loads ROS.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import inspect
from typing import Callable

import torch
from torch.autograd import forward_ad

from robot_sdf.kernels import warp_release

SUPPORTED_TORCH = ("2.13",)
SUPPORTED_RCLPY = ("7.1", "9.1")  # ROS 2 Jazzy, Kilted


_minor = warp_release.minor_release  # "major.minor" of any of these libraries' version strings


TORCH_SHORTCUTS = _minor(torch.__version__) in SUPPORTED_TORCH
WARP_SHORTCUTS = warp_release.WARP_CHECKED


def public_apply(function):
    return function.apply


def direct_apply(function):
    """A callable equal to ``function.apply`` (positional arguments, none defaulted; only the first
    may be a torch.func wrapper of a dead transform), through
    torch's C entry point when this torch is one the shortcut was checked on."""
    if not TORCH_SHORTCUTS:
        return function.apply
    try:
        entry = super(torch.autograd.Function, function).apply
        active = torch._C._are_functorch_transforms_active
        unwrap = torch._C._functorch.unwrap_if_dead
    except AttributeError:  # pragma: no cover - layout differs despite the version
        return function.apply
    public = function.apply

    def apply(spheres, *args):
        if active():
            return public(spheres, *args)
        return entry(unwrap(spheres), *args)

    return apply


def plain_tensors():
    """Context in which new tensors are plain even under a torch.func transform (module-level
    caches of constant tensors outlive the transform that first asked for them; a tensor made
    inside one would be a wrapper of that transform's level)."""
    disable = getattr(torch._C, "_DisableFuncTorch", None) if TORCH_SHORTCUTS else None
    return disable() if disable is not None else contextlib.nullcontext()


def _transforms_active_fallback() -> bool:
    return torch.is_grad_enabled()


# transforms_active() -> bool: whether a torch.func transform (grad, vmap, jvp, ...) is active:
# then a Function's forward cannot see that a gradient will be asked for, so callers compute it.
# Where the check is not available: whenever grad mode is on (correct, if slower).
transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None) if TORCH_SHORTCUTS else None
if transforms_active is None:  # pragma: no cover - other torch versions
    transforms_active = _transforms_active_fallback


def is_batched(t) -> bool:
    """Whether ``t`` is a tensor vmap batches at the current level (torch.func)."""
    check = getattr(getattr(torch._C, "_functorch", None), "is_batchedtensor", None)
    return isinstance(t, torch.Tensor) and check is not None and bool(check(t))


_functorch = getattr(torch._C, "_functorch", None) if TORCH_SHORTCUTS else None


def unwrapped(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor under torch.func's wrappers of ``t`` (the memory a kernel may write): an
    output buffer a caller made inside a transform reaches a Function's forward still wrapped,
    unlike the Function's tensor arguments, which torch.func unwraps level by level."""
    if _functorch is None:
        return t
    while _functorch.is_functorch_wrapped_tensor(t):
        t = _functorch.get_unwrapped(t)
    return t


def may_need_gradient(t: torch.Tensor) -> bool:
    """Whether a derivative w.r.t. ``t`` may be asked for: it requires grad (ordinary autograd), a
    torch.func transform is active, or it carries a forward-mode tangent (forward_ad)."""
    return t.requires_grad or transforms_active() or forward_ad.unpack_dual(t).tangent is not None


def bind_arguments(function, args: tuple, kwargs: dict) -> list:
    """All arguments of ``function.forward`` as a positional list, defaults filled in (positional
    calls, the usual case, without inspect's binding: a few microseconds per call)."""
    if not kwargs:
        shape = _signatures.get(function)
        if shape is None:
            params = list(inspect.signature(function.forward).parameters.values())
            defaults = [p.default for p in params if p.default is not inspect.Parameter.empty]
            shape = _signatures[function] = (len(params) - len(defaults), defaults)
        required, defaults = shape
        if required <= len(args) <= required + len(defaults):
            return [*args, *defaults[len(args) - required:]]
    bound = inspect.signature(function.forward).bind(*args, **kwargs)
    bound.apply_defaults()
    return list(bound.args)


_signatures: dict = {}


@functools.cache
def rclpy_shortcuts() -> bool:
    """Whether the installed rclpy is one the logging shortcut was checked on (read from its
    package metadata, without importing it)."""
    try:
        return _minor(importlib.metadata.version("rclpy")) in SUPPORTED_RCLPY
    except importlib.metadata.PackageNotFoundError:
        return False


def _rcutils_log_entry():
    """rclpy's C function behind RcutilsLogger.log, or None where this rclpy lacks it."""
    try:
        from rclpy.impl.implementation_singleton import rclpy_implementation
    except ImportError:
        return None
    return getattr(rclpy_implementation, "rclpy_logging_rcutils_log", None)


def info_logger(logger, function_name: str, file_path: str, line_number: int) -> Callable[[str], None]:
    """A callable that logs one line at INFO through ``logger`` (an rclpy RcutilsLogger), the same
    line ``logger.info(line)`` logs, reported as coming from ``function_name`` in ``file_path``
    at ``line_number`` (what rcutils' {function_name}, {file_name} and {line_number} print).

    On a checked rclpy it calls the C entry point directly (see the module docstring); elsewhere,
    or when the entry point has gone or no longer takes these arguments, it calls logger.info, so
    a change inside rclpy can cost speed but never a log line nor raise into the caller."""
    entry = _rcutils_log_entry() if rclpy_shortcuts() else None
    if entry is None:
        return logger.info
    from rclpy.logging import LoggingSeverity

    info, name = LoggingSeverity.INFO, logger.name

    def log(line: str) -> None:
        if not logger.is_enabled_for(info):
            return
        try:
            entry(info, name, line, function_name, file_path, line_number)
        except TypeError:  # its arguments changed within a supported version
            logger.info(line)

    return log
