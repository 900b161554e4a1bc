/* SPDX-License-Identifier: MIT */
/*
 * nf4 — dequantize bitsandbytes 4-bit weights (NF4, FP4) to fp16 / bf16 / fp32,
 * bit-identical to bitsandbytes, in one kernel launch per tensor (or per group).
 *
 * This is the stable C API (C99). No exception ever crosses it: every function returns an
 * nf4_status and, on failure, leaves a human-readable message in the context
 * (nf4_last_error(ctx)) or, for functions without a context, in a thread-local slot
 * (nf4_last_error(NULL)).
 *
 * Memory spaces. An nf4_tensor's pointers are read by the backend that runs it:
 *   - nf4_dequantize*()      : pointers the backend addresses directly — host memory for the
 *                              cpu backend, CUDA device memory for the cuda backend (work is
 *                              enqueued on the context's stream, no host synchronization).
 *                              The vulkan backend has no raw pointers: use nf4_vulkan.h there.
 *   - nf4_dequantize*_host() : host memory on every backend; accelerators stage through their
 *                              own buffers and return when the output is written.
 *
 * Thread safety (checked by tests/test_stress.cpp under ThreadSanitizer, docs/RELIABILITY.md).
 *   - nf4_version, nf4_status_string, nf4_dtype_size, nf4_backend_*, nf4_validate and
 *     nf4_context_create may be called from any thread at any time (backends are probed once,
 *     on first use, thread-safely).
 *   - A context may be used by several threads at once: calls on one context are serialized
 *     internally by a mutex (nf4_dequantize*, nf4_context_set_cuda_stream), so they run one
 *     after the other, never interleaved; on cuda they are enqueued on the context's one stream
 *     in that order. For concurrency, give each thread its own context.
 *   - The last error is per thread: nf4_last_error(ctx) returns the message of the calling
 *     thread's own last failed call on ctx, never that of another live thread ("" if it has had
 *     none; messages are kept by thread id, so a new thread may inherit the one a finished thread
 *     with a reused id left). The string stays valid until that thread's next failed call on ctx
 *     or nf4_context_destroy.
 *     nf4_last_error(NULL) is the calling thread's last failure of a function without a context
 *     (valid until its next such failure). A successful call does not clear either message.
 *   - nf4_context_backend and nf4_context_device_name only read what was fixed at creation.
 *   - nf4_context_destroy must not race with any other call on the same context, and no thread
 *     may use the context (or a string it returned) afterwards.
 *   - Buffers: concurrent calls may share input buffers (they are only read); two calls running
 *     at once must not write the same output buffer.
 */
#ifndef NF4_NF4_H
#define NF4_NF4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(NF4_SHARED_BUILD)
#define NF4_API __declspec(dllexport)
#elif defined(__GNUC__)
#define NF4_API __attribute__((visibility("default")))
#else
#define NF4_API
#endif

#define NF4_VERSION_MAJOR 0
#define NF4_VERSION_MINOR 1
#define NF4_VERSION_PATCH 0

/* Largest element count accepted: keeps every derived byte count (fp32 output = 4 bytes per
 * element) far inside int64 and size_t on 64-bit hosts. */
#define NF4_MAX_ELEMENTS ((int64_t)1 << 56)

/* Status codes, grouped by range: 0 ok, 1xx argument validation, 2xx backend/runtime,
 * 3xx files. Each validation failure has its own code so callers (and tests) can tell them apart. */
