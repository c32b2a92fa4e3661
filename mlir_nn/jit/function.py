"""``mlir_nn.jit``: trace an eager-style step once per input signature, then run it compiled.

The step function is ordinary eager code (forward, ``loss.backward()``,
``optimizer.step()``). Tracing runs it once on symbolic inputs: every tensor operation,
the backward pass and the optimizer's ``assign`` calls become one Graph. Tensors the
function reads from outside (weights, optimizer state) are captured as parameters; the
compiled step reads their ``.data`` on every call and updates it in place (a cuda step
inside ``mlir_nn.resident()`` keeps them on the device instead: ``mlir_nn.runtime.residency``).

Gradients inside a traced step start from zero (as after ``zero_grad``), and ``.grad``
of outside tensors is left as it was before the call.

This module is the driver: it picks the signature, traces it (``trace``) and hands the
graph to the compile pipeline (``pipeline``); ``step.CompiledStep`` runs the result.
Captured ``FedTensor``s (optimizer hyperparameters) are refreshed before every call, so
their current values are used without recompiling; a ``StructureGuard`` checks before
every call that the objects the step refers to have the structure it was traced with,
and re-traces when they do not (see ``mlir_nn.jit.guards``). A step may be called from
several threads; tracing is per thread and one signature is traced and compiled once.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from mlir_nn.backends import get_backend
from mlir_nn.ir import BATCH, Graph
from mlir_nn.jit.guards import StructureGuard
from mlir_nn.jit.pipeline import StepPipeline
from mlir_nn.jit.python_random import without_python_random
from mlir_nn.jit.step import CompiledStep
from mlir_nn.jit.tiered import first_tier_default, tiered_default
from mlir_nn.jit.trace import batch_is_shared, to_input_array, trace_step

Signature = tuple[tuple[tuple, str], ...]

DEFAULT_BACKEND = "cpu"
_INSTANCES: weakref.WeakSet[JitFunction] = weakref.WeakSet()


def _new_locks_after_fork() -> None:
    """A fork copies only the forking thread: a lock another thread held stays held forever."""
    for function in list(_INSTANCES):
        function._lock = threading.RLock()


os.register_at_fork(after_in_child=_new_locks_after_fork)


class JitFunction:
    """A step function compiled per input signature (ndim, shape without batch, dtype)."""

    def __init__(self, fn: Callable[..., Any], backend: str | None = None, dynamic_batch: bool = True,
                 optimize: bool = True, tiered: bool | None = None, allow_python_random: bool = False) -> None:
        backend = DEFAULT_BACKEND if backend is None else backend
        get_backend(backend)  # fail early on an unknown backend or one that cannot run here
        functools.update_wrapper(self, fn)
        self.fn, self.backend, self.dynamic_batch, self.optimize = fn, backend, dynamic_batch, optimize
        self.allow_python_random = allow_python_random
        self.tiered = tiered_default() if tiered is None else tiered
        first_tier = first_tier_default() if self.tiered else "interpreter"
        self.pipeline = StepPipeline(backend, optimize, self.tiered, first_tier)
        self._signature_of_fn = inspect.signature(fn)
        self._names = list(self._signature_of_fn.parameters)
        self._lock = threading.RLock()  # one thread traces and compiles a signature
        _INSTANCES.add(self)
        self._guard = StructureGuard(fn)
        self._reset()

    def _reset(self) -> None:
        """Forget every traced step (the compile caches make identical graphs cheap again)."""
        self._cache: dict[Signature, CompiledStep] = {}
        self._fast: dict[tuple, CompiledStep] = {}  # same steps, keyed for the call fast path
        self._last: CompiledStep | None = None  # the step of the previous call, tried first

    def _arg_names(self, count: int) -> list[str]:
        """The step's parameter names for ``count`` arguments (``argI`` past its signature)."""
        return [self._names[i] if i < len(self._names) else f"arg{i}" for i in range(count)]

    def _arrays(self, args: tuple) -> list[np.ndarray]:
        dtype = self._guard.parameter_dtype() or "float32"
        return [to_input_array(a, n, dtype) for a, n in zip(args, self._arg_names(len(args)))]

    def _positional(self, args: tuple, kwargs: dict[str, Any]) -> tuple:
        """``args`` and ``kwargs`` bound to the step's parameters, in order (defaults filled in)."""
        try:
            bound = self._signature_of_fn.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"jit: {self.fn.__name__}: {e}") from None
        bound.apply_defaults()
        if bound.kwargs:
            raise TypeError(f"jit: {self.fn.__name__}: keyword-only parameters are not supported "
                            f"({', '.join(bound.kwargs)}); make them positional")
        return bound.args

    def _signature(self, arrays: list[np.ndarray]) -> Signature:
        dynamic = self.dynamic_batch and batch_is_shared(arrays)
        return tuple(((BATCH,) + a.shape[1:] if dynamic else a.shape, a.dtype.name) for a in arrays)

    def _lower_arrays(self, arrays: list[np.ndarray]) -> CompiledStep:
        key = self._signature(arrays)
        step = self._cache.get(key)
        if step is not None:
            return step
        with self._lock:
            if key not in self._cache:
                names = self._arg_names(len(arrays))
                self.pipeline.before_trace()
                graph, captured, single = without_python_random(
                    self.fn, lambda: trace_step(self.fn, arrays, names, self.dynamic_batch), self.allow_python_random)
                self._guard.snapshot()  # the trace may have created optimizer state
                batch = arrays[0].shape[0] if arrays and arrays[0].ndim else None
                self._cache[key] = CompiledStep(graph, captured, single, self.pipeline, batch)
            return self._cache[key]

    def _check_structure(self) -> None:
        """Re-trace from scratch when the step's objects changed structure since the last trace."""
        if not self._guard.holds():
            with self._lock:
                if not self._guard.holds():
                    self._reset()
                    self._guard.snapshot()

    def lower(self, *args: Any, **kwargs: Any) -> CompiledStep:
        """Trace and compile for these arguments' signature (cached; waits for a tiered compile)."""
        self._check_structure()
        step = self._lower_arrays(self._arrays(self._positional(args, kwargs) if kwargs else args))
        step.finish_compile()
        return step

    def trace(self, *args: Any) -> Graph:
        self._check_structure()
        return self._lower_arrays(self._arrays(args)).graph

    def _fast_key(self, args: tuple) -> tuple | None:
        """A cheap signature for plain float C-contiguous native-order ndarray arguments, else None."""
        for a in args:
            if type(a) is not np.ndarray or a.dtype.kind != "f" or not a.flags.c_contiguous or not a.dtype.isnative:
                return None
        shared = self.dynamic_batch and batch_is_shared(args)  # type: ignore[arg-type]
        return shared, tuple((a.dtype, a.ndim, a.shape[1:] if shared else a.shape) for a in args)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            args = self._positional(args, kwargs)
        self._check_structure()
        step = self._last  # the previous call's step: its plain call is tried first
        outputs = None if step is None or step.run_plain is None else step.run_plain(args)
        if outputs is None:  # no plain call, or not plainly valid arguments
            step, outputs = self._run_general(args)
        # what the step function returned: one tensor, else a tuple of them (nothing: None)
        return outputs[0] if step.single else tuple(outputs) if outputs else None

    def _run_general(self, args: tuple) -> tuple[CompiledStep, list[np.ndarray]]:
        """The step for these arguments (found by their fast key, else traced and compiled once)
        and its outputs."""
        key = self._fast_key(args)
        step = self._fast.get(key) if key is not None else None
        if step is not None:
            return step, step.run(list(args))
        arrays = self._arrays(args)
        step = self._lower_arrays(arrays)
        if key is not None:
            self._fast[key] = step
        self._last = step
        return step, step.run(arrays)


