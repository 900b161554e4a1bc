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
 *   - nf4_version, nf4_status_string, nf4_dtype_size, nf4_backend_*, nf4_device_*, nf4_validate
 *     and nf4_context_create* may be called from any thread at any time (backends are probed and
 *     their devices enumerated once, on first use, thread-safely). One exception outside nf4:
 *     with NF4_VULKAN_VALIDATION=1, the validation layer of Debian 12 (1.3.239) races between
 *     device creation or destruction and other threads' Vulkan calls (docs/RELIABILITY.md,
 *     section 2): there, create and destroy Vulkan contexts while no other thread uses Vulkan.
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
 *   - nf4_context_backend, nf4_context_device_name and nf4_context_device_index only read what
 *     was fixed at creation.
 *   - nf4_context_destroy must not race with any other call on the same context, and no thread
 *     may use the context (or a string it returned) afterwards.
 *   - Buffers: concurrent calls may share input buffers (they are only read); two calls running
 *     at once must not write the same output buffer.
 */
#ifndef NF4_NF4_H
#define NF4_NF4_H

#include <stddef.h>
#include <stdint.h>

#include "nf4/version.h" /* NF4_VERSION_MAJOR / _MINOR / _PATCH / _STRING, generated from VERSION */

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

/* The library's version, "MAJOR.MINOR.PATCH" (NF4_VERSION_STRING of the headers it was built with). */
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

/*
 * Context options: settings fixed when a context is created (nf4_context_create_ex).
 *
 * Forward compatible: zero the whole struct (NF4_CONTEXT_OPTIONS_INIT, or memset), set
 * struct_size to sizeof(nf4_context_options) as your header defines it (the macro does) and leave
 * fields you do not set at 0, which always means "default". Fields are only ever appended. The library reads the
 * fields it knows that lie within struct_size; a larger struct (a newer header) is accepted when
 * every field this library does not know is 0, and fails with NF4_ERR_UNSUPPORTED otherwise, so
 * an option is never ignored silently. struct_size below 8 (the first version) or above 4096
 * fails with NF4_ERR_INVALID_ARGUMENT.
 *
 *   cpu_threads : threads the cpu backend runs one call on, the calling thread included; 1..1024,
 *                 or 0 for the default. Precedence: this field if non-zero, else the environment
 *                 variable NF4_CPU_THREADS (read at context creation; a value that is not an
 *                 integer in 1..1024 fails the creation with NF4_ERR_INVALID_ARGUMENT), else every
 *                 hardware thread (std::thread::hardware_concurrency()). The threads are started
 *                 once, when the context is created, sleep between calls and are joined by
 *                 nf4_context_destroy: calls never create threads. A call on a small tensor runs
 *                 on fewer threads (work is split in chunks of 2^20 elements). Other backends
 *                 ignore it. Negative or above 1024: NF4_ERR_INVALID_ARGUMENT.
 */
typedef struct nf4_context_options {
  uint32_t struct_size; /* sizeof(nf4_context_options) */
  int32_t cpu_threads;  /* 0 = default */
} nf4_context_options;

#define NF4_CONTEXT_OPTIONS_INIT {(uint32_t)sizeof(nf4_context_options), 0}

/* nf4_context_create with options; options == NULL gives every default (what nf4_context_create
 * does). Callable from any thread at any time, like nf4_context_create; `options` is only read
 * during the call. */
NF4_API nf4_status nf4_context_create_ex(nf4_backend_kind backend, const nf4_context_options* options,
                                         nf4_context** ctx);
NF4_API void nf4_context_destroy(nf4_context* ctx);
NF4_API nf4_backend_kind nf4_context_backend(const nf4_context* ctx);
NF4_API const char* nf4_context_device_name(const nf4_context* ctx);