typedef enum nf4_status {
  NF4_OK = 0,

  NF4_ERR_NULL_POINTER = 100,         /* a required pointer is NULL */
  NF4_ERR_QUANT_TYPE = 101,           /* quant_type is neither NF4 nor FP4 */
  NF4_ERR_DTYPE = 102,                /* out_dtype is not fp16, bf16 or fp32 */
  NF4_ERR_ELEMENT_COUNT = 103,        /* numel < 1 or > NF4_MAX_ELEMENTS (overflow) */
  NF4_ERR_BLOCKSIZE = 104,            /* blocksize not a power of two in [32, 4096] */
  NF4_ERR_NESTED_BLOCKSIZE = 105,     /* nested blocksize not a power of two in [1, 2^20] */
  NF4_ERR_PACKED_SIZE = 106,          /* packed byte count != ceil(numel / 2) */
  NF4_ERR_ABSMAX_SIZE = 107,          /* absmax count != ceil(numel / blocksize) */
  NF4_ERR_NESTED_ABSMAX_SIZE = 108,   /* nested absmax count != ceil(absmax count / nested bs) */
  NF4_ERR_QUANT_MAP_SIZE = 109,       /* quant_map count != 16 */
  NF4_ERR_NESTED_CODE_SIZE = 110,     /* nested code count != 256 */
  NF4_ERR_OUTPUT_TOO_SMALL = 111,     /* out_bytes < numel * sizeof(out dtype) */
  NF4_ERR_INVALID_ARGUMENT = 112,     /* anything else about the arguments (message says what) */
  NF4_ERR_ALIASING = 113,             /* the output overlaps an input */
  NF4_ERR_SHAPE = 114,                /* gemv: n * k != weight numel, or n, k, m out of range */

  NF4_ERR_UNKNOWN_BACKEND = 200,      /* backend name not recognized */
  NF4_ERR_BACKEND_UNAVAILABLE = 201,  /* backend not compiled in, or no device / driver */
  NF4_ERR_UNSUPPORTED = 202,          /* operation not offered by this backend */
  NF4_ERR_OUT_OF_MEMORY = 203,        /* host or device allocation failed */
  NF4_ERR_DEVICE = 204,               /* a device / driver call failed (message has details) */

  NF4_ERR_IO = 300,                   /* open, read, write, rename failed (disk full, ...) */
  NF4_ERR_FORMAT = 301,               /* a file is malformed (safetensors header, quant state) */
  NF4_ERR_INTERRUPTED = 302,          /* cancelled by a signal */

  NF4_ERR_INTERNAL = 900
} nf4_status;

typedef enum nf4_quant_type { NF4_QUANT_NF4 = 0, NF4_QUANT_FP4 = 1 } nf4_quant_type;

typedef enum nf4_dtype { NF4_DTYPE_F16 = 0, NF4_DTYPE_BF16 = 1, NF4_DTYPE_F32 = 2 } nf4_dtype;

typedef enum nf4_backend_kind {
  NF4_BACKEND_AUTO = 0, /* NF4_BACKEND env var if set, else the fastest available */
  NF4_BACKEND_CPU = 1,
  NF4_BACKEND_CUDA = 2,
  NF4_BACKEND_VULKAN = 3
} nf4_backend_kind;

/*
 * One bitsandbytes 4-bit weight and where its dequantized copy goes.
 * Counts are element counts of each array (not bytes), except packed_bytes and out_bytes.
 *
 *   element i : packed[i/2] >> 4 if i is even, packed[i/2] & 15 if odd
 *   flat      : absmax is float[ceil(numel/blocksize)]
 *   nested    : absmax is uint8[nA]; absmax value b =
 *                 fl32(fl32(nested_code[absmax[b]] * nested_absmax[b / nested_blocksize]) + offset)
 *               where offset = *nested_offset_ptr if that is non-NULL (read by the backend, in
 *               its memory space: a 0-d device tensor stays on the device), else nested_offset.
 *   value     : NF4 -> quant_map[q]; FP4 -> bitsandbytes' device FP4 table (quant_map may be
 *               NULL for FP4; if given it must have 16 entries, and it is not used: bitsandbytes'
 *               kernel ignores it too, and they differ only in the sign of zero for code 8).
 *   out[i]    : round-to-nearest-even to out_dtype of fl32(value(q_i) * absmax[i / blocksize]).
 */
