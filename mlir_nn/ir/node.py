"""The IR node: an immutable, hashable record of one tensor operation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlir_nn.ir.shapes import Shape

AttrValue = Any  # int, float, str, bool, None or tuples of those: always hashable


@dataclass(frozen=True, eq=False)
class Node:
    """One operation: op name (from the registry), inputs, static attributes, type.

    Nodes are compared structurally; since children are compared the same way and the
    hash is computed once at construction from the children's hashes, both are cheap.
    """

    op: str
    inputs: tuple[Node, ...]
    attrs: tuple[tuple[str, AttrValue], ...]
    shape: Shape
    dtype: str
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        key = (self.op, tuple(hash(i) for i in self.inputs), self.attrs, self.shape, self.dtype)
        object.__setattr__(self, "_hash", hash(key))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Node) or self._hash != other._hash:
            return False
        return (
            self.op == other.op
            and self.attrs == other.attrs
            and self.shape == other.shape
            and self.dtype == other.dtype
            and self.inputs == other.inputs
        )

    def __reduce__(self) -> tuple:
        # Rebuild through __init__ so the hash is recomputed: str hashes differ per process.
        return Node, (self.op, self.inputs, self.attrs, self.shape, self.dtype)

    def attr(self, name: str, default: AttrValue = None) -> AttrValue:
        """Value of attribute ``name``."""
        for key, value in self.attrs:
            if key == name:
                return value
        return default

    @property
    def attr_dict(self) -> dict[str, AttrValue]:
        return dict(self.attrs)

    def __repr__(self) -> str:
        return f"Node({self.op}, shape={self.shape}, dtype={self.dtype}, attrs={dict(self.attrs)})"


def freeze_attrs(attrs: dict[str, AttrValue]) -> tuple[tuple[str, AttrValue], ...]:
    """Sorted, hashable form of an attribute dict (lists become tuples)."""

    def freeze(v: AttrValue) -> AttrValue:
        if isinstance(v, list):
            return tuple(freeze(x) for x in v)
        return v

    return tuple(sorted((k, freeze(v)) for k, v in attrs.items()))