/*
 * Devices: each backend's devices, and a context on a chosen one (an engine with several GPUs
 * holds one context per GPU and may use them from different threads at once).
 *
 * An available backend has at least one device, numbered from 0 in an order fixed for the life
 * of the process:
 *   cpu    : one device, the host.
 *   cuda   : the CUDA ordinals, as the CUDA runtime numbers them (after CUDA_VISIBLE_DEVICES).
 *   vulkan : the usable physical devices (Vulkan 1.1 with a compute queue) in the order
 *            vkEnumeratePhysicalDevices lists them; an index in NF4_VULKAN_DEVICE counts the same way.
 * An unavailable (or unknown) backend has none. NF4_BACKEND_AUTO names the backend that
 * nf4_context_create(NF4_BACKEND_AUTO) would take. The devices are enumerated once, with the
 * backends' probe; these functions may be called from any thread at any time.
 *
 * nf4_context_create_on_device(backend, device, options, &ctx) makes a context that runs all its
 * work on that device:
 *   cuda   : every call on it, prepared launches included, makes the device current on the calling
 *            thread for the call's duration and then restores the thread's previous CUDA context
 *            (none, if it had none), so a thread whose current device is another one may use it;
 *            its allocations, staging copies and kernels are all on that device. Device pointers
 *            passed to it must be memory that device can access, and the streams it is given
 *            (nf4_context_set_cuda_stream, a prepared launch's `stream`) must belong to it:
 *            nf4_context_set_cuda_stream refuses a stream of another device with
 *            NF4_ERR_INVALID_ARGUMENT where the CUDA runtime can tell (12.8 and newer) and the
 *            stream is not being captured into a CUDA graph (the query would end the capture); a
 *            launch on one fails with NF4_ERR_DEVICE.
 *   vulkan : the context's own VkDevice is made on that physical device, whatever NF4_VULKAN_DEVICE
 *            says.
 *   cpu    : device 0, the same as nf4_context_create_ex.
 * A device index past the backend's count fails with NF4_ERR_INVALID_ARGUMENT (the message names the
 * index and the count); an unavailable backend with NF4_ERR_BACKEND_UNAVAILABLE.
 *
 * A context from nf4_context_create / nf4_context_create_ex keeps its default device: cuda runs
 * each call on the calling thread's current device (whatever it is at that call); vulkan takes
 * NF4_VULKAN_DEVICE (an index as above, or a substring of the name), else the first device of the
 * best type (discrete GPU, integrated GPU, virtual GPU, other, CPU).
 */
typedef enum nf4_device_type {
  NF4_DEVICE_TYPE_CPU = 0,            /* the host's processors (the cpu backend; lavapipe on vulkan) */
  NF4_DEVICE_TYPE_DISCRETE_GPU = 1,
  NF4_DEVICE_TYPE_INTEGRATED_GPU = 2, /* a GPU sharing the host's memory */
  NF4_DEVICE_TYPE_OTHER = 3           /* a virtual GPU, or whatever else a driver reports */
} nf4_device_type;

/* What a device runs: the bits of nf4_device_info.caps. */
typedef enum nf4_device_cap {
  /* nf4_dequantize* and nf4_gemv take pointers in the device's memory (without it: only the _host
   * calls, and the backend's own API, nf4_vulkan.h) */
  NF4_DEVICE_CAP_DEVICE_POINTERS = 1 << 0,
  NF4_DEVICE_CAP_HOST_POINTERS = 1 << 1, /* and those pointers are host memory (the cpu backend) */
  NF4_DEVICE_CAP_PREPARED = 1 << 2,      /* nf4_prepare */
  NF4_DEVICE_CAP_PREPARED_GEMV = 1 << 3, /* nf4_gemv_prepare */
  /* NF4_GEMV_FAST can run the fast contract here, for the descriptions nf4_gemv_mode_used says
   * (vulkan: a device with cooperative matrices, which nf4 runs only with NF4_VULKAN_COOP=1, see
   * README.md); without it every product runs the exact contract */
  NF4_DEVICE_CAP_GEMV_FAST = 1 << 4
} nf4_device_cap;