typedef struct nf4_tensor {
  nf4_quant_type quant_type;
  nf4_dtype out_dtype;
  int64_t numel;       /* elements of the original weight, prod(shape) */
  int32_t blocksize;   /* power of two, 32..4096 */
  int32_t nested;      /* 0: flat fp32 absmax; 1: uint8 absmax + second-level statistics */

  const uint8_t* packed; /* ceil(numel/2) bytes */
  int64_t packed_bytes;

  const void* absmax;    /* float[] (flat) or uint8_t[] (nested) */
  int64_t absmax_count;

  const float* quant_map; /* float[16] */
  int64_t quant_map_count;

  /* nested only (ignored when nested == 0) */
  const float* nested_absmax; /* float[ceil(absmax_count / nested_blocksize)] */
  int64_t nested_absmax_count;
  const float* nested_code;   /* float[256] */
  int64_t nested_code_count;
  int32_t nested_blocksize;   /* power of two; 256 in practice */
  float nested_offset;
  const float* nested_offset_ptr; /* optional: overrides nested_offset, read by the backend */

  void* out;          /* numel elements of out_dtype */
  int64_t out_bytes;  /* capacity of out in bytes */
} nf4_tensor;

typedef struct nf4_context nf4_context;

typedef struct nf4_backend_info {
  const char* name;        /* "cpu", "cuda", "vulkan" */
  nf4_backend_kind kind;
  int32_t available;       /* compiled in and a device was found */
  const char* device_name; /* e.g. "NVIDIA H100 80GB HBM3"; or why it is unavailable */
} nf4_backend_info;

/* "0.1.0" */
NF4_API const char* nf4_version(void);
NF4_API const char* nf4_status_string(nf4_status status);
NF4_API size_t nf4_dtype_size(nf4_dtype dtype);

/* Registered backends (compiled in or not, available or not), in registry order.
 * The strings live as long as the process. */
NF4_API size_t nf4_backend_count(void);
NF4_API nf4_status nf4_backend_get_info(size_t index, nf4_backend_info* info);
/* "auto" | "cpu" | "cuda" | "vulkan" -> kind; NF4_ERR_UNKNOWN_BACKEND otherwise. */
NF4_API nf4_status nf4_backend_parse(const char* name, nf4_backend_kind* kind);

/* Checks a description without running anything. On failure the message is available from
 * nf4_last_error(NULL). */
NF4_API nf4_status nf4_validate(const nf4_tensor* tensor);

NF4_API nf4_status nf4_context_create(nf4_backend_kind backend, nf4_context** ctx);
NF4_API void nf4_context_destroy(nf4_context* ctx);
NF4_API nf4_backend_kind nf4_context_backend(const nf4_context* ctx);
NF4_API const char* nf4_context_device_name(const nf4_context* ctx);
/* Last failure message on this context for the calling thread ("" if none). With ctx == NULL:
 * the calling thread's last failure of a function that has no context. */
NF4_API const char* nf4_last_error(const nf4_context* ctx);

/* CUDA: the cudaStream_t to enqueue on (default: the legacy default stream, 0). */
NF4_API nf4_status nf4_context_set_cuda_stream(nf4_context* ctx, void* cuda_stream);

/* Dequantize, pointers in the backend's own memory space (see top). Validates everything first;
 * on any error nothing is written. */
NF4_API nf4_status nf4_dequantize(nf4_context* ctx, const nf4_tensor* tensor);
/* Many tensors in one launch where the backend can (cuda: one kernel for all). */
NF4_API nf4_status nf4_dequantize_grouped(nf4_context* ctx, const nf4_tensor* tensors, size_t count);

/* Same, with every pointer in host memory, on any backend. Returns once out is written. */
NF4_API nf4_status nf4_dequantize_host(nf4_context* ctx, const nf4_tensor* tensor);
NF4_API nf4_status nf4_dequantize_grouped_host(nf4_context* ctx, const nf4_tensor* tensors,
                                               size_t count);

