#id = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (j)>
#sc2 = affine_map<(i, j) -> ()>
#mmA = affine_map<(m, n, k) -> (m, k)>
#mmB = affine_map<(m, n, k) -> (k, n)>
#mmC = affine_map<(m, n, k) -> (m, n)>
#tA = affine_map<(m, n, k) -> (k, m)>
#s0 = affine_map<() -> ()>
func.func @mini(%x: tensor<?x4xf32>, %y: tensor<?x8xf32>, %W: tensor<4x8xf32>, %b: tensor<8xf32>)
    -> (tensor<f32>, tensor<4x8xf32>, tensor<8xf32>) {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %n = tensor.dim %x, %c0 : tensor<?x4xf32>
  %e = tensor.empty(%n) : tensor<?x8xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<?x8xf32>) -> tensor<?x8xf32>
  %h = linalg.matmul ins(%x, %W : tensor<?x4xf32>, tensor<4x8xf32>) outs(%f : tensor<?x8xf32>) -> tensor<?x8xf32>
  %e2 = tensor.empty(%n) : tensor<?x8xf32>
  %z = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%h, %b : tensor<?x8xf32>, tensor<8xf32>) outs(%e2 : tensor<?x8xf32>) {
    ^bb0(%a: f32, %bb: f32, %o: f32):
      %s = arith.addf %a, %bb : f32
      %r = arith.maximumf %s, %zero : f32
      linalg.yield %r : f32
  } -> tensor<?x8xf32>
  %el = tensor.empty() : tensor<f32>
  %fl = linalg.fill ins(%zero : f32) outs(%el : tensor<f32>) -> tensor<f32>
  %ss = linalg.generic {indexing_maps = [#id, #id, #sc2], iterator_types = ["reduction", "reduction"]}
      ins(%z, %y : tensor<?x8xf32>, tensor<?x8xf32>) outs(%fl : tensor<f32>) {
    ^bb0(%a: f32, %t: f32, %o: f32):
      %d = arith.subf %a, %t : f32
      %q = arith.mulf %d, %d : f32
      %s = arith.addf %o, %q : f32
      linalg.yield %s : f32
  } -> tensor<f32>
  %c8 = arith.constant 8 : index
  %cnt = arith.muli %n, %c8 : index
  %cnti = arith.index_cast %cnt : index to i64
  %cntf = arith.sitofp %cnti : i64 to f32
  %el2 = tensor.empty() : tensor<f32>
  %loss = linalg.generic {indexing_maps = [#s0, #s0], iterator_types = []}
      ins(%ss : tensor<f32>) outs(%el2 : tensor<f32>) {
    ^bb0(%a: f32, %o: f32):
      %r = arith.divf %a, %cntf : f32
      linalg.yield %r : f32
  } -> tensor<f32>
  %e3 = tensor.empty(%n) : tensor<?x8xf32>
  %g = linalg.generic {indexing_maps = [#id, #id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%z, %y, %z : tensor<?x8xf32>, tensor<?x8xf32>, tensor<?x8xf32>) outs(%e3 : tensor<?x8xf32>) {
    ^bb0(%a: f32, %t: f32, %zz: f32, %o: f32):
      %d = arith.subf %a, %t : f32
      %two = arith.constant 2.0 : f32
      %m = arith.mulf %d, %two : f32
      %q = arith.divf %m, %cntf : f32
      %pos = arith.cmpf ogt, %zz, %zero : f32
      %r = arith.select %pos, %q, %zero : f32
      linalg.yield %r : f32
  } -> tensor<?x8xf32>
  %e4 = tensor.empty() : tensor<4x8xf32>
  %f4 = linalg.fill ins(%zero : f32) outs(%e4 : tensor<4x8xf32>) -> tensor<4x8xf32>
  %gW = linalg.generic {indexing_maps = [#tA, #mmB, #mmC], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%x, %g : tensor<?x4xf32>, tensor<?x8xf32>) outs(%f4 : tensor<4x8xf32>) {
    ^bb0(%a: f32, %bb: f32, %o: f32):
      %m = arith.mulf %a, %bb : f32
      %s = arith.addf %o, %m : f32
      linalg.yield %s : f32
  } -> tensor<4x8xf32>
  %e5 = tensor.empty() : tensor<8xf32>
  %f5 = linalg.fill ins(%zero : f32) outs(%e5 : tensor<8xf32>) -> tensor<8xf32>
  %gb = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["reduction", "parallel"]}
      ins(%g : tensor<?x8xf32>) outs(%f5 : tensor<8xf32>) {
    ^bb0(%a: f32, %o: f32):
      %s = arith.addf %o, %a : f32
      linalg.yield %s : f32
  } -> tensor<8xf32>
  %lr = arith.constant 0.1 : f32
  %e6 = tensor.empty() : tensor<4x8xf32>
  %W2 = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%W, %gW : tensor<4x8xf32>, tensor<4x8xf32>) outs(%e6 : tensor<4x8xf32>) {
    ^bb0(%a: f32, %d: f32, %o: f32):
      %m = arith.mulf %d, %lr : f32
      %s = arith.subf %a, %m : f32
      linalg.yield %s : f32
  } -> tensor<4x8xf32>
  %e7 = tensor.empty() : tensor<8xf32>
  %b2 = linalg.generic {indexing_maps = [affine_map<(j) -> (j)>, affine_map<(j) -> (j)>, affine_map<(j) -> (j)>], iterator_types = ["parallel"]}
      ins(%b, %gb : tensor<8xf32>, tensor<8xf32>) outs(%e7 : tensor<8xf32>) {
    ^bb0(%a: f32, %d: f32, %o: f32):
      %m = arith.mulf %d, %lr : f32
      %s = arith.subf %a, %m : f32
      linalg.yield %s : f32
  } -> tensor<8xf32>
  return %loss, %W2, %b2 : tensor<f32>, tensor<4x8xf32>, tensor<8xf32>
}