/*
 * One device (nf4_device_get_info). Forward compatible like nf4_context_options: set struct_size
 * to sizeof(nf4_device_info) as your header defines it (NF4_DEVICE_INFO_INIT does); the library
 * fills the fields it knows and zeroes the rest of struct_size bytes (a newer header's fields
 * then read 0, "unknown"). struct_size below the first version's size (64 bytes on 64-bit hosts)
 * or above 4096 fails with NF4_ERR_INVALID_ARGUMENT. The strings live as long as the process.
 */
typedef struct nf4_device_info {
  uint32_t struct_size;     /* sizeof(nf4_device_info), set by the caller */
  nf4_backend_kind backend; /* the backend it belongs to (never NF4_BACKEND_AUTO) */
  uint32_t index;           /* its index within that backend (nf4_context_create_on_device) */
  nf4_device_type type;
  const char* name;         /* the device's name, e.g. "NVIDIA H100 80GB HBM3" */
  const char* description;  /* the name and what else identifies it, e.g. "NVIDIA H100 80GB HBM3
                               (sm_90, 132 SMs, 50 MiB L2)" */
  uint64_t memory_bytes;    /* its own memory: cuda the global memory, vulkan the largest
                               device-local heap, cpu the host's physical memory; 0 if unknown */
  uint32_t caps;            /* nf4_device_cap bits */
  uint8_t uuid[16];         /* cuda and vulkan: the device's UUID (one GPU has the same in both, so
                               an engine can pair its Vulkan device with nf4's CUDA one); cpu: 0 */
} nf4_device_info;

#define NF4_DEVICE_INFO_INIT \
  {(uint32_t)sizeof(nf4_device_info), NF4_BACKEND_AUTO, 0, NF4_DEVICE_TYPE_CPU, NULL, NULL, 0, 0, {0}}

/* Devices of `backend` (0 where it is unavailable or unknown; see above). */
NF4_API size_t nf4_device_count(nf4_backend_kind backend);
/* Device `index` of `backend`. NF4_ERR_NULL_POINTER, NF4_ERR_UNKNOWN_BACKEND,
 * NF4_ERR_BACKEND_UNAVAILABLE, NF4_ERR_INVALID_ARGUMENT (index out of range, struct_size);
 * message: nf4_last_error(NULL). */
NF4_API nf4_status nf4_device_get_info(nf4_backend_kind backend, size_t index, nf4_device_info* info);
/* A context on device `device` of `backend` (see above), with `options` as for
 * nf4_context_create_ex (NULL: every default). */
NF4_API nf4_status nf4_context_create_on_device(nf4_backend_kind backend, size_t device, const nf4_context_options* options,
                                                nf4_context** ctx);
/* The index of the device the context runs on (nf4_device_get_info), fixed at creation; -1 for a
 * cuda context from nf4_context_create(_ex), which runs on each calling thread's current device,
 * and for ctx == NULL. */
NF4_API int32_t nf4_context_device_index(const nf4_context* ctx);
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

/*
 * Diagnostics. The library never prints by itself: messages that are not errors of a call (a
 * Vulkan validation-layer report, the outcome of a device self-check) go to the callback set
 * here, process-wide. Without a callback they are dropped, unless the environment variable
 * NF4_LOG is error, warning, info or debug: then messages of that level and more severe are
 * printed on stderr. The callback may be called from any thread, one message at a time (calls
 * are serialized); `message` is valid during the call only. Set it before other nf4 calls, or
 * at any time (a replacement takes effect for the next message); NULL restores the default.
 */
typedef enum nf4_log_level { NF4_LOG_ERROR = 0, NF4_LOG_WARNING = 1, NF4_LOG_INFO = 2, NF4_LOG_DEBUG = 3 } nf4_log_level;
typedef void (*nf4_log_fn)(nf4_log_level level, const char* message, void* user);
NF4_API void nf4_set_log_callback(nf4_log_fn fn, void* user);