/* ---- Fused matrix-vector product (decode): Y[m, n] = sum_k X[m, k] * W[n, k] -------------------
 *
 * W is a bitsandbytes 4-bit weight of shape [n, k] (row-major, as transformers stores a Linear's
 * weight [out_features, in_features]): flat element i = row * k + col, blocks of `blocksize`
 * consecutive flat elements, so a block may straddle two rows when k % blocksize != 0.
 * X is [m, k] and Y is [m, n], both contiguous row-major, m = 1..NF4_GEMV_MAX_M.
 *
 * The numbers (docs/GEMV.md; the same bits on every backend, for every m, on every run):
 *   w(r, c)    = fl32(value(q_i) * absmax[i / blocksize]), i = r * k + c: exactly the fp32 value
 *                nf4_dequantize writes (nested absmax decoded as described for nf4_tensor)
 *   x(j, c)    = X[j, c] converted exactly to fp32
 *   p(j, r, c) = fl32(w(r, c) * x(j, c))                      one rounding, never an FMA
 *   Y[j, r]    = the root of the complete binary tree over P = (the smallest power of two >= k)
 *                leaves p(j, r, 0..k-1) followed by P - k leaves +0.0f: node t of level L + 1 is
 *                fl32(node 2t + node 2t + 1 of level L), one rounding per addition, no FMA
 *   output     = Y rounded to nearest even to y_dtype (or kept fp32); a NaN result is written as
 *                the positive quiet NaN of y_dtype (0x7fc00000, bf16 0x7fc0, fp16 0x7e00), since
 *                devices differ in which NaN payload an operation on NaNs returns.
 * So row j of Y depends on k, W and row j of X only: not on m, the other rows or the backend.
 * Error: docs/GEMV.md states (and tests/test_gemv.cpp checks) the bound against a float64 sum.
 *
 * Pointers: nf4_gemv() takes pointers in the backend's own memory space (cuda: device memory,
 * enqueued on the context's stream, no synchronization; cpu: host memory); nf4_gemv_host() takes
 * host pointers on every backend and returns once y is written. On vulkan, nf4_gemv() returns
 * NF4_ERR_UNSUPPORTED (no raw pointers: record with nf4_vulkan_gemv_job_create, nf4_vulkan.h).
 * Validation before any work, each failure with its own status and a message naming the field:
 * the weight as nf4_validate checks it (without out / out_bytes / out_dtype, which are unused),
 * NF4_ERR_SHAPE (n < 1, k < 1, n * k != weight->numel, m outside 1..NF4_GEMV_MAX_M),
 * NF4_ERR_DTYPE (x_dtype or y_dtype not fp16 / bf16 / fp32), NF4_ERR_NULL_POINTER,
 * NF4_ERR_OUTPUT_TOO_SMALL (y_bytes < m * n * sizeof(y_dtype)), NF4_ERR_ALIASING (y overlaps x or
 * any buffer of the weight, tables included). On any error nothing is written.
 * Thread safety and buffers: as for nf4_dequantize.
 * (A prepared, validate-once form like the dequantize one can wrap this description later.) */
#define NF4_GEMV_MAX_M 8

typedef struct nf4_gemv_desc {
  const nf4_tensor* weight; /* W: numel == n * k; out_dtype, out and out_bytes are not used */
  int64_t n;                /* rows of W = columns of Y (output features) */
  int64_t k;                /* columns of W = columns of X (input features) */
  int32_t m;                /* rows of X and Y, 1..NF4_GEMV_MAX_M */
  nf4_dtype x_dtype;        /* fp16, bf16 or fp32 */
  const void* x;            /* m * k elements of x_dtype, row-major */
  nf4_dtype y_dtype;        /* fp16, bf16 or fp32 */
  void* y;                  /* m * n elements of y_dtype, row-major */
  int64_t y_bytes;          /* capacity of y in bytes */
} nf4_gemv_desc;

/* Checks a product description without running anything (message: nf4_last_error(NULL)). */
NF4_API nf4_status nf4_gemv_validate(const nf4_gemv_desc* gemv);
/* Pointers in the backend's memory space (see above); cuda: on the context's stream. */
NF4_API nf4_status nf4_gemv(nf4_context* ctx, const nf4_gemv_desc* gemv);
/* Host pointers on any backend; returns once y is written. */
NF4_API nf4_status nf4_gemv_host(nf4_context* ctx, const nf4_gemv_desc* gemv);
/* ---- end of the matrix-vector product ---------------------------------------------------------- */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NF4_NF4_H */
