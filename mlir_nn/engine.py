"""Tensors with reverse-mode autodiff, eager or traced.

Every tensor operation goes through ``apply``, which checks operands with the op's shape
rule and then either evaluates it with the NumPy reference (eager mode) or records an IR
node (while ``mlir_nn.jit`` traces a step). ``backward`` walks the tensor graph and calls
the registry's VJP rules through the same ``apply``, so the backward pass is made of
ordinary IR nodes: evaluated at once in eager mode, appended to the traced graph otherwise.

Dtypes follow NumPy: a tensor made from Python numbers or lists is float64, a float array
keeps its dtype, and a Python number used as an operand takes the other operand's dtype.
Eager operands of different dtypes promote to float64 (a ``cast`` node, so gradients flow
back in each operand's own dtype). A traced step computes in one dtype: mixing float32 and
float64 tensors there, or ``astype`` to the other one, raises DTypeError naming the op.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import numpy as np

from mlir_nn.ir import DTypeError, Node, ShapeError, TensorType, make_node, op_def
from mlir_nn.ir.shapes import BATCH, broadcast_shapes, dtype_name, fmt_shape, normalize_axes, numpy_name
from mlir_nn.support.user_frame import describe, user_frame

LEAF = "leaf"


class Trace:
    """State of one trace: captured tensors become parameters, assignments updates."""

    def __init__(self) -> None:
        self.inputs: list[Node] = []
        self.captured: list[Tensor] = []
        self.param_nodes: list[Node] = []
        self._param_of: dict[int, Node] = {}
        self.current: dict[int, Tensor] = {}  # captured tensor id -> value after assign
        self.updates: dict[int, Tensor] = {}
        self.saved_grads: dict[int, tuple[Tensor, Tensor | None]] = {}
        self.closed = False

    def add_input(self, name: str, shape: tuple, dtype: str) -> Tensor:
        node = make_node("input", (), name=name, shape=tuple(shape), dtype=dtype)
        self.inputs.append(node)
        return Tensor._symbolic(node, self, label=name)

    def node_of(self, t: Tensor) -> Node:
        """The IR node standing for ``t`` in this trace (capturing it if concrete)."""
        if t._trace is not None:
            if t._trace is not self or self.closed:
                raise RuntimeError("a tensor from a finished trace was used; trace values exist only inside the step")
            return t._node  # type: ignore[return-value]
        t = t._base if t._base is not None else t
        key = id(t)
        if key in self.current:
            return self.current[key]._node  # type: ignore[return-value]
        if key not in self._param_of:
            if t._op == "const":
                return make_node("const", (), value=t._attrs["value"], dtype=t.dtype)
            name = f"p{len(self.captured)}"
            node = make_node("param", (), name=name, shape=t.shape, dtype=t.dtype, label=t.label)
            self._param_of[key] = node
            self.captured.append(t)
            self.param_nodes.append(node)
        return self._param_of[key]

    def param_node_of(self, key: int) -> Node:
        return self._param_of[key]

    def resolve(self, t: Tensor) -> Tensor:
        """``t`` itself, or the value assigned to it (or to the tensor it is a view of) earlier in this trace."""
        if t._trace is not None:
            return t
        base = t._base if t._base is not None else t
        return self.current.get(id(base), t)

    def holds_state(self, t: Tensor) -> bool:
        """True when ``t`` (a concrete tensor) is state of this step: captured or assigned so far."""
        base = t._base if t._base is not None else t
        return id(base) in self._param_of or id(base) in self.current

    def assign(self, target: Tensor, value: Tensor) -> None:
        target = target._base if target._base is not None else target
        value = self.resolve(value)
        self.node_of(target)  # make sure the target is captured as a parameter
        self.current[id(target)] = value
        self.updates[id(target)] = value

    def save_grad(self, t: Tensor) -> None:
        """Remember a concrete tensor's grad so the trace can give it back untouched."""
        if t._trace is None and id(t) not in self.saved_grads:
            self.saved_grads[id(t)] = (t, t._grad)

    def close(self) -> None:
        self.closed = True
        for t, grad in self.saved_grads.values():
            t._grad = grad


# The trace being recorded in this thread (a context variable: other threads, and eager
# code running in them, never see it).
_TRACE: ContextVar[Trace | None] = ContextVar("mlir_nn_trace", default=None)


def current_trace() -> Trace | None:
    return _TRACE.get()


def set_trace(trace: Trace | None) -> None:
    _TRACE.set(trace)


# ---------------------------------------------------------------------------- grad mode

_GRAD_ENABLED: ContextVar[bool] = ContextVar("mlir_nn_grad_enabled", default=True)


def is_grad_enabled() -> bool:
    """False inside ``no_grad()``: new tensors then record no operations (no gradients flow)."""
    return _GRAD_ENABLED.get()


class _GradMode:
    """A context manager (and decorator) that sets whether operations are recorded for autograd."""

    enabled = True

    def __enter__(self) -> None:
        self._token = _GRAD_ENABLED.set(self.enabled)

    def __exit__(self, *exc: object) -> None:
        _GRAD_ENABLED.reset(self._token)

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with type(self)():
                return fn(*args, **kwargs)
        return wrapped


class no_grad(_GradMode):  # noqa: N801 (PyTorch's name)
    """PyTorch's ``no_grad``: results computed inside record no gradient history, and in-place
    updates of parameters (``p -= lr * p.grad``) are allowed; inside ``mlir_nn.jit`` such an
    update is traced as a parameter update of the step."""

    enabled = False


class enable_grad(_GradMode):  # noqa: N801 (PyTorch's name)
    """Turn gradient recording back on inside ``no_grad``."""

    enabled = True


class ConcretizationError(RuntimeError):
    """A traced tensor was turned into a Python value (``float``, ``bool``, ``.item()``, NumPy):
    inside ``mlir_nn.jit`` it has no value until the compiled step runs."""


def _concretization_error(what: str, t: Tensor) -> ConcretizationError:
    where = describe(user_frame())
    return ConcretizationError(
        f"{what} of a traced tensor {t.label or ''}{fmt_shape(t.shape)}:{t.dtype} at {where}. Inside "
        "mlir_nn.jit a tensor has no value until the compiled step runs, so Python cannot branch on it or "
        "read it (the value seen while tracing would be frozen into the step). Keep it a tensor "
        "(tensor ops such as maximum/minimum/clamp, comparisons as 0/1 masks), return it from the step and read "
        "it after the call, or move this code outside the jitted function."
    )


