"""Pure tensor functions compiled by TorchInductor per input signature, with no per-call guards.

:func:`torch.compile` evaluates TorchDynamo's guards on every call: for a model step with
a dozen tensor arguments that is a noticeable part of a sub-millisecond WISKI step, paid
at every step of every plan (docs/results/implementation-timings.md). A planner calls its
model with the same shapes every time, so :class:`SignatureCompiled` traces the function once per signature (the
shapes, strides and dtypes of its arguments) with ``make_fx`` and compiles the graph with
TorchInductor directly: a call is then a dictionary lookup and the compiled code, whose
own entry checks each argument's size and stride. Past ``max_signatures`` distinct
signatures (callers with ever-changing batch sizes) it calls ``fallback`` instead of
compiling again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch import Tensor

from gpdyn.errors import InputError


class SignatureCompiled:
    """``function(*tensors)`` (pure: tensors in, tensors out, no Python state read at call
    time) compiled once per argument signature (shapes, strides, dtypes, devices), or
    ``fallback(*tensors)`` past ``max_signatures`` of them. Compile errors propagate (wrap
    calls in :func:`compile_errors`, or use :func:`traced`)."""

    def __init__(self, function: Callable[..., Any], fallback: Callable[..., Any], max_signatures: int = 4) -> None:
        self.function, self.fallback, self.max_signatures = function, fallback, int(max_signatures)
        self._compiled: dict[tuple[Any, ...], Callable[..., Any]] = {}

    def __call__(self, *tensors: Tensor) -> Any:
        key = tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors)
        compiled = self._compiled.get(key)
        if compiled is None:
            if len(self._compiled) >= self.max_signatures:
                return self.fallback(*tensors)
            compiled = self._compiled[key] = self._compile(tensors)
        return compiled(*tensors)

    def _compile(self, tensors: tuple[Tensor, ...]) -> Callable[..., Any]:
        import torch._inductor
        from torch.fx.experimental.proxy_tensor import make_fx

        graph = make_fx(self.function)(*tensors)
        return torch._inductor.compile(graph, list(tensors))


@contextlib.contextmanager
def compile_errors(what: str, eager_option: str, error: type[InputError] = InputError) -> Iterator[None]:
    """A failure of compiled code inside the block (its C++ toolchain, or the code it generated)
    as ``error`` naming ``what`` and the option that runs it eagerly; the caller's own
    :class:`~gpdyn.errors.InputError` passes through."""
    try:
        yield
    except InputError:
        raise
    except Exception as failure:
        raise error(f"{what}: compiling it failed ({type(failure).__name__}: {failure}); it needs a working C++ "
                    f"compiler; {eager_option} runs it eagerly") from failure


def traced(function: Any, option: str) -> Any:
    """``function`` compiled per argument signature (:class:`SignatureCompiled`, falling back to
    itself) when it declares itself ``traceable`` (a true attribute: straight-line tensor code,
    no Python control flow on values, which a trace would freeze into one branch), else
    ``function`` unchanged. A compile failure is an :class:`~gpdyn.errors.InputError` naming
    ``option``, the setting that runs it eagerly (:func:`compile_errors`)."""
    if not getattr(function, "traceable", False):
        return function
    compiled = SignatureCompiled(function, fallback=function)
    name = type(function).__name__

    def call(*tensors: Tensor) -> Any:
        with compile_errors(name, option):
            return compiled(*tensors)

    return call
