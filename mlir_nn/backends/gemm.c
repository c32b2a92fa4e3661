/* Matrix products of the quick tier: C += op(A) op(B), float32 and float64, any strides.

   The quick tier's code (mlir_nn.codegen.gemm_calls) calls these instead of compiling each
   product through MLIR and LLVM. Each matrix comes as MLIR passes a memref<?x?xT, strided<[?, ?],
   offset: ?>> argument (allocated and aligned pointers, offset, two sizes, two strides); a
   transposed operand (trans_a, trans_b) is read with its strides swapped. GotoBLAS-style: a
   kc-deep slice of op(B) is packed into column panels of NR columns, an mc x kc block of op(A)
   into row panels of MR rows (zero-padded), and an MR x NR register block of accumulators is
   computed from them with vector FMAs, then added to C. Built once per machine with -O3
   -march=native (mlir_nn.backends.gemm); needs only the C library. The calling thread computes
   each product; with mlirnn_gemm_set_threads(2) a large one is cut in two halves of C, one of them
   computed meanwhile by a helper thread (made at the first such product, idle on a condition
   variable between them: the quick tier's first call has both cores, its later ones leave one
   to the compile process). */

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* From this many multiply-adds on, a product is cut in two (a helper's wake-up costs ~10-50 us) */
#define SPLIT_WORK (1 << 22)

static int threads = 1;              /* mlirnn_gemm_set_threads */
static pthread_mutex_t helper_user = PTHREAD_MUTEX_INITIALIZER; /* held by the caller it helps */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t posted = PTHREAD_COND_INITIALIZER, finished = PTHREAD_COND_INITIALIZER;
static void (*job)(void *);          /* the helper's next work, under lock */
static void *job_argument;
static int job_done, helper_running;

void mlirnn_gemm_set_threads(int count) { threads = count < 1 ? 1 : count; }

static void *helper(void *unused) {
    (void)unused;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (job == NULL) pthread_cond_wait(&posted, &lock);
        void (*work)(void *) = job;
        void *argument = job_argument;
        job = NULL;
        pthread_mutex_unlock(&lock);
        work(argument);
        pthread_mutex_lock(&lock);
        job_done = 1;
        pthread_cond_signal(&finished);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

/* A fork copies only the forking thread: the child makes its own helper when it needs one. */
static void forget_helper(void) {
    pthread_mutex_init(&helper_user, NULL);
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&posted, NULL);
    pthread_cond_init(&finished, NULL);
    job = NULL;
    job_done = helper_running = 0;
}

/* Hand work(argument) to the helper and return 1, or 0 (the caller does it all) when two threads
   are not asked for, the helper serves another caller, or it cannot be made. */
static int give_helper(void (*work)(void *), void *argument) {
    if (threads < 2 || pthread_mutex_trylock(&helper_user) != 0) return 0;
    if (!helper_running) {
        pthread_t thread;
        pthread_attr_t attributes;
        pthread_attr_init(&attributes);
        pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&thread, &attributes, helper, NULL);
        pthread_attr_destroy(&attributes);
        if (failed) {
            pthread_mutex_unlock(&helper_user);
            return 0;
        }
        static int fork_handled;
        if (!fork_handled) fork_handled = pthread_atfork(NULL, NULL, forget_helper) == 0;
        helper_running = 1;
    }
    pthread_mutex_lock(&lock);
    job = work;
    job_argument = argument;
    job_done = 0;
    pthread_cond_signal(&posted);
    pthread_mutex_unlock(&lock);
    return 1;
}

/* Wait for the work given to the helper (give_helper returned 1) and free it for other callers. */
static void join_helper(void) {
    pthread_mutex_lock(&lock);
    while (!job_done) pthread_cond_wait(&finished, &lock);
    pthread_mutex_unlock(&lock);
    pthread_mutex_unlock(&helper_user);
}

#if defined(__AVX512F__)
#define VECTOR_BYTES 64
#define MR 12
#elif defined(__AVX__)
#define VECTOR_BYTES 32
#define MR 6
#else
#define VECTOR_BYTES 16
#define MR 4
#endif

#define KC 256 /* k of one packed slice: an NR-column panel of it stays in L1 */
#define MC (MR * 8) /* rows of op(A) packed at once: MC x KC stays in L2 */
#define NC 1024 /* columns of op(B) packed at once */

