"""One ``gpu.module`` per step: every kernel of a step in one PTX text and one cubin.

``gpu-kernel-outlining`` makes a ``gpu.module`` per launch, each with one kernel named
after the host function. ``merge_kernel_modules`` moves all those kernels into a single
module ``@<func>_kernels`` and renames them ``<func>_k<NN>_<op>`` (launch index, the
Graph op the kernel computes), so ``--emit ptx`` is one file ``ptxas`` accepts and the
runtime loads one module per step.
"""

from __future__ import annotations

import re

from mlir.ir import Attribute, InsertionPoint, Module, Operation, StringAttr, SymbolRefAttr

from mlir_nn.codegen.walk import symbol
from mlir_nn.gpu.fixups import top_level, walk

CONTRACTIBLE = ("arith.mulf", "arith.addf", "arith.subf")


def kernel_name(func: str, index: int, op: str) -> str:
    """``step_k03_linear``: readable, unique per launch, a valid PTX identifier."""
    return f"{func}_k{index:02d}_{re.sub(r'[^A-Za-z0-9_]', '_', op)}"


def merge_kernel_modules(module: Module, host: Operation, names: list[str]) -> str:
    """Move the kernel of launch ``i`` of ``host`` into one gpu.module as ``kernel_name(..., names[i])``.

    Returns the new module's name. Each outlined module must hold exactly one gpu.func
    and be launched exactly once (what ``gpu-kernel-outlining`` leaves).
    """
    func = symbol(host)
    outlined = {symbol(op): op for op in (o.operation for o in module.body.operations) if op.name == "gpu.module"}
    launches = [op for op in top_level(host) if op.name == "gpu.launch_func"]
    if len(launches) != len(names):
        raise RuntimeError(f"cuda: {len(launches)} kernel launches but {len(names)} kernel names")
    merged_name = f"{func}_kernels"
    first = next(iter(outlined.values()))
    with InsertionPoint(first), first.location:
        merged = Operation.create("gpu.module", regions=1, attributes={"sym_name": StringAttr.get(merged_name)})
    body = merged.regions[0].blocks.append()
    for index, (launch, op) in enumerate(zip(launches, names)):
        old_module = str(launch.attributes["kernel"]).split("::")[0].strip().lstrip("@")
        kernels = [k.operation for k in outlined[old_module].regions[0].blocks[0].operations]
        if len(kernels) != 1 or kernels[0].name != "gpu.func":
            raise RuntimeError(f"cuda: outlined module {old_module} holds {[k.name for k in kernels]}")
        new_name = kernel_name(func, index, op)
        kernels[0].attributes["sym_name"] = StringAttr.get(new_name)
        body.append(kernels[0])
        launch.attributes["kernel"] = SymbolRefAttr.get([merged_name, new_name])
    for op in outlined.values():
        op.erase()
    return merged_name


def allow_contraction(module: Module) -> int:
    """Mark float multiplies and adds in the kernels ``fastmath<contract>`` so a product feeding a sum
    becomes one ``fma.rn.f32`` (rounded once; the NumPy reference rounds twice, a last-bit difference)."""
    contract = Attribute.parse("#arith.fastmath<contract>")
    marked = 0
    for top in module.body.operations:
        if top.operation.name != "gpu.module":
            continue
        for op in walk(top.operation):
            if op.name in CONTRACTIBLE:
                op.attributes["fastmath"] = contract
                marked += 1
    return marked