/*
 * Prepared launches: validate and plan once, launch many times.
 *
 * nf4_prepare() does everything that depends only on the descriptions: it validates them exactly
 * like nf4_dequantize_grouped() (same statuses and messages, nothing is written on error), checks
 * the backend's own pointer rules (cuda: alignment), chooses the kernel configuration, splits the
 * work and builds the argument blocks and grid. A later launch then only patches the buffer
 * addresses it is given and enqueues: no allocation, no device query, no synchronization, and no
 * check beyond the pointers themselves (non-NULL, alignment, output not overlapping an input).
 *
 *   nf4_prepared* p;
 *   nf4_prepare(ctx, &t, 1, &p);                   t as for nf4_dequantize (device pointers)
 *   nf4_prepared_launch(p, NULL, stream);          the prepared buffers, on `stream`
 *   nf4_prepared_launch(p, &other_out, stream);    the prepared inputs into another output
 *   nf4_prepared_launch_buffers(p, &b, stream);    other inputs of the same geometry too
 *   nf4_prepared_destroy(p);
 *
 * Backends: cpu (host pointers; runs on the calling thread's pool and returns when done; `stream`
 * must be NULL) and cuda (device pointers; `stream` is a cudaStream_t, NULL meaning the context's
 * stream as set by nf4_context_set_cuda_stream, which is read at launch). On the vulkan backend,
 * whose buffers are VkBuffers, the prepared form is nf4_vulkan_job_create() +
 * nf4_vulkan_job_record() (nf4_vulkan.h); nf4_prepare() returns NF4_ERR_UNSUPPORTED there.
 *
 * Lifetime and threads: a prepared launch refers to its context, which must outlive it. It is
 * immutable once made: any number of threads may launch the same prepared object at once (each
 * launch builds its argument block on its own stack), and launches do not take the context's
 * mutex. The usual buffer rule holds: two launches running at once must not write the same
 * output. nf4_prepared_destroy() must not race with a launch of the same object; work already
 * enqueued needs nothing from the object (argument blocks are copied at launch).
 * Failures of a launch are reported like the context's other calls (nf4_last_error(ctx)).
 */
typedef struct nf4_prepared nf4_prepared;

/* The addresses of one tensor, for a launch with other buffers of the prepared geometry. Every
 * field is required where the prepared description had it (NULL where it had NULL). */
typedef struct nf4_buffers {
  const uint8_t* packed;
  const void* absmax;
  const float* quant_map;
  const float* nested_absmax;
  const float* nested_code;
  const float* nested_offset_ptr; /* NULL: nested_offset below */
  float nested_offset;
  void* out;
} nf4_buffers;

NF4_API nf4_status nf4_prepare(nf4_context* ctx, const nf4_tensor* tensors, size_t count, nf4_prepared** prepared);
/* outs: NULL (the prepared outputs) or one output pointer per prepared tensor. */
NF4_API nf4_status nf4_prepared_launch(const nf4_prepared* prepared, void* const* outs, void* stream);
/* buffers: one nf4_buffers per prepared tensor. */
NF4_API nf4_status nf4_prepared_launch_buffers(const nf4_prepared* prepared, const nf4_buffers* buffers, void* stream);
NF4_API size_t nf4_prepared_count(const nf4_prepared* prepared); /* tensors prepared */
NF4_API void nf4_prepared_destroy(nf4_prepared* prepared);

