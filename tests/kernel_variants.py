"""The Triton kernel variants that code launches, keyed as Triton keys its compiles: each
kernel's compile-time constants and its other arguments' specialisations (an integer's
"is 1" / "multiple of 16", a pointer's dtype and 16-byte alignment), by Triton's own
``native_specialize_impl``. Under ``TRITON_INTERPRET=1`` nothing compiles; these keys name
the variants a GPU would compile for the same launches."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import multilora_studio.kernels

Variant = tuple[str, tuple[tuple[str, Any], ...]]


def triton_kernels() -> list[Any]:
    """Every ``@triton.jit`` kernel of ``multilora_studio.kernels``."""
    found: dict[int, Any] = {}
    for info in pkgutil.iter_modules(multilora_studio.kernels.__path__):
        module = importlib.import_module(f"multilora_studio.kernels.{info.name}")
        for value in vars(module).values():
            if hasattr(value, "pre_run_hooks") and hasattr(value, "fn"):
                found[id(value)] = value
    return list(found.values())


class VariantLog:
    """Records the variant of every launch of ``triton_kernels()`` while it is entered."""

    def __init__(self) -> None:
        self.variants: set[Variant] = set()
        self._hooks: list[tuple[Any, Any]] = []

    def __enter__(self) -> VariantLog:
        for kernel in triton_kernels():
            hook = self._hook_for(kernel)
            kernel.pre_run_hooks.append(hook)
            self._hooks.append((kernel, hook))
        return self

    def __exit__(self, *exc: object) -> None:
        for kernel, hook in self._hooks:
            kernel.pre_run_hooks.remove(hook)
        self._hooks.clear()

    def _hook_for(self, kernel: Any) -> Any:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend

        signature = inspect.signature(kernel.fn)
        params = list(signature.parameters.values())
        constexpr = {p.name for p in params if "constexpr" in str(p.annotation)}
        unspecialised = getattr(kernel, "do_not_specialize", None)
        if unspecialised is None:  # the interpreter keeps jit's arguments
            unspecialised = kernel.kwargs.get("do_not_specialize") or ()
        plain = {params[n].name if isinstance(n, int) else n for n in unspecialised}
        name = kernel.fn.__name__

        def hook(*args: Any, **kwargs: Any) -> None:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            key = tuple(
                (arg, value if arg in constexpr else native_specialize_impl(
                    BaseBackend, value, False, arg not in plain, True
                ))
                for arg, value in bound.arguments.items()
            )  # fmt: skip
            self.variants.add((name, key))

        return hook


def describe(variants: set[Variant]) -> str:
    """One line per variant: the kernel and each argument's key."""
    lines = [f"{name}({', '.join(f'{arg}={value}' for arg, value in key)})" for name, key in variants]
    return "\n".join(sorted(lines))
