// Hand-written CUDA reference kernels of mlir-nn: the baseline that the MLIR-generated
// kernels are benchmarked against (benchmarks/gpu_check.py). float32, row-major.
// Every entry point is a C function taking device pointers and launching on `stream`;
// it returns the cudaError_t of the launch (0 = success).
#include <cuda_runtime.h>

#define TILE 16

namespace {

__global__ void matmul_naive_kernel(const float* a, const float* b, float* c, int m, int n, int k) {
  int row = blockIdx.y * blockDim.y + threadIdx.y;
  int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= m || col >= n) return;
  float acc = 0.f;
  for (int i = 0; i < k; ++i) acc += a[row * k + i] * b[i * n + col];
  c[row * n + col] = acc;
}

__global__ void matmul_tiled_kernel(const float* a, const float* b, float* c, int m, int n, int k) {
  __shared__ float as[TILE][TILE];
  __shared__ float bs[TILE][TILE];
  int row = blockIdx.y * TILE + threadIdx.y;
  int col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.f;
  for (int t = 0; t < k; t += TILE) {
    as[threadIdx.y][threadIdx.x] = (row < m && t + threadIdx.x < k) ? a[row * k + t + threadIdx.x] : 0.f;
    bs[threadIdx.y][threadIdx.x] = (col < n && t + threadIdx.y < k) ? b[(t + threadIdx.y) * n + col] : 0.f;
    __syncthreads();
    for (int i = 0; i < TILE; ++i) acc += as[threadIdx.y][i] * bs[i][threadIdx.x];
    __syncthreads();
  }
  if (row < m && col < n) c[row * n + col] = acc;
}

__global__ void bias_add_kernel(const float* x, const float* bias, float* y, int rows, int cols) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < rows * cols) y[i] = x[i] + bias[i % cols];
}

__global__ void relu_kernel(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

__global__ void relu_grad_kernel(const float* x, const float* g, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] > 0.f ? g[i] : 0.f;
}

// One block: a shared-memory tree reduction of (p - y)^2, then the mean.
__global__ void mse_kernel(const float* p, const float* y, float* loss, int n) {
  __shared__ float part[256];
  float acc = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float d = p[i] - y[i];
    acc += d * d;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = part[0] / (float)n;
}

__global__ void mse_grad_kernel(const float* p, const float* y, float* g, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) g[i] = 2.f * (p[i] - y[i]) / (float)n;
}

__global__ void sgd_update_kernel(float* param, const float* grad, float lr, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) param[i] -= lr * grad[i];
}

inline int blocks_for(int n, int threads) { return (n + threads - 1) / threads; }

}  // namespace

extern "C" {

int mlirnn_matmul_naive(const float* a, const float* b, float* c, int m, int n, int k, cudaStream_t stream) {
  dim3 block(TILE, TILE), grid(blocks_for(n, TILE), blocks_for(m, TILE));
  matmul_naive_kernel<<<grid, block, 0, stream>>>(a, b, c, m, n, k);
  return (int)cudaGetLastError();
}

int mlirnn_matmul_tiled(const float* a, const float* b, float* c, int m, int n, int k, cudaStream_t stream) {
  dim3 block(TILE, TILE), grid(blocks_for(n, TILE), blocks_for(m, TILE));
  matmul_tiled_kernel<<<grid, block, 0, stream>>>(a, b, c, m, n, k);
  return (int)cudaGetLastError();
}

int mlirnn_bias_add(const float* x, const float* bias, float* y, int rows, int cols, cudaStream_t stream) {
  bias_add_kernel<<<blocks_for(rows * cols, 256), 256, 0, stream>>>(x, bias, y, rows, cols);
  return (int)cudaGetLastError();
}

int mlirnn_relu(const float* x, float* y, int n, cudaStream_t stream) {
  relu_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(x, y, n);
  return (int)cudaGetLastError();
}

int mlirnn_relu_grad(const float* x, const float* g, float* out, int n, cudaStream_t stream) {
  relu_grad_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(x, g, out, n);
  return (int)cudaGetLastError();
}

int mlirnn_mse(const float* p, const float* y, float* loss, int n, cudaStream_t stream) {
  mse_kernel<<<1, 256, 0, stream>>>(p, y, loss, n);
  return (int)cudaGetLastError();
}

int mlirnn_mse_grad(const float* p, const float* y, float* g, int n, cudaStream_t stream) {
  mse_grad_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(p, y, g, n);
  return (int)cudaGetLastError();
}

int mlirnn_sgd_update(float* param, const float* grad, float lr, int n, cudaStream_t stream) {
  sgd_update_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(param, grad, lr, n);
  return (int)cudaGetLastError();
}

int mlirnn_synchronize(void) { return (int)cudaDeviceSynchronize(); }

}  // extern "C"