/* ---- Fused matrix-vector / matrix-matrix product: Y[m, n] = sum_k X[m, k] * W[n, k] -------------
 *
 * W is a bitsandbytes 4-bit weight of shape [n, k] (row-major, as transformers stores a Linear's
 * weight [out_features, in_features]): flat element i = row * k + col, blocks of `blocksize`
 * consecutive flat elements, so a block may straddle two rows when k % blocksize != 0.
 * X is [m, k] and Y is [m, n], both contiguous row-major, m = 1..NF4_GEMV_MAX_M.
 *
 * Two contracts (nf4_gemv_desc.mode; docs/GEMV.md). Both are batch-invariant: row j of Y depends
 * on k, W and row j of X only, never on m, the other rows or the run.
 *
 * NF4_GEMV_EXACT (what a zero-initialized description gets): the same bits on every backend.
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
 *   Error: docs/GEMV.md states (and tests/test_gemv.cpp checks) the bound against a float64 sum.
 *
 * NF4_GEMV_FAST (tensor cores where the device has them; x_dtype fp16 or bf16):
 *   w(r, c)    = w(r, c) of the exact contract rounded to x_dtype: exactly what nf4_dequantize
 *                writes with out_dtype = x_dtype
 *   Y[j, r]    = sum over c of w(r, c) * X[j, c] with fp32 accumulation, in an order that depends
 *                on k, the blocksize, the dtypes and the device only (never on m, the other rows,
 *                the launch or the run): repeatable bit for bit and batch-invariant on a device,
 *                but not the same bits on every backend. Error against a float64 sum of the same
 *                w and X: within the bound of docs/GEMV.md ("The fast contract").
 *   output     = as for the exact contract.
 *   Where the backend or device has no tensor-core path for the description (fp32 x, the vulkan
 *   backend, bf16 x below sm_80), the exact contract runs: nf4_gemv_mode_used() says which.
 *
 * Pointers: nf4_gemv() takes pointers in the backend's own memory space (cuda: device memory,
 * enqueued on the context's stream, no synchronization; cpu: host memory); nf4_gemv_host() takes
 * host pointers on every backend and returns once y is written. On vulkan, nf4_gemv() returns
 * NF4_ERR_UNSUPPORTED (no raw pointers: record with nf4_vulkan_gemv_job_create, nf4_vulkan.h).
 * Validation before any work, each failure with its own status and a message naming the field:
 * the weight as nf4_validate checks it (without out / out_bytes / out_dtype, which are unused),
 * NF4_ERR_SHAPE (n < 1, k < 1, n * k != weight->numel, m outside 1..NF4_GEMV_MAX_M),
 * NF4_ERR_DTYPE (x_dtype or y_dtype not fp16 / bf16 / fp32), NF4_ERR_INVALID_ARGUMENT (mode not
 * an nf4_gemv_mode), NF4_ERR_NULL_POINTER, NF4_ERR_OUTPUT_TOO_SMALL (y_bytes < m * n *
 * sizeof(y_dtype)), NF4_ERR_ALIASING (y overlaps x or any buffer of the weight, tables included).
 * On any error nothing is written.
 * Thread safety and buffers: as for nf4_dequantize.
 * A decode step that runs the same product every token prepares it once (nf4_gemv_prepare, below). */
#define NF4_GEMV_MAX_M 256

typedef enum nf4_gemv_mode {
  NF4_GEMV_EXACT = 0, /* the bit-exact contract, the same bits on every backend */
  NF4_GEMV_FAST = 1   /* tensor cores: weights rounded to x_dtype, fp32 accumulation */
} nf4_gemv_mode;

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
  nf4_gemv_mode mode;       /* NF4_GEMV_EXACT (0) or NF4_GEMV_FAST */
  /* Optional scratch in the backend's memory space, or NULL (what a zero-initialized description
   * gets). Where it holds at least nf4_gemv_workspace_size() bytes the product may use it: the cuda
   * backend's fast contract then also has a form that sums the parts of k on separate CTAs and adds
   * them in a second kernel (docs/GEMV.md), which pays for weights of few rows. The bits never
   * depend on it. Written during the call, nothing to keep: two products that run at once must not
   * share one, and it must not overlap x, y or any buffer of the weight (NF4_ERR_ALIASING); on
   * cuda it must be 16-byte aligned (NF4_ERR_INVALID_ARGUMENT). nf4_gemv_host(), the cpu and the
   * vulkan backends do not use it. */
  void* workspace;
  int64_t workspace_bytes;  /* its capacity in bytes: 0 where workspace is NULL */
} nf4_gemv_desc;