def _default_dtype(data: Any) -> str:
    """A float array's own dtype; float64 for Python numbers, lists and integer arrays (NumPy's rule)."""
    if isinstance(data, (np.ndarray, np.generic)) and np.issubdtype(np.asarray(data).dtype, np.floating):
        return dtype_name(np.asarray(data).dtype)
    return "float64"


def numeric_array(data: Any, what: str) -> np.ndarray:
    """``data`` (a Tensor, number, nested lists or array) as an array of bools, ints or floats."""
    if isinstance(data, Tensor):
        data = data.data
    try:
        raw = np.asarray(data)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{what} must be numeric (a number, nested lists or a numpy array): {e}") from None
    if raw.dtype.kind not in "biuf":
        raise TypeError(f"{what} must be numeric, got dtype {raw.dtype} ({type(data).__name__})")
    return raw


def state_array(data: Any, what: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``data`` as a new array of ``dtype`` and ``shape`` holding finite numbers (checked after
    the cast, so 1e40 bound for float32 is refused), for loading into a parameter or state."""
    raw = numeric_array(data, what)
    if raw.shape != tuple(shape):
        raise ShapeError(f"{what} has shape {fmt_shape(raw.shape)}, expected {fmt_shape(tuple(shape))}")
    with np.errstate(over="ignore", invalid="ignore"):
        cast = raw.astype(dtype)
    if not np.all(np.isfinite(cast)):
        raise ValueError(f"{what} must hold finite {np.dtype(dtype).name} numbers; it has NaN, infinity or values "
                         f"beyond {np.dtype(dtype).name}'s range")
    return cast


def _to_array(data: Any, dtype: str | None) -> np.ndarray:
    return np.array(numeric_array(data, "Tensor: data"), dtype=dtype or _default_dtype(data), copy=True)


class Tensor:
    """An n-d array that records the operations producing it (tinynn's Value, for tensors)."""

    __array_priority__ = 100  # so ndarray + Tensor defers to Tensor.__radd__

    def __init__(self, data: Any, label: str = "", dtype: Any = None) -> None:
        self._data: np.ndarray | None = _to_array(data, dtype_name(dtype) if dtype is not None else None)
        dtype_name(self._data.dtype)
        self._grad: Tensor | None = None
        self.label = label
        self._op = LEAF
        self._inputs: tuple[Tensor, ...] = ()
        self._attrs: dict[str, Any] = {}
        self._node: Node | None = None
        self._trace: Trace | None = None
        self._requires_grad = True
        self._base: Tensor | None = None  # the tensor this one is a detached view of

    @classmethod
    def _leaf(cls, data: np.ndarray | None, node: Node | None, trace: Trace | None, label: str) -> Tensor:
        """A leaf that requires a gradient, holding ``data`` as it is (or a traced ``node``)."""
        t = cls.__new__(cls)
        t._data, t._grad, t.label = data, None, label
        t._op, t._inputs, t._attrs = LEAF, (), {}
        t._node, t._trace = node, trace
        t._requires_grad, t._base = True, None
        return t

    @classmethod
    def _owning(cls, array: np.ndarray, label: str = "") -> Tensor:
        """A leaf holding ``array`` itself, not a copy: for arrays made just for it (an optimizer's
        zero state, whose pages ``np.zeros`` leaves untouched until the step writes them; copied,
        a 16x1024 MLP's Adam state took up to 0.36 s of its first call)."""
        dtype_name(array.dtype)
        return cls._leaf(array, None, None, label)

    @classmethod
    def _symbolic(cls, node: Node, trace: Trace, label: str = "") -> Tensor:
        return cls._leaf(None, node, trace, label)

    # ------------------------------------------------------------------ data access

    @property
    def data(self) -> Any:
        """The values as a numpy array. Inside ``mlir_nn.jit`` (where values do not exist yet) it is
        a detached view instead: ``p.data -= lr * p.grad`` is traced as an update of ``p``."""
        if current_trace() is not None:
            return self.detach()
        if self._data is None:
            raise RuntimeError(
                f"tensor {self.label or ''} {fmt_shape(self.shape)} is being traced by mlir_nn.jit: "
                "its value exists only when the compiled step runs"
            )
        return self._data

    @data.setter
    def data(self, value: Any) -> None:
        if current_trace() is not None:
            self.assign(value)
            return
        array = _to_array(value, self.dtype)
        if self._data is not None and array.shape != self._data.shape:
            raise ShapeError(f"Tensor.data: new value has shape {array.shape}, expected {self._data.shape}")
        self._data = array

    @property
    def grad(self) -> Any:
        """The gradient as a numpy array (zeros before any backward); inside ``mlir_nn.jit``, the
        traced gradient tensor of the step's ``backward()``."""
        trace = current_trace()
        if trace is not None and self._grad is not None and self._grad._trace is trace:
            return self._grad
        if self._grad is None or trace is not None:
            return np.zeros(self.shape, dtype=self.dtype)
        return self._grad.data

    @grad.setter
    def grad(self, value: Any) -> None:
        trace = current_trace()
        if trace is not None:
            trace.save_grad(self)
        if value is None or (np.isscalar(value) and value == 0):
            self._grad = None
        else:
            self._grad = Tensor(np.broadcast_to(_to_array(value, self.dtype), self.shape))

    @property
    def shape(self) -> tuple:
        return self._node.shape if self._data is None else self._data.shape  # type: ignore[union-attr]

    @property
    def dtype(self) -> str:
        return self._node.dtype if self._data is None else numpy_name(self._data.dtype)  # type: ignore[union-attr]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def _value(self, what: str) -> np.ndarray:
        """The numpy value for a conversion to Python; a ConcretizationError while tracing."""
        trace = current_trace()
        if self._trace is not None or (trace is not None and trace.holds_state(self)):
            raise _concretization_error(what, self)
        return self._data if self._data is not None else self.data

    def numpy(self) -> np.ndarray:
        return self._value("Tensor.numpy()")

    def item(self) -> float:
        """The value of a one-element tensor as a Python number."""
        value = self._value("Tensor.item()")
        if value.size != 1:
            raise ValueError(f"item: tensor {fmt_shape(self.shape)} has {value.size} elements; expected exactly one")
        return value.item()

    def __float__(self) -> float:
        return float(self._one("float()"))

    def __int__(self) -> int:
        return int(self._one("int()"))

    def __bool__(self) -> bool:
        return bool(self._one("bool()"))

    def _one(self, what: str) -> np.ndarray:
        value = self._value(what)
        if value.size != 1:
            raise ValueError(f"{what} of a tensor with {value.size} elements {fmt_shape(self.shape)} is ambiguous; "
                             "expected exactly one element (reduce it first, e.g. .sum() or .max())")
        return value.reshape(())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """NumPy sees the values (``np.asarray(t)``); a ConcretizationError while tracing."""
        value = self._value("np.asarray()")
        return value.astype(dtype) if dtype is not None and value.dtype != dtype else value

    # ------------------------------------------------------------------ autograd controls

    @property
    def requires_grad(self) -> bool:
        """Whether ``backward`` computes a gradient for this tensor (True by default, as tinynn)."""
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self._requires_grad = bool(value)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self) -> bool:
        return self._op in (LEAF, "const")

    def detach(self) -> Tensor:
        """The same values with no gradient history; in-place updates of it update this tensor."""
        if self._trace is not None:
            t = Tensor._symbolic(self._node, self._trace, label=self.label)  # type: ignore[arg-type]
        else:
            t = Tensor.__new__(Tensor)
            t._data, t._grad, t.label, t._node, t._trace = self._data, None, self.label, None, None
            t._op, t._inputs, t._attrs = LEAF, (), {}
            t._base = self._base if self._base is not None else self
        t._requires_grad = False
        return t

    def _inplace(self, op: str, other: Any) -> Tensor:
        """``self op= other``: an update of a leaf in place (traced as an update of a parameter); a
        computed or traced tensor is rebound instead, as in micrograd (NotImplemented)."""
        if self._trace is not None or self._op != LEAF:
            return NotImplemented
        if self._requires_grad and is_grad_enabled():
            raise RuntimeError(
                f"in-place {op} of {self.label or 'a tensor'} {fmt_shape(self.shape)} at {describe(user_frame())}: "
                "it is a leaf that requires grad. Update parameters inside `with mlir_nn.no_grad():` (as PyTorch "
                "does), or write `x = x + ...` for a new tensor")
        with no_grad():
            self.assign(apply(op, self, other))
        return self

    def __iadd__(self, other: Any) -> Tensor:
        return self._inplace("add", other)

    def __isub__(self, other: Any) -> Tensor:
        return self._inplace("sub", other)

    def __imul__(self, other: Any) -> Tensor:
        return self._inplace("mul", other)

    def __itruediv__(self, other: Any) -> Tensor:
        return self._inplace("div", other)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        if self.shape[0] == BATCH:
            raise TypeError("len() of a traced tensor with a dynamic batch dimension is not known at trace time")
        return int(self.shape[0])

    def __repr__(self) -> str:
        label = f", label={self.label!r}" if self.label else ""
        if self._data is None:
            return f"Tensor(<traced {fmt_shape(self.shape)}:{self.dtype}>{label})"
        return f"Tensor({np.array2string(self._data, precision=4, threshold=20)}, dtype={self.dtype}{label})"

    # ------------------------------------------------------------------ arithmetic

    def __add__(self, other: Any) -> Tensor:
        return apply("add", self, other)

    def __radd__(self, other: Any) -> Tensor:
        return apply("add", other, self)

    def __sub__(self, other: Any) -> Tensor:
        return apply("sub", self, other)

    def __rsub__(self, other: Any) -> Tensor:
        return apply("sub", other, self)

    def __mul__(self, other: Any) -> Tensor:
        return apply("mul", self, other)

    def __rmul__(self, other: Any) -> Tensor:
        return apply("mul", other, self)

    def __truediv__(self, other: Any) -> Tensor:
        return apply("div", self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return apply("div", other, self)

    def __neg__(self) -> Tensor:
        return apply("neg", self)

    def __pow__(self, exponent: Any) -> Tensor:
        if not isinstance(exponent, numbers.Real) or isinstance(exponent, bool):
            raise TypeError(f"pow: exponent must be a Python number, got {type(exponent).__name__}")
        return apply("pow", self, exponent=float(exponent))

    def __matmul__(self, other: Any) -> Tensor:
        return matmul(self, other)

    def __rmatmul__(self, other: Any) -> Tensor:
        return matmul(other, self)

    def relu(self) -> Tensor:
        return apply("relu", self)

    def tanh(self) -> Tensor:
        return apply("tanh", self)

    def sigmoid(self) -> Tensor:
        return apply("sigmoid", self)

    def exp(self) -> Tensor:
        return apply("exp", self)

    def log(self) -> Tensor:
        return apply("log", self)

    def sqrt(self) -> Tensor:
        return apply("sqrt", self)

    def abs(self) -> Tensor:
        return apply("abs", self)

    def clamp(self, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 (PyTorch's names)
        """Values limited to [min, max] (either may be None), as ``maximum``/``minimum``."""
        if min is None and max is None:
            raise ValueError("clamp: give min, max or both")
        out = self if min is None else apply("maximum", self, min)
        return out if max is None else apply("minimum", out, max)

    def sum(self, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Tensor:
        return apply("sum", self, axes=normalize_axes("sum", axis, self.ndim), keepdims=keepdims)

    def mean(self, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Tensor:
        return apply("mean", self, axes=normalize_axes("mean", axis, self.ndim), keepdims=keepdims)

    def transpose(self, *perm: int) -> Tensor:
        """Two axes ``transpose(i, j)`` swap them (PyTorch); a whole permutation (one tuple, or
        as many axes as the rank) permutes (NumPy); no axes reverse them."""
        perm_t = tuple(perm[0]) if len(perm) == 1 and isinstance(perm[0], (tuple, list)) else perm
        if len(perm) == 2 and self.ndim != 2:
            return swapaxes(self, perm[0], perm[1])
        return apply("transpose", self, perm=perm_t or tuple(reversed(range(self.ndim))))

    @property
    def T(self) -> Tensor:
        return self if self.ndim < 2 else self.transpose()

    def reshape(self, *shape: Any) -> Tensor:
        target = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return apply("reshape", self, shape=_infer_reshape(self.shape, target))

    def broadcast_to(self, shape: tuple) -> Tensor:
        return apply("broadcast_to", self, shape=tuple(shape))

    def astype(self, dtype: Any) -> Tensor:
        """This tensor in ``dtype`` (itself when it already has it); gradients flow back."""
        dtype = dtype_name(dtype)
        if dtype == self.dtype:
            return self
        if current_trace() is not None:
            raise DTypeError(f"astype: a traced step computes in one dtype; {self.label or 'tensor'} "
                             f"{fmt_shape(self.shape)} is {self.dtype}, asked for {dtype} "
                             "(cast the data outside the step)")
        return apply("cast", self, dtype=dtype)

    def max(self, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Tensor:
        """Maximum over ``axis``; the gradient is shared evenly between ties (PyTorch's amax)."""
        return apply("max", self, axes=normalize_axes("max", axis, self.ndim), keepdims=keepdims)

    def argmax(self, axis: int | None = None) -> np.ndarray:
        """Indices of the maxima, as numpy's argmax (eager only: indices have no gradient)."""
        return np.argmax(self.data, axis=axis)

    def log_softmax(self, axis: int = -1) -> Tensor:
        """log(softmax(x)) along ``axis``, computed as x - max - log(sum(exp(x - max)))."""
        return apply("log_softmax", self, axis=normalize_axes("log_softmax", axis, self.ndim)[0])

    def softmax(self, axis: int = -1) -> Tensor:
        """exp(x - max) / sum(exp(x - max)) along ``axis``: finite for any finite x."""
        return apply("softmax", self, axis=normalize_axes("softmax", axis, self.ndim)[0])

    def assign(self, value: Any) -> None:
        """Overwrite this tensor's value in place (traced as a parameter update)."""
        value = value if isinstance(value, Tensor) else Tensor(value, dtype=self.dtype)
        if value.shape != self.shape or value.dtype != self.dtype:
            raise ShapeError(
                f"assign: value {fmt_shape(value.shape)}:{value.dtype} does not fit "
                f"{self.label or 'tensor'} {fmt_shape(self.shape)}:{self.dtype}"
            )
        trace = current_trace()
        if trace is not None:
            trace.assign(self, value)
        else:
            self.data[...] = value.data

    # ------------------------------------------------------------------ indexing and shapes (issue 23)

    def __getitem__(self, key: Any) -> Tensor:
        return getitem(self, key)

    # Comparisons give 0/1 masks of the operands' dtype (no gradient), as eq does.
    def __lt__(self, other: Any) -> Tensor:
        return apply("lt", self, other)

    def __le__(self, other: Any) -> Tensor:
        return apply("le", self, other)

    def __gt__(self, other: Any) -> Tensor:
        return apply("gt", self, other)

    def __ge__(self, other: Any) -> Tensor:
        return apply("ge", self, other)

    def lt(self, other: Any) -> Tensor:
        return apply("lt", self, other)

    def le(self, other: Any) -> Tensor:
        return apply("le", self, other)

    def gt(self, other: Any) -> Tensor:
        return apply("gt", self, other)

    def ge(self, other: Any) -> Tensor:
        return apply("ge", self, other)

    def eq(self, other: Any) -> Tensor:
        """1.0 where equal, else 0.0 (``==`` keeps Python's identity meaning for tensors)."""
        return apply("eq", self, other)

    def ne(self, other: Any) -> Tensor:
        return apply("ne", self, other)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[normalize_axes("size", dim, self.ndim)[0]]

    def view(self, *shape: Any) -> Tensor:
        return self.reshape(*shape)

    def contiguous(self) -> Tensor:
        return self

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        first, last = (normalize_axes("flatten", d, self.ndim)[0] for d in (start_dim, end_dim))
        return self.reshape(*self.shape[:first], -1, *self.shape[last + 1:])

    def unsqueeze(self, dim: int) -> Tensor:
        axis = normalize_axes("unsqueeze", dim, self.ndim + 1)[0]
        return apply("reshape", self, shape=self.shape[:axis] + (1,) + self.shape[axis:])

    def squeeze(self, dim: int | tuple[int, ...] | None = None) -> Tensor:
        axes = normalize_axes("squeeze", dim, self.ndim)
        return apply("reshape", self, shape=tuple(d for i, d in enumerate(self.shape) if i not in axes or d != 1))

    def permute(self, *dims: Any) -> Tensor:
        perm = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        if len(perm) != self.ndim:
            raise ShapeError(f"permute: {perm} does not name each of the {self.ndim} axes of {fmt_shape(self.shape)}")
        return apply("transpose", self, perm=tuple(normalize_axes("permute", p, self.ndim)[0] for p in perm))

    def expand(self, *sizes: Any) -> Tensor:
        target = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
        lead = len(target) - self.ndim
        if lead < 0:
            raise ShapeError(f"expand: {target} has fewer axes than {fmt_shape(self.shape)}")
        shape = tuple(self.shape[i - lead] if d == -1 and i >= lead else d for i, d in enumerate(target))
        return self if shape == self.shape else apply("broadcast_to", self, shape=shape)

    def index_select(self, dim: int, index: Any) -> Tensor:
        return index_select(self, dim, index)

    def gather(self, dim: int, index: Any) -> Tensor:
        return gather(self, dim, index)

    def masked_fill(self, mask: Any, value: float) -> Tensor:
        """``value`` where ``mask`` is nonzero (True), else this tensor."""
        return apply("where", _mask_like(mask, self, "masked_fill"), float(value), self)

    def tril(self, diagonal: int = 0) -> Tensor:
        return tril(self, diagonal)

    def triu(self, diagonal: int = 0) -> Tensor:
        return triu(self, diagonal)

    def split(self, split_size_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
        return split(self, split_size_or_sections, dim)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        return chunk(self, chunks, dim)

    # ------------------------------------------------------------------ autodiff

    def backward(self, gradient: Any = None) -> None:
        """Fill ``.grad`` of every tensor this one depends on (d self / d tensor).

        As in PyTorch, a non-scalar tensor needs ``gradient`` (of its shape): the vector
        the Jacobian is multiplied with.
        """
        order = _topo_tensors(self)
        trace = current_trace()
        grads: dict[int, Tensor] = {id(self): self._seed(gradient)}
        for t in reversed(order):
            g = grads.pop(id(t), None)
            if g is None or not t._requires_grad:
                continue
            if trace is not None:
                trace.save_grad(t)
                prior = t._grad if t._grad is not None and t._grad._trace is trace else None
            else:
                prior = t._grad
            t._grad = g if prior is None else apply("add", prior, g)
            if t._op in (LEAF, "const"):
                continue
            rule = op_def(t._op).vjp
            if rule is None:
                raise NotImplementedError(f"backward: op {t._op!r} has no gradient rule")
            for inp, ig in zip(t._inputs, rule(apply, list(t._inputs), t, g, t._attrs)):
                if ig is None or inp._op == "const" or not inp._requires_grad:
                    continue
                grads[id(inp)] = ig if id(inp) not in grads else apply("add", grads[id(inp)], ig)


    def _seed(self, gradient: Any) -> Tensor:
        if gradient is None:
            if BATCH in self.shape or int(np.prod(self.shape, dtype=np.int64)) != 1:
                raise RuntimeError(
                    f"backward: tensor of shape {fmt_shape(self.shape)} is not a scalar; pass gradient= "
                    "(a tensor of its shape), or reduce it first (e.g. .sum())"
                )
            seed = _operand(1.0, self.dtype, "backward")
            return seed if self.shape == () else seed.broadcast_to(self.shape)
        seed = gradient if isinstance(gradient, Tensor) else Tensor(gradient, dtype=self.dtype)
        if seed.shape != self.shape or seed.dtype != self.dtype:
            raise ShapeError(
                f"backward: gradient {fmt_shape(seed.shape)}:{seed.dtype} does not match the tensor "
                f"{fmt_shape(self.shape)}:{self.dtype}; expected the same shape and dtype"
            )
        return seed


Value = Tensor


def stack(tensors: list[Any], dim: int = 0) -> Tensor:
    """Tensors (or numbers) of one shape stacked along a new axis ``dim``, with autograd."""
    if not tensors:
        raise ShapeError("stack: got an empty list; expected at least one tensor")
    if dim != 0:
        parts = [t if isinstance(t, Tensor) else Tensor(t) for t in tensors]
        return cat([t.unsqueeze(dim) for t in parts], dim)
    dtypes = [t.dtype for t in tensors if isinstance(t, Tensor)]
    dtype = np.result_type(*dtypes).name if dtypes else "float64"
    return apply("stack", *[t.astype(dtype) if isinstance(t, Tensor) else t for t in tensors])


def maximum(a: Any, b: Any) -> Tensor:
    """Elementwise maximum with broadcasting (ties share the gradient, as PyTorch)."""
    return apply("maximum", a, b)


def minimum(a: Any, b: Any) -> Tensor:
    """Elementwise minimum with broadcasting (ties share the gradient, as PyTorch)."""
    return apply("minimum", a, b)


def _topo_tensors(root: Tensor) -> list[Tensor]:
    order: list[Tensor] = []
    seen: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:
        t, expanded = stack.pop()
        if expanded:
            order.append(t)
            continue
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.append((t, True))
        stack.extend((i, False) for i in t._inputs if id(i) not in seen)
    return order


def _infer_reshape(shape: tuple, target: tuple) -> tuple:
    """Replace a single -1 in ``target`` so that element counts match."""
    if -1 not in target:
        return tuple(target)
    if list(target).count(-1) > 1:
        raise ShapeError(f"reshape: only one -1 allowed in {target}")
    if BATCH in shape:
        raise ShapeError(f"reshape: -1 is not supported on a traced batch dimension {fmt_shape(shape)}")
    known = int(np.prod([d for d in target if d != -1], dtype=np.int64))
    total = int(np.prod(shape, dtype=np.int64))
    if known == 0 or total % known:
        raise ShapeError(f"reshape: cannot reshape {fmt_shape(shape)} to {target}")
    return tuple(total // known if d == -1 else d for d in target)


def _operand(value: Any, dtype: str, op: str) -> Tensor:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        t = Tensor(np.array(float(value), dtype=dtype))
        t._op, t._attrs = "const", {"value": float(value)}
        return t
    if isinstance(value, (np.ndarray, list, tuple)):
        return Tensor(value, dtype=dtype)
    raise TypeError(f"{op}: cannot use an operand of type {type(value).__name__}; expected a Tensor or a number")


def _promoted(operands: tuple, trace: Trace | None) -> tuple[str, tuple]:
    """The dtype Python-number operands take, and the operands with eager mixed dtypes cast to float64."""
    dtypes = [o.dtype for o in operands if isinstance(o, Tensor)]
    if not dtypes:
        return "float64", operands
    if trace is not None or len(set(dtypes)) == 1:
        return dtypes[0], operands
    return "float64", tuple(apply("cast", o, dtype="float64") if isinstance(o, Tensor) and o.dtype != "float64"
                            else o for o in operands)


def apply(op: str, *operands: Any, **attrs: Any) -> Tensor:
    """Apply a registered op: evaluate it eagerly, or record it while tracing."""
    trace = current_trace()
    dtype, operands = _promoted(operands, trace)
    tensors = [_operand(o, dtype, op) for o in operands]
    definition = op_def(op)
    if trace is not None:
        tensors = [trace.resolve(t) for t in tensors]
        node = make_node(op, [trace.node_of(t) for t in tensors], **attrs)
        out = Tensor._symbolic(node, trace)
    else:
        result_type: TensorType = definition.infer([TensorType(t.shape, t.dtype) for t in tensors], attrs)
        value = definition.reference([t.data for t in tensors], attrs, tuple(result_type.shape))
        out = Tensor.__new__(Tensor)
        out._data = np.asarray(value, dtype=result_type.dtype)
        out._grad, out.label, out._node, out._trace, out._base = None, "", None, None, None
    if is_grad_enabled() and any(t._requires_grad for t in tensors if t._op != "const"):
        out._op, out._inputs, out._attrs, out._requires_grad = op, tuple(tensors), attrs, True
    else:  # nothing to differentiate: a detached leaf
        out._op, out._inputs, out._attrs, out._requires_grad = LEAF, (), {}, False
    return out


def matmul(a: Any, b: Any) -> Tensor:
    """Matrix product with NumPy's and PyTorch's rules: 1-D operands are a row / column vector,
    more than two axes are batches of matrices that broadcast against each other."""
    if not isinstance(a, Tensor):
        a = Tensor(a, dtype=b.dtype)
    if not isinstance(b, Tensor):
        b = Tensor(b, dtype=a.dtype)
    if a.dtype != b.dtype:
        if current_trace() is not None:
            raise DTypeError(f"matmul: operands have dtypes {a.dtype} and {b.dtype}; a traced step computes in "
                             "one dtype (cast with astype)")
        a, b = a.astype("float64"), b.astype("float64")
    if a.ndim == 1 and b.ndim in (1, 2):
        row = matmul(a.reshape(1, a.shape[0]), b)
        return row.reshape(()) if b.ndim == 1 else row.reshape(row.shape[1])
    if b.ndim == 1 and a.ndim == 2:
        return matmul(a, b.reshape(b.shape[0], 1)).reshape(a.shape[0])
    if a.ndim > 2 or b.ndim > 2:
        return batched_matmul(a, b)
    return apply("matmul", a, b)


# ---------------------------------------------------------------------------- indexing and shapes (issue 23)
# Index tensors are float tensors of the indexed tensor's dtype (see mlir_nn.ir.sequence_ops);
# concrete ones (arrays, lists, eager tensors) are converted here.


def _static_axis(op: str, shape: tuple, axis: int) -> int:
    if shape[axis] == BATCH:
        raise ShapeError(f"{op}: axis {axis} of {fmt_shape(shape)} is the batch dimension of a traced step; "
                         "it can only be taken whole")
    return int(shape[axis])


def _index_like(index: Any, x: Tensor, op: str) -> Tensor:
    """An index operand as a tensor of ``x``'s dtype (indices carry no gradient)."""
    if isinstance(index, Tensor):
        if index.dtype == x.dtype:
            return index
        if index._data is None:
            raise DTypeError(f"{op}: a traced index tensor is {index.dtype}, the indexed tensor {x.dtype}; "
                             "expected one dtype")
        index = index.data
    array = numeric_array(index, f"{op}: index")
    if array.dtype.kind == "b":
        raise TypeError(f"{op}: boolean masks cannot index (the result's shape would depend on the data); "
                        "use masked_fill or where")
    return Tensor(array, dtype=x.dtype)


def _mask_like(mask: Any, x: Tensor, op: str) -> Tensor:
    """A condition as a tensor of ``x``'s dtype: 1.0 where true (nonzero), else 0.0."""
    if isinstance(mask, Tensor) and (mask.dtype == x.dtype or mask._data is None):
        return mask
    return Tensor(numeric_array(mask, f"{op}: mask") != 0, dtype=x.dtype)


def getitem(x: Tensor, key: Any) -> Tensor:
    """``x[key]`` with ints, slices (any step), None, ``...`` and one integer array or tensor."""
    items = list(key) if isinstance(key, tuple) else [key]
    ellipses = [i for i, item in enumerate(items) if item is Ellipsis]
    consumed = sum(1 for item in items if item is not None and item is not Ellipsis)
    if len(ellipses) > 1 or consumed > x.ndim:
        raise IndexError(f"__getitem__: {key!r} does not index a tensor of shape {fmt_shape(x.shape)} "
                         "(at most one '...' and one index per axis)")
    fill = [slice(None)] * (x.ndim - consumed)
    items = items[:ellipses[0]] + fill + items[ellipses[0] + 1:] if ellipses else items + fill
    start: list[int] = []
    step: list[int] = []
    size: list[Any] = []
    out_shape: list[Any] = []
    advanced: list[tuple[int, Any]] = []
    for item in items:
        if item is None:
            out_shape.append(1)
            continue
        axis = len(start)
        dim = x.shape[axis]
        if isinstance(item, slice):
            if dim == BATCH:
                if item.start not in (None, 0) or item.stop is not None or item.step not in (None, 1):
                    _static_axis("__getitem__", x.shape, axis)
                start.append(0), step.append(1), size.append(BATCH), out_shape.append(BATCH)
                continue
            if item.step is not None and item.step < 1:
                raise ValueError(f"__getitem__: slice step must be positive (as PyTorch's), got {item.step}")
            begin, end, stride = item.indices(int(dim))
            count = len(range(begin, end, stride))
            if count == 0:
                raise IndexError(f"__getitem__: slice {item} of axis {axis} (size {dim}) is empty; "
                                 "empty tensors are not supported")
            start.append(begin), step.append(stride), size.append(count), out_shape.append(count)
        elif isinstance(item, numbers.Integral) and not isinstance(item, bool):
            d = _static_axis("__getitem__", x.shape, axis)
            if not -d <= item < d:
                raise IndexError(f"__getitem__: index {item} is out of range for axis {axis} of size {d} "
                                 f"in {fmt_shape(x.shape)}")
            start.append(int(item) % d), step.append(1), size.append(1)
        else:
            if advanced:
                raise IndexError("__getitem__: one integer-array index per expression is supported; "
                                 "index the axes one after another")
            d = _static_axis("__getitem__", x.shape, axis)
            advanced.append((len(out_shape), item))
            start.append(0), step.append(1), size.append(d), out_shape.append(d)
    y = x
    if any((b, s, n) != (0, 1, d) for b, s, n, d in zip(start, step, size, x.shape)):
        y = apply("slice", y, start=tuple(start), step=tuple(step), shape=tuple(size))
    if tuple(out_shape) != tuple(y.shape):
        y = apply("reshape", y, shape=tuple(out_shape))
    if advanced:
        position, index = advanced[0]
        y = apply("take", y, _index_like(index, y, "__getitem__"), axis=position)
    return y


def index_select(x: Tensor, dim: int, index: Any) -> Tensor:
    """Rows of ``x`` along ``dim`` picked by a 1-D index (torch.index_select)."""
    axis = normalize_axes("index_select", dim, x.ndim)[0]
    _static_axis("index_select", x.shape, axis)
    idx = _index_like(index, x, "index_select")
    if idx.ndim != 1:
        raise ShapeError(f"index_select: index must be 1-D, got {fmt_shape(idx.shape)}")
    return apply("take", x, idx, axis=axis)


def gather(x: Tensor, dim: int, index: Any) -> Tensor:
    """torch.gather: ``out[..., i, ...] = x[..., index[..., i, ...], ...]`` along ``dim``."""
    axis = normalize_axes("gather", dim, x.ndim)[0]
    return apply("gather", x, _index_like(index, x, "gather"), axis=axis)


def where(condition: Any, a: Any, b: Any) -> Tensor:
    """``a`` where ``condition`` is true (nonzero), else ``b``, with broadcasting."""
    ref = next((t for t in (a, b, condition) if isinstance(t, Tensor)), None)
    ref = ref if ref is not None else Tensor(0.0)
    return apply("where", _mask_like(condition, ref, "where"), a, b)


def _triangle(x: Tensor, keep: np.ndarray) -> Tensor:
    return apply("where", Tensor(keep, dtype=x.dtype), x, 0.0)


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two axes (on and below ``diagonal``), zeros above."""
    rows, cols = (_static_axis("tril", x.shape, a) for a in (x.ndim - 2, x.ndim - 1))
    return _triangle(x, np.tril(np.ones((rows, cols), bool), diagonal))


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two axes (on and above ``diagonal``), zeros below."""
    rows, cols = (_static_axis("triu", x.shape, a) for a in (x.ndim - 2, x.ndim - 1))
    return _triangle(x, np.triu(np.ones((rows, cols), bool), diagonal))


def arange(start: float, end: float | None = None, step: float = 1, dtype: Any = None) -> Tensor:
    """``[start, end)`` by ``step`` as a constant tensor (float64 unless ``dtype``)."""
    values = np.arange(start, end, step) if end is not None else np.arange(start)
    return Tensor(values, dtype=dtype or "float64")


def swapaxes(x: Tensor, i: int, j: int) -> Tensor:
    """``x`` with axes ``i`` and ``j`` exchanged (torch.transpose)."""
    a, b = (normalize_axes("transpose", d, x.ndim)[0] for d in (i, j))
    perm = list(range(x.ndim))
    perm[a], perm[b] = b, a
    return x if a == b else apply("transpose", x, perm=tuple(perm))


def _slice_along(x: Tensor, axis: int, begin: int, count: int) -> Tensor:
    start = tuple(begin if i == axis else 0 for i in range(x.ndim))
    shape = tuple(count if i == axis else d for i, d in enumerate(x.shape))
    return x if shape == x.shape else apply("slice", x, start=start, step=(1,) * x.ndim, shape=shape)


def split(x: Tensor, split_size_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
    """Pieces along ``dim``: of one size (the last may be shorter) or of the listed sizes."""
    axis = normalize_axes("split", dim, x.ndim)[0]
    total = _static_axis("split", x.shape, axis)
    if isinstance(split_size_or_sections, numbers.Integral):
        every = int(split_size_or_sections)
        if every < 1:
            raise ValueError(f"split: split size must be positive, got {every}")
        sizes = [min(every, total - b) for b in range(0, total, every)]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if sum(sizes) != total or min(sizes) < 1:
            raise ShapeError(f"split: sections {sizes} must be positive and add up to {total} (axis {axis} of "
                             f"{fmt_shape(x.shape)})")
    offsets = np.cumsum([0] + sizes[:-1])
    return tuple(_slice_along(x, axis, int(b), n) for b, n in zip(offsets, sizes))


def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """``chunks`` pieces along ``dim`` as torch.chunk (each ceil(size / chunks) long but the last)."""
    axis = normalize_axes("chunk", dim, x.ndim)[0]
    total = _static_axis("chunk", x.shape, axis)
    if chunks < 1:
        raise ValueError(f"chunk: chunks must be positive, got {chunks}")
    return split(x, -(-total // chunks), axis)


def cat(tensors: list[Any], dim: int = 0) -> Tensor:
    """Tensors joined along ``dim`` (each placed in zeros of the result's shape, then summed)."""
    parts = [t if isinstance(t, Tensor) else Tensor(t) for t in tensors]
    if not parts:
        raise ShapeError("cat: got an empty list; expected at least one tensor")
    first = parts[0]
    axis = normalize_axes("cat", dim, first.ndim)[0]
    for t in parts[1:]:
        if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != axis):
            raise ShapeError(f"cat: shapes {fmt_shape(first.shape)} and {fmt_shape(t.shape)} differ off axis {axis}")
    if len(parts) == 1:
        return first
    dtypes = {t.dtype for t in parts}
    if len(dtypes) > 1 and current_trace() is None:
        parts = [t.astype("float64") for t in parts]
    sizes = [_static_axis("cat", t.shape, axis) for t in parts]
    full = tuple(sum(sizes) if i == axis else d for i, d in enumerate(first.shape))
    out: Tensor | None = None
    for t, begin in zip(parts, np.cumsum([0] + sizes[:-1])):
        start = tuple(int(begin) if i == axis else 0 for i in range(first.ndim))
        placed = apply("slice_grad", t, start=start, step=(1,) * first.ndim, shape=full)
        out = placed if out is None else apply("add", out, placed)
    return out  # type: ignore[return-value]


def batched_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` where an operand has more than two axes: batch axes broadcast (PyTorch's rules)."""
    rows, cols = a.ndim == 1, b.ndim == 1
    a = a.reshape(1, a.shape[0]) if rows else a
    b = b.reshape(b.shape[0], 1) if cols else b
    (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
    if k != k2:
        raise ShapeError(f"matmul: inner dimensions differ: {fmt_shape(a.shape)} @ {fmt_shape(b.shape)}; "
                         f"expected lhs columns ({k}) == rhs rows ({k2})")
    if b.ndim == 2 and BATCH not in a.shape:
        out = apply("matmul", a.reshape(-1, k), b).reshape(*a.shape[:-1], n)  # one 2-D product
    else:
        batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
        out = apply("bmm", a.expand(*batch, m, k), b.expand(*batch, k2, n))
    if rows:
        out = out.squeeze(out.ndim - 2)
    return out.squeeze(out.ndim - 1) if cols else out


def bmm(a: Tensor, b: Tensor) -> Tensor:
    """torch.bmm: (B, m, k) @ (B, k, n)."""
    if a.ndim != 3 or b.ndim != 3:
        raise ShapeError(f"bmm: expected 3-D operands, got {fmt_shape(a.shape)} @ {fmt_shape(b.shape)}")
    return apply("bmm", a, b)
# ---------------------------------------------------------------------------- windows (conv, pooling, pad)
# PyTorch's argument forms resolved into the registry's attributes (mlir_nn.ir.windows).


def _pair_arg(op: str, name: str, value: Any) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, numbers.Integral) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, numbers.Integral) for v in pair):
        raise ValueError(f"{op}: {name} must be an int or a pair of ints, got {value!r}")
    return int(pair[0]), int(pair[1])


def _padding_arg(op: str, padding: Any, kernel: tuple[int, int], stride: tuple[int, int],
                 dilation: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) from an int, a pair, "valid" or "same" (PyTorch's split: extra at the end)."""
    if padding == "valid":
        return 0, 0, 0, 0
    if padding == "same":
        if stride != (1, 1):
            raise ValueError(f"{op}: padding='same' needs stride 1, got stride {stride}")
        total = [d * (k - 1) for d, k in zip(dilation, kernel)]
        return total[0] // 2, total[0] - total[0] // 2, total[1] // 2, total[1] - total[1] // 2
    if isinstance(padding, str):
        raise ValueError(f"{op}: padding must be an int, a pair, 'same' or 'valid', got {padding!r}")
    ph, pw = _pair_arg(op, "padding", padding)
    return ph, ph, pw, pw


def _tensor_arg(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


def _as_image(op: str, x: Tensor) -> tuple[Tensor, bool]:
    """(N, C, H, W) view of ``x`` and whether it was an unbatched (C, H, W) image."""
    if x.ndim == 3:
        return x.reshape(1, *x.shape), True
    if x.ndim != 4:
        raise ShapeError(f"{op}: input must be (N, C, H, W) or (C, H, W), got {fmt_shape(x.shape)}")
    return x, False


def _from_image(y: Tensor, unbatched: bool) -> Tensor:
    return y.reshape(*y.shape[1:]) if unbatched else y


def conv2d(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1) -> Tensor:
    """PyTorch's conv2d: NCHW input, weight (out, in/groups, kh, kw), optional bias (out,)."""
    x, unbatched = _as_image("conv2d", _tensor_arg(x))
    weight = _operand(weight, x.dtype, "conv2d")
    if weight.ndim != 4:
        raise ShapeError("conv2d: weight must be (out_channels, in_channels/groups, kh, kw), "
                         f"got {fmt_shape(weight.shape)}")
    strides = _pair_arg("conv2d", "stride", stride)
    dilations = _pair_arg("conv2d", "dilation", dilation)
    pads = _padding_arg("conv2d", padding, tuple(weight.shape[2:]), strides, dilations)
    y = apply("conv2d", x, weight, stride=strides, padding=pads, dilation=dilations, groups=int(groups))
    if bias is not None:
        bias = _operand(bias, x.dtype, "conv2d")
        if bias.shape != (weight.shape[0],):
            raise ShapeError(f"conv2d: bias has shape {fmt_shape(bias.shape)}, expected ({weight.shape[0]},)")
        y = y + bias.reshape(weight.shape[0], 1, 1)
    return _from_image(y, unbatched)


def max_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False) -> Tensor:
    """PyTorch's max_pool2d (padding reads -inf; the gradient goes to each window's first maximum)."""
    x, unbatched = _as_image("max_pool2d", _tensor_arg(x))
    kernel = _pair_arg("max_pool2d", "kernel_size", kernel_size)
    strides = kernel if stride is None else _pair_arg("max_pool2d", "stride", stride)
    ph, pw = _pair_arg("max_pool2d", "padding", padding)
    y = apply("max_pool2d", x, kernel=kernel, stride=strides, padding=(ph, ph, pw, pw),
              dilation=_pair_arg("max_pool2d", "dilation", dilation), ceil_mode=bool(ceil_mode))
    return _from_image(y, unbatched)


def avg_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """PyTorch's avg_pool2d (zero padding, its divisors with ceil_mode and count_include_pad)."""
    x, unbatched = _as_image("avg_pool2d", _tensor_arg(x))
    kernel = _pair_arg("avg_pool2d", "kernel_size", kernel_size)
    strides = kernel if stride is None else _pair_arg("avg_pool2d", "stride", stride)
    ph, pw = _pair_arg("avg_pool2d", "padding", padding)
    y = apply("avg_pool2d", x, kernel=kernel, stride=strides, padding=(ph, ph, pw, pw), ceil_mode=bool(ceil_mode),
              count_include_pad=bool(count_include_pad))
    return _from_image(y, unbatched)


def adaptive_avg_pool2d(x: Any, output_size: Any) -> Tensor:
    """PyTorch's adaptive_avg_pool2d; None in output_size keeps that input size."""
    x, unbatched = _as_image("adaptive_avg_pool2d", _tensor_arg(x))
    sizes = (output_size, output_size) if not isinstance(output_size, (tuple, list)) else tuple(output_size)
    if len(sizes) != 2:
        raise ValueError(f"adaptive_avg_pool2d: output_size must be an int or a pair, got {output_size!r}")
    oh, ow = (x.shape[2 + i] if s is None else _pair_arg("adaptive_avg_pool2d", "output_size", s)[0]
              for i, s in enumerate(sizes))
    h, w = x.shape[2:]
    if h % oh == 0 and w % ow == 0:  # equal windows: a plain average pool
        y = apply("avg_pool2d", x, kernel=(h // oh, w // ow), stride=(h // oh, w // ow), padding=(0, 0, 0, 0),
                  ceil_mode=False, count_include_pad=True)
    else:
        y = apply("adaptive_avg_pool2d", x, output_size=(int(oh), int(ow)))
    return _from_image(y, unbatched)


def pad(x: Any, pads: Any, value: float = 0.0) -> Tensor:
    """PyTorch's constant pad: ``pads`` = (last_lo, last_hi, second_last_lo, ...); negative amounts crop."""
    x = _tensor_arg(x)
    pads = tuple(pads)
    if len(pads) % 2 or len(pads) // 2 > x.ndim or not all(isinstance(p, numbers.Integral) for p in pads):
        raise ValueError(f"pad: pads must be an even number (at most {2 * x.ndim}) of ints for "
                         f"{fmt_shape(x.shape)}, got {pads}")
    pairs = [(0, 0)] * x.ndim
    for i in range(len(pads) // 2):
        pairs[x.ndim - 1 - i] = (int(pads[2 * i]), int(pads[2 * i + 1]))
    return apply("pad", x, pads=tuple(pairs), value=float(value))