def jit(fn: Callable[..., Any] | None = None, *, backend: str | None = None, dynamic_batch: bool = True,
        optimize: bool = True, tiered: bool | None = None, allow_python_random: bool = False) -> Any:
    """Compile an eager-style step function; usable as ``jit(f)`` or ``@jit(backend=...)``.

    ``optimize=False`` skips the e-graph optimizer (the backend runs the traced graph).
    ``tiered`` (default: ``MLIR_NN_TIERED``, on) runs the first calls of a new cpu step on the
    reference interpreter while another process compiles it (``mlir_nn.jit.tiered``).

    What a trace cannot capture is an error naming the user's line, never a frozen value: a
    traced tensor turned into a Python value (``float(t)``, ``bool(t)``, ``if t > 0:``,
    ``t.item()``, ``np.asarray(t)``: ``ConcretizationError``) and Python randomness (the
    ``random`` module, NumPy's generators: ``PythonRandomError``, see
    ``mlir_nn.jit.python_random``). ``allow_python_random=True`` says one draw at trace time,
    frozen into the step, is intended.
    """
    options = dict(backend=backend, dynamic_batch=dynamic_batch, optimize=optimize, tiered=tiered,
                   allow_python_random=allow_python_random)
    if fn is None:
        return lambda f: JitFunction(f, **options)
    return JitFunction(fn, **options)
