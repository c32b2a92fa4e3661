// Transform-dialect schedules of the CUDA pipeline, applied on buffers (after bufferization).
// The compiler matches each linalg op (or fused tile loop) and includes one of these
// sequences on it; the element-wise and reduction tilings, whose tile sizes depend on
// which loops are parallel, and the fused groups (fill, contraction, epilogue in one
// block loop made on tensors by mlir_nn/gpu/fusion.py) are generated next to these.

// A contraction C[m, n] += A[m, k] * B[k, n] (either operand may be transposed) inside a
// block's 16x16 output tile: K in steps of 16, the A and B tiles staged in shared memory
// (workgroup address space), copies and compute spread over 16x16 threads.
transform.named_sequence @mlirnn_block_contraction(%blocks: !transform.any_op {transform.readonly},
                                                   %op: !transform.any_op {transform.consumed}) {
  %ktiled, %kloop = transform.structured.tile_using_for %op tile_sizes [0, 0, 16]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
  %promoted = transform.structured.promote %ktiled
      {operands_to_promote = [0, 1], memory_space = #gpu.address_space<workgroup>}
      : (!transform.any_op) -> !transform.any_op
  %copies = transform.structured.match ops{["linalg.copy"]} in %blocks
      : (!transform.any_op) -> !transform.any_op
  %tc, %fc = transform.structured.tile_using_forall %copies num_threads [16, 16]
      (mapping = [#gpu.thread<y>, #gpu.thread<x>]) : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
  %tm, %fm = transform.structured.tile_using_forall %promoted num_threads [16, 16, 0]
      (mapping = [#gpu.thread<y>, #gpu.thread<x>]) : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
  transform.yield
}

// An element-wise op on a block's 16x16 tile (the fill or the epilogue of a fused
// contraction): one element per thread, thread (x, y) on the element the contraction's
// thread (x, y) accumulated.
transform.named_sequence @mlirnn_block_elementwise(%op: !transform.any_op {transform.consumed}) {
  %t, %f = transform.structured.tile_using_forall %op num_threads [16, 16]
      (mapping = [#gpu.thread<y>, #gpu.thread<x>]) : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
  transform.yield
}

// A contraction on its own: 16x16 output tiles per block. The block loop becomes
// scf.parallel so that a dynamic (batch) size maps to the grid.
transform.named_sequence @mlirnn_contraction(%op: !transform.any_op {transform.consumed}) {
  %tiled, %blocks = transform.structured.tile_using_forall %op tile_sizes [16, 16, 0]
      : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
  transform.include @mlirnn_block_contraction failures(propagate) (%blocks, %tiled)
      : (!transform.any_op, !transform.any_op) -> ()
  %grid = transform.loop.forall_to_parallel %blocks : (!transform.any_op) -> !transform.any_op
  transform.yield
}