#define DEFINE_GEMM(T, NAME)                                                                           \
    typedef T NAME##_vec __attribute__((vector_size(VECTOR_BYTES), aligned(VECTOR_BYTES)));            \
    typedef T NAME##_uvec __attribute__((vector_size(VECTOR_BYTES), aligned(sizeof(T))));              \
    enum { NAME##_VL = VECTOR_BYTES / sizeof(T), NAME##_NR = 2 * (VECTOR_BYTES / sizeof(T)) };          \
                                                                                                       \
    /* pa[p * MR + i] = op(A)[i, p] for i < rows (zeros after), p < kc; read along whichever of      \
       i and p is contiguous (strided reads of a row-major operand, a row apart each, fall in one       \
       cache set) */                                                                                   \
    static void NAME##_pack_a(T *pa, const T *a, int64_t rs, int64_t cs, int64_t rows, int64_t kc) {   \
        if (cs == 1) {                                                                                 \
            for (int64_t i = 0; i < rows; i++)                                                         \
                for (int64_t p = 0; p < kc; p++) pa[p * MR + i] = a[i * rs + p];                       \
            for (int64_t p = 0; p < kc && rows < MR; p++)                                              \
                for (int64_t i = rows; i < MR; i++) pa[p * MR + i] = 0;                                \
            return;                                                                                    \
        }                                                                                              \
        for (int64_t p = 0; p < kc; p++, pa += MR) {                                                   \
            const T *column = a + p * cs;                                                              \
            int64_t i = 0;                                                                             \
            for (; i < rows; i++) pa[i] = column[i * rs];                                              \
            for (; i < MR; i++) pa[i] = 0;                                                             \
        }                                                                                              \
    }                                                                                                  \
                                                                                                       \
    /* pb[p * NR + j] = op(B)[p, j] for j < cols (zeros after), p < kc; along p where that is        \
       contiguous (a transposed operand) */                                                            \
    static void NAME##_pack_b(T *pb, const T *b, int64_t rs, int64_t cs, int64_t cols, int64_t kc) {   \
        if (rs == 1 && cs != 1) {                                                                      \
            for (int64_t j = 0; j < cols; j++)                                                         \
                for (int64_t p = 0; p < kc; p++) pb[p * NAME##_NR + j] = b[j * cs + p];                \
            for (int64_t p = 0; p < kc && cols < NAME##_NR; p++)                                       \
                for (int64_t j = cols; j < NAME##_NR; j++) pb[p * NAME##_NR + j] = 0;                  \
            return;                                                                                    \
        }                                                                                              \
        for (int64_t p = 0; p < kc; p++, pb += NAME##_NR) {                                            \
            const T *row = b + p * rs;                                                                 \
            int64_t j = 0;                                                                             \
            if (cs == 1) {                                                                             \
                memcpy(pb, row, (size_t)cols * sizeof(T));                                             \
                j = cols;                                                                              \
            } else {                                                                                   \
                for (; j < cols; j++) pb[j] = row[j * cs];                                             \
            }                                                                                          \
            for (; j < NAME##_NR; j++) pb[j] = 0;                                                      \
        }                                                                                              \
    }                                                                                                  \
                                                                                                       \
    /* C[:rows, :cols] += the MR x NR block of packed panels pa and pb, kc deep */                     \
    static void NAME##_block(int64_t kc, const T *pa, const T *pb, T *c, int64_t rs, int64_t cs,       \
                             int64_t rows, int64_t cols) {                                             \
        NAME##_vec acc[MR][2];                                                                         \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] =                  \
            (NAME##_vec){0};                                                                           \
        for (int64_t p = 0; p < kc; p++, pa += MR, pb += NAME##_NR) {                                  \
            NAME##_vec b0 = *(const NAME##_vec *)pb, b1 = *(const NAME##_vec *)(pb + NAME##_VL);       \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                    \
                acc[i][0] += pa[i] * b0;                                                               \
                acc[i][1] += pa[i] * b1;                                                               \
            }                                                                                          \
        }                                                                                              \
        if (cs == 1 && rows == MR && cols == NAME##_NR) {                                              \
            _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                                    \
                NAME##_uvec *row = (NAME##_uvec *)(c + i * rs);                                        \
                row[0] += acc[i][0];                                                                   \
                row[1] += acc[i][1];                                                                   \
            }                                                                                          \
            return;                                                                                    \
        }                                                                                              \
        T tile[MR][NAME##_NR] __attribute__((aligned(VECTOR_BYTES)));                                  \
        memcpy(tile, acc, sizeof(tile));                                                               \
        for (int64_t i = 0; i < rows; i++)                                                             \
            for (int64_t j = 0; j < cols; j++) c[i * rs + j * cs] += tile[i][j];                       \
    }                                                                                                  \
                                                                                                       \
    static void NAME##_run(int64_t m, int64_t n, int64_t k, const T *a, int64_t rs_a, int64_t cs_a,     \
                          const T *b, int64_t rs_b, int64_t cs_b, T *c, int64_t rs_c, int64_t cs_c) {  \
        if (m <= 0 || n <= 0 || k <= 0) return;                                                      \
        int64_t kc_max = k < KC ? k : KC, nc_max = n < NC ? n : NC, mc_max = m < MC ? m : MC;          \
        int64_t nc_padded = (nc_max + NAME##_NR - 1) / NAME##_NR * NAME##_NR;                          \
        int64_t mc_padded = (mc_max + MR - 1) / MR * MR;                                               \
        /* aligned_alloc wants a multiple of the alignment */                                         \
        size_t b_bytes = ((size_t)(kc_max * nc_padded) * sizeof(T) + VECTOR_BYTES) / VECTOR_BYTES * VECTOR_BYTES;\
        size_t a_bytes = ((size_t)(kc_max * mc_padded) * sizeof(T) + VECTOR_BYTES) / VECTOR_BYTES * VECTOR_BYTES;\
        T *pb = aligned_alloc(VECTOR_BYTES, b_bytes), *pa = aligned_alloc(VECTOR_BYTES, a_bytes);        \
        if (pa == NULL || pb == NULL) { /* no room for the panels: the product unpacked */           \
            free(pa);                                                                                  \
            free(pb);                                                                                  \
            for (int64_t i = 0; i < m; i++)                                                            \
                for (int64_t p = 0; p < k; p++)                                                        \
                    for (int64_t j = 0; j < n; j++) c[i * rs_c + j * cs_c] += a[i * rs_a + p * cs_a] * b[p * rs_b + j * cs_b];\
            return;                                                                                    \
        }                                                                                              \
        for (int64_t jc = 0; jc < n; jc += NC) {                                                       \
            int64_t nc = n - jc < NC ? n - jc : NC;                                                    \
            for (int64_t pc = 0; pc < k; pc += KC) {                                                   \
                int64_t kc = k - pc < KC ? k - pc : KC;                                                \
                for (int64_t jr = 0; jr < nc; jr += NAME##_NR) {                                       \
                    int64_t cols = nc - jr < NAME##_NR ? nc - jr : NAME##_NR;                          \
                    NAME##_pack_b(pb + jr * kc, b + pc * rs_b + (jc + jr) * cs_b, rs_b, cs_b, cols, kc);\
                }                                                                                      \
                for (int64_t ic = 0; ic < m; ic += MC) {                                               \
                    int64_t mc = m - ic < MC ? m - ic : MC;                                            \
                    for (int64_t ir = 0; ir < mc; ir += MR) {                                          \
                        int64_t rows = mc - ir < MR ? mc - ir : MR;                                    \
                        NAME##_pack_a(pa + ir * kc, a + (ic + ir) * rs_a + pc * cs_a, rs_a, cs_a, rows, kc);\
                    }                                                                                  \
                    for (int64_t jr = 0; jr < nc; jr += NAME##_NR) {                                   \
                        int64_t cols = nc - jr < NAME##_NR ? nc - jr : NAME##_NR;                      \
                        for (int64_t ir = 0; ir < mc; ir += MR) {                                      \
                            int64_t rows = mc - ir < MR ? mc - ir : MR;                                \
                            NAME##_block(kc, pa + ir * kc, pb + jr * kc,                               \
                                         c + (ic + ir) * rs_c + (jc + jr) * cs_c, rs_c, cs_c, rows, cols);\
                        }                                                                              \
                    }                                                                                  \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
        free(pa);                                                                                      \
        free(pb);                                                                                      \
    }                                                                                                  \
                                                                                                       \
    typedef struct {                                                                                   \
        int64_t m, n, k;                                                                               \
        const T *a;                                                                                    \
        int64_t rs_a, cs_a;                                                                            \
        const T *b;                                                                                    \
        int64_t rs_b, cs_b;                                                                            \
        T *c;                                                                                          \
        int64_t rs_c, cs_c;                                                                            \
    } NAME##_product;                                                                                  \
                                                                                                       \
    static void NAME##_run_product(void *product) {                                                    \
        NAME##_product *p = product;                                                                   \
        NAME##_run(p->m, p->n, p->k, p->a, p->rs_a, p->cs_a, p->b, p->rs_b, p->cs_b, p->c, p->rs_c, p->cs_c);\
    }                                                                                                  \
                                                                                                       \
    /* The product whole, or (two threads, SPLIT_WORK) its second half of C's rows (or columns, when \
       there are fewer than two row panels) on the helper while this thread computes the first */    \
    static void NAME##_split(NAME##_product whole) {                                                   \
        NAME##_product first = whole, second = whole;                                                  \
        if (whole.m * whole.n * whole.k < SPLIT_WORK) {                                                \
            NAME##_run_product(&whole);                                                                \
            return;                                                                                    \
        }                                                                                              \
        if (whole.m >= 2 * MR) {                                                                       \
            first.m = (whole.m / 2 + MR - 1) / MR * MR;                                                \
            second.m = whole.m - first.m;                                                              \
            second.a = whole.a + first.m * whole.rs_a;                                                 \
            second.c = whole.c + first.m * whole.rs_c;                                                 \
        } else {                                                                                       \
            first.n = (whole.n / 2 + NAME##_NR - 1) / NAME##_NR * NAME##_NR;                           \
            second.n = whole.n - first.n;                                                              \
            second.b = whole.b + first.n * whole.cs_b;                                                 \
            second.c = whole.c + first.n * whole.cs_c;                                                 \
        }                                                                                              \
        if (second.m <= 0 || second.n <= 0 || !give_helper(NAME##_run_product, &second)) {             \
            NAME##_run_product(&whole);                                                                \
            return;                                                                                    \
        }                                                                                              \
        NAME##_run_product(&first);                                                                    \
        join_helper();                                                                                 \
    }                                                                                                  \
                                                                                                       \
    /* MLIR's calling convention for (i64, i64, memref, memref, memref): each memref as (allocated,  \
       aligned, offset, size0, size1, stride0, stride1). A transposed operand's memref holds the       \
       operand as stored: op(A) is its transpose. */                                                   \
    void mlirnn_gemm_##NAME(int64_t trans_a, int64_t trans_b,                                          \
                            T *a_allocated, T *a, int64_t a_offset, int64_t a_size0, int64_t a_size1,  \
                            int64_t a_stride0, int64_t a_stride1,                                      \
                            T *b_allocated, T *b, int64_t b_offset, int64_t b_size0, int64_t b_size1,  \
                            int64_t b_stride0, int64_t b_stride1,                                      \
                            T *c_allocated, T *c, int64_t c_offset, int64_t c_size0, int64_t c_size1,  \
                            int64_t c_stride0, int64_t c_stride1) {                                    \
        (void)a_allocated;                                                                             \
        (void)b_allocated;                                                                             \
        (void)c_allocated;                                                                             \
        (void)b_size0;                                                                                 \
        (void)b_size1;                                                                                 \
        int64_t k = trans_a ? a_size0 : a_size1;                                                       \
        int64_t rs_a = trans_a ? a_stride1 : a_stride0, cs_a = trans_a ? a_stride0 : a_stride1;        \
        int64_t rs_b = trans_b ? b_stride1 : b_stride0, cs_b = trans_b ? b_stride0 : b_stride1;        \
        NAME##_split((NAME##_product){c_size0, c_size1, k, a + a_offset, rs_a, cs_a, b + b_offset, rs_b, cs_b,\
                                      c + c_offset, c_stride0, c_stride1});                            \
    }

DEFINE_GEMM(float, f32)
DEFINE_GEMM(double, f64)