/* Checks a product description without running anything (message: nf4_last_error(NULL)). */
NF4_API nf4_status nf4_gemv_validate(const nf4_gemv_desc* gemv);
/* Pointers in the backend's memory space (see above); cuda: on the context's stream. */
NF4_API nf4_status nf4_gemv(nf4_context* ctx, const nf4_gemv_desc* gemv);
/* Host pointers on any backend; returns once y is written. */
NF4_API nf4_status nf4_gemv_host(nf4_context* ctx, const nf4_gemv_desc* gemv);
/* The contract `ctx` runs `gemv` under: gemv->mode where the backend and device offer it for this
 * description, else NF4_GEMV_EXACT. Validates like nf4_gemv(); runs nothing. */
NF4_API nf4_status nf4_gemv_mode_used(nf4_context* ctx, const nf4_gemv_desc* gemv, nf4_gemv_mode* mode);
/* The workspace bytes (nf4_gemv_desc.workspace) that let `ctx` run `gemv` its fastest way; 0
 * where no workspace would change the kernel. Validates like nf4_gemv(); runs nothing. */
NF4_API nf4_status nf4_gemv_workspace_size(nf4_context* ctx, const nf4_gemv_desc* gemv, size_t* bytes);

/*
 * Prepared products: validate and plan once, launch every decode step.
 *
 * nf4_gemv_prepare() validates the description exactly like nf4_gemv() (same statuses and
 * messages), checks the backend's pointer rules, chooses the kernel and its grid, and builds the
 * argument block. nf4_gemv_prepared_launch() then runs the product with the prepared x and y, or
 * with new ones of the same shape and dtypes (NULL keeps the prepared pointer): no allocation, no
 * device query, no synchronization; its only checks are on the new pointers: y must not overlap
 * x or any buffer of the weight (NF4_ERR_ALIASING), and on cuda both must be aligned to their
 * element size and x to 16 bytes where the prepared x was (NF4_ERR_INVALID_ARGUMENT). The
 * weight's buffers are the prepared ones for the object's whole life.
 *
 *   nf4_gemv_prepared* p;
 *   nf4_gemv_prepare(ctx, &g, &p);                    g as for nf4_gemv (device pointers)
 *   nf4_gemv_prepared_launch(p, NULL, NULL, stream);  the prepared x and y, on `stream`
 *   nf4_gemv_prepared_launch(p, x2, y2, stream);      this step's activations and output
 *   nf4_gemv_prepared_destroy(p);
 *
 * Backends and streams as for nf4_prepare: cpu (host pointers, returns when y is written, `stream`
 * must be NULL) and cuda (device pointers, `stream` a cudaStream_t, NULL = the context's stream).
 * On vulkan the prepared form is nf4_vulkan_gemv_job_create() + nf4_vulkan_job_record()
 * (nf4_vulkan.h); nf4_gemv_prepare() returns NF4_ERR_UNSUPPORTED there.
 * Lifetime and threads as for nf4_prepared: the context must outlive the object; any number of
 * threads may launch it at once (each launch builds its arguments on its own stack) provided they
 * write different y; nf4_gemv_prepared_destroy() must not race with a launch of the same object.
 * A workspace in the prepared description is every launch's (it must stay allocated while the
 * object lives): such a product's launches must not run at once (one stream, say); new x and y
 * must not overlap it.
 */
typedef struct nf4_gemv_prepared nf4_gemv_prepared;
NF4_API nf4_status nf4_gemv_prepare(nf4_context* ctx, const nf4_gemv_desc* gemv, nf4_gemv_prepared** prepared);
/* x, y: NULL for the prepared pointer, or a new one in the backend's memory space. */
NF4_API nf4_status nf4_gemv_prepared_launch(const nf4_gemv_prepared* prepared, const void* x, void* y, void* stream);
NF4_API void nf4_gemv_prepared_destroy(nf4_gemv_prepared* prepared);
/* The contract the prepared product runs under (see nf4_gemv_mode_used). */
NF4_API nf4_gemv_mode nf4_gemv_prepared_mode(const nf4_gemv_prepared* prepared);
/* ---- end of the matrix-vector product ---------------------------------------------------------- */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NF4_NF4_H */
