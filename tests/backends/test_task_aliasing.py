"""noalias on the buffers of parallel loop bodies (real MLIR passes: OpenMP's lowering, the LLVM conversion)."""

import pytest
from mlir import ir
from mlir.passmanager import PassManager

from mlir_nn.backends.kernel_build import mark_kernels
from mlir_nn.backends.kernel_split import NOALIAS
from mlir_nn.backends.parallel_bodies import BODY_PREFIX, outline_parallel_bodies
from mlir_nn.backends.task_aliasing import mark_task_arguments

_THREADS = "scf-forall-to-parallel"
_TO_LLVM = ("convert-scf-to-openmp,convert-linalg-to-loops,expand-strided-metadata,lower-affine,"
            "finalize-memref-to-llvm,convert-scf-to-cf,convert-openmp-to-llvm,convert-to-llvm,reconcile-unrealized-casts")
# a 64x32 buffer rebuilt from its pointer argument, as kernel_split's kernels take their buffers
_DESCRIPTOR = "!llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>"
_FIELDS = ((0, "%P"), (1, "%P"), (2, "%c0"), ("3, 0", "%c64"), ("3, 1", "%c32"), ("4, 0", "%c32"), ("4, 1", "%c1"))
_BUFFER = f"""
  %N_0 = llvm.mlir.poison : {_DESCRIPTOR}
""" + "".join(f"  %N_{i + 1} = llvm.insertvalue {value}, %N_{i}[{where}] : {_DESCRIPTOR}\n"
              for i, (where, value) in enumerate(_FIELDS)) + f"""
  %N = builtin.unrealized_conversion_cast %N_7 : {_DESCRIPTOR} to memref<64x32xf32>
"""
# a kernel that squares rows of (a view of) %a into (a view of) SOURCE on threads; NOALIAS marks
# the pointers of both buffers or only of %a
_KERNEL = """
func.func @kscale(%pa: !llvm.ptr, %pb: !llvm.ptr) attributes {mlir_nn.noalias = array<i64: MARKED>} {
  %c0 = llvm.mlir.constant(0 : i64) : i64
  %c1 = llvm.mlir.constant(1 : i64) : i64
  %c32 = llvm.mlir.constant(32 : i64) : i64
  %c64 = llvm.mlir.constant(64 : i64) : i64
""" + _BUFFER.replace("%N", "%a").replace("%P", "%pa") + _BUFFER.replace("%N", "%b").replace("%P", "%pb") + """
  %in = memref.subview %a[0, 0] [64, 16] [1, 1] : memref<64x32xf32> to memref<64x16xf32, strided<[32, 1]>>
  %out = memref.subview SOURCE[0, 16] [64, 16] [1, 1]
      : memref<64x32xf32> to memref<64x16xf32, strided<[32, 1], offset: 16>>
  scf.forall (%i) in (4) {
    %row = affine.apply affine_map<(d0) -> (d0 * 16)>(%i)
    %x = memref.subview %in[%row, 0] [16, 16] [1, 1]
        : memref<64x16xf32, strided<[32, 1]>> to memref<16x16xf32, strided<[32, 1], offset: ?>>
    %y = memref.subview %out[%row, 0] [16, 16] [1, 1]
        : memref<64x16xf32, strided<[32, 1], offset: 16>> to memref<16x16xf32, strided<[32, 1], offset: ?>>
    linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>],
                    iterator_types = ["parallel", "parallel"]}
        ins(%x : memref<16x16xf32, strided<[32, 1], offset: ?>>)
        outs(%y : memref<16x16xf32, strided<[32, 1], offset: ?>>) {
    ^bb0(%v: f32, %w: f32):
      %s = arith.mulf %v, %v : f32
      linalg.yield %s : f32
    }
  }
  return
}
"""


def _task_noalias(marked: str, source: str) -> tuple[int, list[int] | None, list[int]]:
    """(buffers marked, the body's NOALIAS before lowering, its noalias pointer arguments after)."""
    with ir.Context():
        module = ir.Module.parse(_KERNEL.replace("MARKED", marked).replace("SOURCE", source))
        PassManager.parse(f"builtin.module({_THREADS})").run(module.operation)
        assert outline_parallel_bodies(module) == 1
        count = mark_task_arguments(module)
        task = next(op.operation for op in module.body.operations
                    if ir.StringAttr(op.operation.attributes["sym_name"]).value.startswith(BODY_PREFIX))
        tagged = list(ir.DenseI64ArrayAttr(task.attributes[NOALIAS])) if NOALIAS in task.attributes else None
        PassManager.parse(f"builtin.module({_TO_LLVM})").run(module.operation)
        mark_kernels(module, ("kscale",))
        lowered = next(op.operation for op in module.body.operations
                       if ir.StringAttr(op.operation.attributes["sym_name"]).value.startswith(BODY_PREFIX))
        attrs = ir.ArrayAttr(lowered.attributes["arg_attrs"]) if "arg_attrs" in lowered.attributes else []
        return count, tagged, [i for i in range(len(attrs)) if "llvm.noalias" in str(attrs[i])]


def test_the_body_of_a_kernel_loop_with_unshared_buffers_gets_them_noalias():
    count, tagged, pointers = _task_noalias("0, 1", "%b")
    # the body's arguments: its induction variable first, then the views of %a and %b
    assert count == 2 and tagged is not None and len(tagged) == 2 and tagged[1] - tagged[0] == 7
    assert pointers == tagged


@pytest.mark.parametrize("marked, source", [
    ("0, 1", "%a"),  # both of the body's buffers view %a (its two halves)
    ("0", "%b"),  # %b may alias another argument of the kernel
])
def test_a_body_buffer_that_may_share_memory_is_not_marked(marked, source):
    count, tagged, pointers = _task_noalias(marked, source)
    if source == "%a":
        assert (count, tagged, pointers) == (0, None, [])
    else:
        assert count == 1 and tagged is not None and len(tagged) == 1 and pointers == tagged
