// Transform schedule of the CPU pipeline for large matrix products, applied on tensors
// before bufferization. mlir_nn/codegen/cpu_matmul.py tags each large linalg.matmul
// `mlirnn.tiled` (its column count is a multiple of {tn}) or `mlirnn.narrow` (fewer
// than {tn} columns) and fills in {tm} (rows of a register block) and {tn} (its
// columns: two vector registers) for the dtype and the host's vector width.
//
// C[m, n] += A[m, k] * B[k, n] becomes, per register block of {tm} x {tn}, a loop over
// k of rank-1 updates (one broadcast of A[m, k] and one FMA per vector register of B's
// row) with the accumulators kept in registers across the whole k loop. Rows left over
// after the {tm}-row blocks go one at a time. Every block has
// static sizes, so nothing is masked; m and k may be the dynamic batch size.
module attributes {transform.with_named_sequence} {
  // Split the last, partial iteration off a row loop; tag the product it holds `mlirnn.rows1`.
  transform.named_sequence @mlirnn_peel_rows1(%loop: !transform.any_op {transform.consumed}) {
    %for = transform.cast %loop : !transform.any_op to !transform.op<"scf.for">
    %full, %rest = transform.loop.peel %for : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
    transform.foreach %rest : !transform.any_op {
    ^bb0(%loop_rest: !transform.any_op):
      %mm = transform.structured.match ops{["linalg.matmul"]} in %loop_rest : (!transform.any_op) -> !transform.any_op
      transform.annotate %mm "mlirnn.rows1" : !transform.any_op
    }
    transform.yield
  }

  transform.named_sequence @mlirnn_cpu_matmul(%root: !transform.any_op {transform.readonly}) {
    // Products with much work: one parallel iteration per {tm}-row block (the pipeline's
    // async-parallel-for groups them into tasks at run time).
    %parallel = transform.structured.match ops{["linalg.matmul"]} attributes {mlirnn.parallel} in %root
        : (!transform.any_op) -> !transform.any_op
    %chunks, %forall = transform.structured.tile_using_forall %parallel tile_sizes [{tm}]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %wide = transform.structured.match ops{["linalg.matmul"]} attributes {mlirnn.tiled} in %root
        : (!transform.any_op) -> !transform.any_op
    %narrow = transform.structured.match ops{["linalg.matmul"]} attributes {mlirnn.narrow} in %root
        : (!transform.any_op) -> !transform.any_op
    %all = transform.merge_handles %wide, %narrow : !transform.any_op
    // Rows: {tm}-row blocks, then single rows (a peel that finds no partial iteration,
    // when the row count divides evenly, changes nothing).
    %blocks, %row_loop = transform.structured.tile_using_for %all tile_sizes [{tm}]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.foreach %row_loop : !transform.any_op {
    ^bb0(%loop: !transform.any_op):
      transform.include @mlirnn_peel_rows1 failures(suppress) (%loop) : (!transform.any_op) -> ()
    }
    %rest1 = transform.structured.match ops{["linalg.matmul"]} attributes {mlirnn.rows1} in %root
        : (!transform.any_op) -> !transform.any_op
    %singles, %single_loop = transform.structured.tile_using_for %rest1 tile_sizes [1]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    // Columns: {tn}-column blocks of the wide products; k one step at a time.
    %wide_blocks = transform.structured.match ops{["linalg.matmul"]} attributes {mlirnn.tiled} in %root
        : (!transform.any_op) -> !transform.any_op
    %cols, %col_loop = transform.structured.tile_using_for %wide_blocks tile_sizes [0, {tn}]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.apply_patterns to %root { transform.apply_patterns.canonicalization } : !transform.any_op
    %wide_cells = transform.structured.match ops{["linalg.matmul"]} attributes {mlirnn.tiled} in %root
        : (!transform.any_op) -> !transform.any_op
    %narrow_cells = transform.structured.match ops{["linalg.matmul"]} attributes {mlirnn.narrow} in %root
        : (!transform.any_op) -> !transform.any_op
    %cells = transform.merge_handles %wide_cells, %narrow_cells : !transform.any_op
    %steps, %k_loop = transform.structured.tile_using_for %cells tile_sizes [0, 0, 1]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.structured.vectorize %steps : !transform.any_op
    transform.apply_patterns to %root {
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.vector.reduction_to_contract
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // Keep each block's accumulators in registers across the k loop.
    %loops = transform.structured.match ops{["scf.for"]} in %root : (!transform.any_op) -> !transform.op<"scf.for">
    transform.loop.hoist_loop_invariant_subsets %loops : !transform.op<"scf.for">
    // Transposed copies of B in 16x16 tiles: vector loads, in-register shuffles, vector stores.
    %transposes = transform.structured.match ops{["linalg.transpose"]} attributes {mlirnn.tiled_transpose} in %root
        : (!transform.any_op) -> !transform.any_op
    %tiles, %tile_rows, %tile_cols = transform.structured.tile_using_for %transposes tile_sizes [16, 16]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)
    transform.structured.vectorize %tiles : !transform.any_op
    transform.apply_patterns to %root {
      transform.apply_patterns.vector.lower_transpose lowering_strategy = "shuffle_16x16"
      transform.apply_patterns.vector.lower_contraction lowering_strategy = "outerproduct"
      transform.apply_patterns.vector.lower_outerproduct
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.yield
  }
}
