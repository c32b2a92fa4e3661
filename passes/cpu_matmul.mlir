// Transform schedule of the CPU pipeline for large matrix products, applied on tensors
// before bufferization. mlir_nn/codegen/cpu_matmul.py rewrites each large product
// C = op(A) @ op(B) GotoBLAS-style and fills in the block sizes for the dtype and host:
// {tm} x {tn} register blocks (two vector registers per row; one, {tn_narrow} columns, where
// block_columns says), tasks of {row_panels} row panels ({tm} rows each) x {col_panels} column
// panels ({tn} columns each), kc = {kc} or deeper (`mlirnn.kc`).
//
// * Packing (`mlirnn.pack*`, copies with permuted maps): A into row panels [m / tm, k, tm], B
//   into column panels [n / tn, k, tn], zero-padded to whole panels, so that the
//   register kernel reads both operands as contiguous runs (a kc-deep slice of a B panel
//   stays in L1, the task's slices of A panels in L2). A transposed operand is
//   transposed by its packing (in {tile}-deep vector tiles where the sizes allow).
// * The product (`mlirnn.packed`), a generic over (column panel, row panel, row, column,
//   k) into a zero-filled accumulator (`mlirnn.acc_init`), is split into tasks
//   (`mlirnn.parallel`: on threads; after the schedule, mlir_nn/codegen/zero_start.py drops
//   the accumulator's zero fill: the first kc slice's register blocks start from zero).
//   Row blocks are the tasks' inner dim (chosen under the async lowering that preceded the
//   OpenMP one: MLIR 22's async-parallel-for ran blocks twice or three times (block count from the unaligned block size, coordinates wrapping around)
//   when a block spans more than the inner dim's static trip count; a dynamic (batch) or
//   long inner dim keeps it on its unaligned code path (measured: dW 1024x512x1024 with one
//   thread used 2.4x the CPU time of the serial build with column blocks inside));
//   within a task: for each kc slice of k, for each column panel, for each row panel, a
//   loop over the slice's k of rank-1 updates with the {tm} x {tn} accumulators in
//   registers (one broadcast of A and one FMA per vector register of B). No block is
//   partial: the padding makes every size whole.
module attributes {transform.with_named_sequence} {
  transform.named_sequence @mlirnn_cpu_matmul(%root: !transform.any_op {transform.readonly}) {
    // Packings: panels spread over threads for large products, then vector copies.
    %pack_parallel = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.pack_parallel} in %root
        : (!transform.any_op) -> !transform.any_op
    %pack_chunks, %pack_forall = transform.structured.tile_using_forall %pack_parallel tile_sizes [4]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    // (row copies into a few panels, as a weight gradient's over a static batch: tasks of rows)
    %pack_parallel_rows = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.pack_parallel_rows}
        in %root : (!transform.any_op) -> !transform.any_op
    %pack_row_chunks, %pack_row_forall = transform.structured.tile_using_forall %pack_parallel_rows
        tile_sizes [0, {pack_task_rows}] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    // (a batch's rows in groups: one block of groups a computing thread, or tasks of a few groups,
    // so that each thread copies rows it wrote)
    %pack_parallel_groups = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.pack_parallel_groups}
        in %root : (!transform.any_op) -> !transform.any_op
    %pack_group_chunks, %pack_group_forall = transform.structured.tile_using_forall %pack_parallel_groups
        {pack_group_tasks} : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %pack_rows_a = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.pack_rows_a} in %root
        : (!transform.any_op) -> !transform.any_op
    // (several rows per vector op, masked at a dynamic end: single rows would fold into copies;
    // A's rows in {tm_lanes}-lane vectors: {tm}-lane ones cost LLVM about a second of the large
    // step's compile, {tn}-lane masked ones ran with spills)
    %rows_a, %row_panels_a, %row_k_a = transform.structured.tile_using_for %pack_rows_a tile_sizes [1, {rows}, 0]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)
    transform.structured.vectorize %rows_a vector_sizes [1, {rows}, {tm_lanes}] : !transform.any_op
    // (rows of the batch in static groups of {rows}: plain vector copies, no masks; groups outer,
    // the task's panels inner, so that each row's piece of the task is read as one run:
    // measured 1.6x faster for the 1024x512x10 weight gradient, whose time is mostly packing)
    %pack_groups = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.pack_row_groups} in %root
        : (!transform.any_op) -> !transform.any_op
    %groups, %group_rows, %group_panels = transform.structured.tile_using_for %pack_groups tile_sizes [1, 1, 0, 0]
        interchange = [1, 0, 2, 3]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)
    transform.structured.vectorize %groups : !transform.any_op
    %pack_rows_b = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.pack_rows_b} in %root
        : (!transform.any_op) -> !transform.any_op
    // (rows of {rows} outer, the task's panels inner: each row of B is read as one run rather
    // than a {tn}-float piece per panel; measured 8% of a 512x1024x1024 product on one thread)
    %rows_b, %row_k_b, %row_panels_b = transform.structured.tile_using_for %pack_rows_b tile_sizes [1, {rows}, 0]
        interchange = [1, 0, 2]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)
    transform.structured.vectorize %rows_b vector_sizes [1, {rows}, {tn}] : !transform.any_op
    // (the same into panels of one vector register, `mlirnn.pack_rows_b_narrow`: see block_columns
    // in mlir_nn/codegen/cpu_matmul.py)
    %pack_rows_bn = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.pack_rows_b_narrow} in %root
        : (!transform.any_op) -> !transform.any_op
    %rows_bn, %row_k_bn, %row_panels_bn = transform.structured.tile_using_for %pack_rows_bn tile_sizes [1, {rows}, 0]
        interchange = [1, 0, 2]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)
    transform.structured.vectorize %rows_bn vector_sizes [1, {rows}, {tn_narrow}] : !transform.any_op
    %pack_tiles = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.pack_tiles} in %root
        : (!transform.any_op) -> !transform.any_op
    %tiles, %tile_panels, %tile_k = transform.structured.tile_using_for %pack_tiles tile_sizes [1, {tile}, 0]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)
    transform.structured.vectorize %tiles : !transform.any_op
    // (panels wider than {tile}: square {tile} x {tile} tiles, which lower to shuffles in registers;
    // a whole {tile} x 32 tile spilled, and cost 45% of a 512x1024x10 product)
    %pack_squares = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.pack_squares} in %root
        : (!transform.any_op) -> !transform.any_op
    %squares, %square_panels, %square_k, %square_lanes = transform.structured.tile_using_for %pack_squares
        tile_sizes [1, {tile}, {tile}]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
    transform.structured.vectorize %squares : !transform.any_op
    %fns = transform.structured.match ops{["func.func"]} in %root : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %fns {
      transform.apply_patterns.vector.lower_masked_transfers
      transform.apply_patterns.vector.lower_masks
    } : !transform.any_op

    // Blocks of rows of a batch loop's small products (`mlirnn.row_block`, mlir_nn/codegen/row_blocks.py):
    // a loop over k in steps of {row_block_k_step}, each step one vector contraction, the block's
    // accumulators carried in registers (hoisted below).
    // (a B stored (n, k) is copied to (k, n) in {tile} x {tile} vector tiles, `mlirnn.row_block_transpose`)
    %register_transposes = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.row_block_transpose}
        in %root : (!transform.any_op) -> !transform.any_op
    %transpose_tiles, %transpose_rows, %transpose_cols = transform.structured.tile_using_for %register_transposes
        tile_sizes [{tile}, {tile}] : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)
    transform.structured.vectorize %transpose_tiles : !transform.any_op
    // (a block of a zero-filled product fills its own rows, as vector stores that the block's first
    // reads then fold into: `mlirnn.row_block_zero`)
    %register_zeros = transform.structured.match ops{["linalg.fill"]} attributes {mlirnn.row_block_zero} in %root
        : (!transform.any_op) -> !transform.any_op
    transform.structured.vectorize %register_zeros : !transform.any_op
    %register_rows = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.row_block} in %root
        : (!transform.any_op) -> !transform.any_op
    %register_steps, %register_k_loop = transform.structured.tile_using_for %register_rows
        tile_sizes [0, {row_block_k_step}, 0] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.structured.vectorize %register_steps : !transform.any_op
    // (small products whose vector rows are not a power of two of registers, `mlirnn.split_lanes =
    // array<i64: loop, size>`: first split in two along that loop)
{lane_splits}    // Small products (`mlirnn.small_vector`): per iteration of the outer (batch) loop, one
    // vector contraction over the static inner sizes (broadcasts and FMAs on registers).
    %small = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.small_vector} in %root
        : (!transform.any_op) -> !transform.any_op
    %small_rows, %small_loop = transform.structured.tile_using_for %small tile_sizes [1, 0, 0]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.structured.vectorize %small_rows : !transform.any_op
    // (over a dynamic batch, `mlirnn.small_rows = array<i64: rows>`: blocks of that many rows, one
    // contraction each, so that each B[k, :] read feeds that many rows' independent FMA chains; the
    // loop is peeled, its last partial block runs row by row)
    // (`mlirnn.small_chunk = tiles`, a sum over the batch with a large accumulator: first a loop over
    // equal chunks of one inner loop (its tile sizes), the batch loop inside; `mlirnn.small_chunk_tasks`:
    // the chunks as tasks on threads)
{small_chunks}    // (`mlirnn.split_lanes_in_chunks`: the split of `mlirnn.split_lanes` inside each chunk, so that the
    // second part reads the chunk's columns of A from cache)
{chunk_splits}    // (`mlirnn.small_tasks = array<i64: rows>`: first split into tasks of that many rows on threads)
{small_tasks}{small_row_blocks}    %block_for = transform.cast %block_loop : !transform.any_op to !transform.op<"scf.for">
    %whole, %rest = transform.loop.peel %block_for : (!transform.op<"scf.for">) -> (!transform.any_op, !transform.any_op)
    transform.foreach %whole, %rest : !transform.any_op, !transform.any_op {
    ^bb0(%whole_loop: !transform.any_op, %rest_loop: !transform.any_op):
      // (the peeled loop's block size folds to a constant: static slices)
      transform.apply_patterns to %whole_loop {
        transform.apply_patterns.canonicalization
      } : !transform.any_op
      // (`mlirnn.split_lanes_in_blocks`: the split of `mlirnn.split_lanes`, inside each block, so that
      // both parts read the block's rows of A while they are in L1)
{whole_splits}      // (`mlirnn.small_k_steps`, the (m, k, n) order: a loop over k in steps of {small_k_step}, the
      // block's accumulators hoisted into registers below, instead of k unrolled whole)
      %whole_k = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.small_k_steps} in %whole_loop
          : (!transform.any_op) -> !transform.any_op
      %whole_steps, %whole_k_loop = transform.structured.tile_using_for %whole_k tile_sizes [0, {small_k_step}, 0]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      %whole_block = transform.structured.match ops{["linalg.generic"]} in %whole_loop
          : (!transform.any_op) -> !transform.any_op
      transform.structured.vectorize %whole_block : !transform.any_op
{rest_splits}      %rest_block = transform.structured.match ops{["linalg.generic"]} in %rest_loop
          : (!transform.any_op) -> !transform.any_op
      %rest_row, %rest_rows = transform.structured.tile_using_for %rest_block tile_sizes [1, 0, 0]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      %rest_k = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.small_k_steps} in %rest_loop
          : (!transform.any_op) -> !transform.any_op
      %rest_steps, %rest_k_loop = transform.structured.tile_using_for %rest_k tile_sizes [0, {small_k_step}, 0]
          : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
      %rest_vector = transform.structured.match ops{["linalg.generic"]} in %rest_loop
          : (!transform.any_op) -> !transform.any_op
      transform.structured.vectorize %rest_vector : !transform.any_op
    }

    // Sums over the batch (`mlirnn.row_sum`, mlir_nn/codegen/row_sums.py): a vector per row, the totals
    // carried in registers across the row loop (hoisted below).
    %row_sums = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.row_sum} in %root
        : (!transform.any_op) -> !transform.any_op
    %sum_rows, %sum_loop = transform.structured.tile_using_for %row_sums tile_sizes [1, 0]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.structured.vectorize %sum_rows : !transform.any_op

    // Tasks. Swapped products (C^T of a product with few columns, `mlirnn.parallel_columns`)
    // have one row panel: tasks of {swapped_panels} column panels. (Their accumulators' zero
    // fills stay outside the tasks: mlir_nn/codegen/zero_start.py drops them after the schedule.
    // Fusing each into its tasks took 0.7 s of an 8x64 MLP's Adam step.)
    %parallel = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.packed, mlirnn.parallel} in %root
        : (!transform.any_op) -> !transform.any_op
    %chunks, %row_forall = transform.structured.tile_using_forall %parallel tile_sizes [{col_panels}, {row_panels}]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    // (products whose columns are one task's, `mlirnn.parallel_fine`: tasks of {fine_row_panels} row panels,
    // so that a partial last task leaves the other cores little to wait for)
    %parallel_fine = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.packed, mlirnn.parallel_fine}
        in %root : (!transform.any_op) -> !transform.any_op
    %fine_chunks, %fine_forall = transform.structured.tile_using_forall %parallel_fine
        tile_sizes [{col_panels}, {fine_row_panels}] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %parallel_cols = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.packed, mlirnn.parallel_columns} in %root
        : (!transform.any_op) -> !transform.any_op
    %col_chunks, %col_forall = transform.structured.tile_using_forall %parallel_cols tile_sizes [{swapped_panels}]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    // (products with static rows whose default tasks would be few or uneven,
    // `mlirnn.parallel_tasks = array<i64: column panels, row panels>`: tasks of those sizes)
{balanced_tasks}    // kc slices of k, as deep as each product's `mlirnn.kc = array<i64: kc>` says (marked for the
    // zero start of the accumulators that follows the schedule, in cpu_matmul.py); per column panel,
    // per row panel, the register kernel.
{kc_slices}    %blocks, %col_loop, %row_loop = transform.structured.tile_using_for %slices tile_sizes [1, 1, 0, 0, 0]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)
    %steps, %k_loop = transform.structured.tile_using_for %blocks tile_sizes [0, 0, 0, 0, 1]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.annotate %k_loop "mlirnn.register_k_loop" : !transform.any_op
    transform.structured.vectorize %steps : !transform.any_op
    transform.apply_patterns to %root {
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.vector.reduction_to_contract
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // Keep each block's accumulators in registers across the k loop.
    %loops = transform.structured.match ops{["scf.for"]} in %root : (!transform.any_op) -> !transform.op<"scf.for">
    transform.loop.hoist_loop_invariant_subsets %loops : !transform.op<"scf.for">
    transform.apply_patterns to %root {
      transform.apply_patterns.vector.lower_transpose lowering_strategy = "shuffle_16x16"
      transform.apply_patterns.vector.lower_contraction lowering_strategy = "outerproduct"
      transform.apply_patterns.vector.lower_outerproduct
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    // ({k_unroll} register kernels per iteration of the k loop; the loops matched again by their tag:
    // the hoisting above replaced some, on threads the SGD-fused weight gradients', whose handles in
    // %k_loop then went stale and were left one register kernel per iteration)
    %k_loops = transform.structured.match ops{["scf.for"]} attributes {mlirnn.register_k_loop} in %root
        : (!transform.any_op) -> !transform.any_op
    transform.loop.unroll %k_loops {factor = {k_unroll}} : !transform.any_op
    transform.yield
  }
}
