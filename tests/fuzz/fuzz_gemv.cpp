// SPDX-License-Identifier: MIT
// Fuzz target: the fused product's C API (nf4_gemv_desc, docs/GEMV.md) against the oracle, plain
// and prepared, on the cpu backend, under both contracts (the cpu computes the fast one too).
// Input: a flags byte, one product description (the weight's fields as fuzz_capi's, then n, k, m,
// the dtypes, the counts, y_bytes, the pointers, the contract), the buffers' contents, then the choices of the
// prepared launches. Every field is the right value, a near miss, or raw fuzz bytes; buffers are
// allocated with exactly the sizes the description claims (bounded) and filled with fuzz bytes
// (x may hold NaN, Inf, subnormals). In "arena" mode all buffers share one allocation at
// fuzz-chosen offsets (y often right against another buffer), so y can overlap x or the weight.
// An independent model here decides which checks the description violates. Then:
//  - nf4_gemv_validate succeeds exactly when the model finds no violation; on failure its status
//    is one the model found, with a non-empty message;
//  - nf4_gemv_host (or nf4_gemv: host pointers on cpu): on success y is the oracle's product bit
//    for bit and no other byte changed; on failure the validation status and no byte changed;
//  - nf4_gemv_prepare refuses with the same status (nothing written, no object), or succeeds; a
//    launch with the prepared pointers, with new x and/or y, gives the oracle's bits, even after
//    the caller's description and weight struct were overwritten (the object keeps a copy); a y
//    overlapping x or an array of the weight, or an x overlapping the prepared y, is refused with
//    NF4_ERR_ALIASING, and a stream is refused, each writing nothing.
// On another backend (NF4_FUZZ_BACKEND, tests/fuzz/fuzz_backend.h) the same description goes to
// nf4_gemv_host there: the same statuses, nothing written on a refusal, and on success y as the
// oracle's under the exact contract (any NaN where the oracle's is a NaN), only y written under
// the fast one (whose bits are the device's own); a refused description's prepare gives the
// validation status too. Prepared launches take device pointers there, so they are left to the
// cpu run and the backends' own tests.
#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <set>

#include "backends/cpu/gemv_oracle.h"
#include "tests/fuzz/fuzz_backend.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using namespace nf4::fuzz;

constexpr std::int64_t kMaxBufferBytes = 1 << 20;  // per buffer (claimed larger: not allocated)
// Descriptions claim weights of up to about 2^17 elements and are validated and prepared; those
// of up to kMaxRunNumel whose tree work (m * n * bit_ceil(k) leaves) is at most kMaxRunLeaves also
// run, up to five products per input (oracle, call, launches): twice that work halved the
// executions per second for the same coverage.
constexpr std::int64_t kMaxRunNumel = 1 << 15;
constexpr std::int64_t kMaxRunLeaves = 1 << 15;

enum { kPacked, kAbsmax, kQuantMap, kNestedAbsmax, kNestedCode, kOffset, kX, kY, kBuffers };

// One described product with the memory behind it.
struct Case : Memory {
  nf4_tensor w{};
  nf4_gemv_desc g{};
  bool runnable = true;         // valid, every buffer really as large as claimed, small enough
  std::set<int> violations;     // the model's verdict
  const char* alias = nullptr;  // what y overlaps, if that is the violation
  std::int64_t x_need = 0, y_need = 0;  // m * k and m * n elements, in bytes
  // The arrays of the weight that y must not overlap, with their sizes (the right ones).
  std::vector<std::pair<const void*, std::int64_t>> inputs;
};

Case make_case(Bytes& in, bool arena) {
  Case c;
  nf4_tensor& t = c.w;
  nf4_gemv_desc& g = c.g;
  const std::int32_t qt = set_enum(t.quant_type, in, 2);
  set_enum(t.out_dtype, in, 3);  // not used by the product: any value, valid or not
  take_block_format(in, t);

  // The shape: small n * k mostly (they run), k a power of two often (no padding in the tree),
  // raw values (negative, near 2^63, n * k past 2^56) now and then.
  auto sel = in.take<std::uint8_t>() % 16;
  g.n = sel < 8 ? in.range(1, 64) : sel < 12 ? in.range(1, 4096) : sel < 13 ? in.range(1, 1 << 17) : sel < 14 ? 1 << in.range(0, 12)
        : sel < 15 ? in.range(-1, 2) : in.take<std::int64_t>();
  sel = in.take<std::uint8_t>() % 16;
  g.k = sel < 6 ? in.range(1, 300) : sel < 10 ? in.range(1, 4096) : sel < 12 ? 1 << in.range(0, 12) : sel < 13 ? in.range(1, 1 << 17)
        : sel < 14 ? (1 << in.range(0, 12)) + in.range(-1, 1) : sel < 15 ? in.range(-1, 2) : in.take<std::int64_t>();
  sel = in.take<std::uint8_t>() % 16;
  g.m = sel < 14 ? static_cast<std::int32_t>(in.range(1, 8)) : sel < 15 ? static_cast<std::int32_t>(in.range(-1, 10)) : in.take<std::int32_t>();
  const std::int32_t xdt = set_enum(g.x_dtype, in, 3);
  const std::int32_t ydt = set_enum(g.y_dtype, in, 3);
  const __int128 nk = static_cast<__int128>(g.n) * g.k;
  t.numel = claim(in, g.n >= 1 && g.k >= 1 && nk <= INT64_MAX ? static_cast<std::int64_t>(nk) : 1);

  // The right sizes where they are defined (else something harmless, the model knows).
  const WeightSizes ws = weight_sizes(t);
  const bool m_ok = g.m >= 1 && g.m <= NF4_GEMV_MAX_M;
  const bool xdt_ok = xdt >= 0 && xdt <= 2, ydt_ok = ydt >= 0 && ydt <= 2;
  const bool shape_ok = ws.numel_ok && g.n >= 1 && g.k >= 1 && nk == t.numel && m_ok && g.n <= NF4_MAX_ELEMENTS / g.m &&
                        g.k <= NF4_MAX_ELEMENTS / g.m;  // x and y at most 2^56 elements each
  const std::int64_t xs = xdt == NF4_DTYPE_F32 ? 4 : 2, ys = ydt == NF4_DTYPE_F32 ? 4 : 2;
  // x and y sizes where m, k and n allow (m k and m n at most 2^56 when shape_ok).
  c.x_need = shape_ok ? g.m * g.k * xs : 0;
  c.y_need = shape_ok ? g.m * g.n * ys : 0;

  claim_weight_counts(in, t, ws);
  sel = in.take<std::uint8_t>() % 16;
  g.y_bytes = sel < 10 ? c.y_need : sel < 15 ? c.y_need + in.range(-3, 64) : in.take<std::int64_t>();
  t.out_bytes = in.take<std::int64_t>();  // not used by the product

  // Buffers: packed, absmax, quant_map, nested_absmax, nested_code, offset, x, y.
  const bool nested_layout = t.nested == 1;
  const std::int64_t elem[kBuffers] = {1, nested_layout ? 1 : 4, 4, 4, 4, 4, 1, 1};
  const std::int64_t count[kBuffers] = {t.packed_bytes, t.absmax_count, t.quant_map_count, t.nested_absmax_count,
                                        t.nested_code_count, 1, shape_ok && xdt_ok ? c.x_need : -1, g.y_bytes};
  Buffer b[kBuffers];
  const auto ptr_sel = in.take<std::uint8_t>();  // which pointers are NULL (rarely)
  const auto null_sel = in.take<std::uint8_t>();
  const auto out_sel = in.take<std::uint8_t>();  // where the unused weight->out points
  const bool weight_null = ptr_sel >= 224 && null_sel % (kBuffers + 1) == kBuffers;
  for (int i = 0; i < kBuffers; ++i) {
    const bool claimed_ok = count[i] >= 0 && count[i] <= kMaxBufferBytes / elem[i];
    if (!claimed_ok) c.runnable = false;
    b[i].bytes = claimed_ok ? count[i] * elem[i] : 4;
    b[i].null = ptr_sel >= 224 && null_sel % (kBuffers + 1) == i;
    if (i == kOffset) b[i].null = (ptr_sel & 1) != 0;                    // nested_offset_ptr is optional
    if (i == kQuantMap && qt == NF4_QUANT_FP4 && (ptr_sel & 2)) b[i].null = true;  // FP4 may omit quant_map
  }
  std::int64_t arena_bytes = 0;
  if (arena) {
    for (int i = 0; i < kY; ++i) {
      b[i].offset = in.range(0, arena_bytes + 64) & ~std::int64_t{3};
      arena_bytes = std::max(arena_bytes, b[i].offset + std::max<std::int64_t>(b[i].bytes, 4));
    }
    // y: anywhere, or right after or right before another buffer (give or take 4 bytes), where
    // an off-by-one in the overlap test would show.
    const auto place = in.take<std::uint8_t>();
    const Buffer& o = b[place % kY];
    const std::int64_t nudge = 4 * in.range(-1, 1);
    std::int64_t at = place < 96 ? in.range(0, arena_bytes + 64)
                      : place < 176 ? o.offset + o.bytes + 3 + nudge
                                    : o.offset - c.y_need + nudge;
    b[kY].offset = std::max<std::int64_t>(at, 0) & ~std::int64_t{3};
    arena_bytes = std::max(arena_bytes, b[kY].offset + std::max<std::int64_t>(b[kY].bytes, 4));
  }
  const std::vector<std::uint8_t*> ptr = c.place(in, b, kBuffers, arena, arena_bytes);
  set_weight_arrays(t, ptr);
  // Unused by the product, so y overlapping it is no violation.
  t.out = out_sel % 4 == 0 ? nullptr : out_sel % 4 == 1 ? ptr[kY] : out_sel % 4 == 2 ? ptr[kX] : ptr[kPacked];
  g.weight = weight_null ? nullptr : &t;
  g.x = ptr[kX];
  g.y = ptr[kY];
  // The contract, taken last so that earlier corpus files keep their meaning (exact when the
  // bytes run out): either contract, now and then a value that is neither.
  const std::int32_t mode = set_enum(g.mode, in, 2);
  // The workspace, taken after the mode for the same reason (none when the bytes run out): mostly
  // none; a block of its own; a few bytes on one of the buffers (an overlap to refuse where that
  // is x, y or an array of the weight); NULL with a size; a negative size.
  static std::uint8_t own_workspace[4096];
  const auto ws_sel = in.take<std::uint8_t>() % 8;
  if (ws_sel == 4) {
    g.workspace = own_workspace;
    g.workspace_bytes = in.range(0, static_cast<std::int64_t>(sizeof own_workspace));
  } else if (ws_sel == 5) {
    // Inside the buffer (a workspace reaching past it would meet whatever the heap puts there).
    const auto i = static_cast<std::size_t>(in.range(0, kBuffers - 1));
    const std::int64_t room = ptr[i] ? b[i].bytes : 0, at = room > 0 ? in.range(0, std::min<std::int64_t>(3, room - 1)) : 0;
    g.workspace = room > 0 ? ptr[i] + at : own_workspace;
    g.workspace_bytes = room > 0 ? in.range(1, std::min<std::int64_t>(64, room - at)) : in.range(1, 64);
  } else if (ws_sel == 6) {
    g.workspace_bytes = in.range(1, 100);
  } else if (ws_sel == 7) {
    g.workspace = own_workspace;
    g.workspace_bytes = -in.range(1, 5);
  }

  // The model: every check the description fails (each only where its inputs are defined).
  auto& v = c.violations;
  if (!g.weight) v.insert(NF4_ERR_NULL_POINTER);
  weight_violations(t, ws, v);
  if (ws.numel_ok && (g.n < 1 || g.k < 1 || nk != t.numel)) v.insert(NF4_ERR_SHAPE);
  if (!m_ok) v.insert(NF4_ERR_SHAPE);
  if (ws.numel_ok && g.n >= 1 && g.k >= 1 && nk == t.numel && m_ok && !shape_ok) v.insert(NF4_ERR_SHAPE);
  if (!xdt_ok || !ydt_ok) v.insert(NF4_ERR_DTYPE);
  if (!g.x || !g.y) v.insert(NF4_ERR_NULL_POINTER);
  if (shape_ok && ydt_ok && g.y_bytes < c.y_need) v.insert(NF4_ERR_OUTPUT_TOO_SMALL);
  if (mode != NF4_GEMV_EXACT && mode != NF4_GEMV_FAST) v.insert(NF4_ERR_INVALID_ARGUMENT);
  if (g.workspace_bytes < 0) v.insert(NF4_ERR_INVALID_ARGUMENT);
  else if (!g.workspace && g.workspace_bytes != 0) v.insert(NF4_ERR_NULL_POINTER);
  c.inputs = weight_inputs(t, ws);
  if (v.empty()) {
    // y [y, y + m * n * size) is written while x and every array of the weight are read; so is
    // the workspace, which must overlap none of them.
    c.alias = overlaps(g.y, c.y_need, g.x, c.x_need) ? "x" : overlapped_weight_array(g.y, c.y_need, c.inputs);
    if (!c.alias && g.workspace && g.workspace_bytes > 0) {
      const bool on_input = overlaps(g.workspace, g.workspace_bytes, g.x, c.x_need) || overlaps(g.workspace, g.workspace_bytes, g.y, c.y_need) ||
                            overlapped_weight_array(g.workspace, g.workspace_bytes, c.inputs);
      if (on_input) c.alias = "workspace";
    }
    if (c.alias) v.insert(NF4_ERR_ALIASING);
  }
  if (!v.empty() || t.numel > kMaxRunNumel || g.m * g.n * static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(g.k))) > kMaxRunLeaves) c.runnable = false;
  return c;
}

std::vector<std::vector<std::uint8_t>> snapshot(const Case& c) {
  std::vector<std::vector<std::uint8_t>> s;
  for (const auto& r : c.regions) s.emplace_back(r.p, r.p + r.bytes);
  return s;
}

void restore(const Case& c, const std::vector<std::vector<std::uint8_t>>& s) {
  for (std::size_t i = 0; i < c.regions.size(); ++i)
    if (!s[i].empty()) std::memcpy(c.regions[i].p, s[i].data(), s[i].size());
}

// The regions as they must be after a product wrote `y_bits` (y_need bytes) to y at `y`.
std::vector<std::vector<std::uint8_t>> with_y(const Case& c, std::vector<std::vector<std::uint8_t>> s, const void* y,
                                              const std::vector<std::uint8_t>& y_bits) {
  const auto* p = static_cast<const std::uint8_t*>(y);
  for (std::size_t i = 0; i < c.regions.size(); ++i)
    if (p >= c.regions[i].p && p < c.regions[i].p + c.regions[i].bytes) {
      std::memcpy(s[i].data() + (p - c.regions[i].p), y_bits.data(), y_bits.size());
      return s;
    }
  FUZZ_ASSERT(false, "y is in no region");
  return s;
}

// The oracle's y under `mode` (the description's own, unless given) for the weight of c with
// activations x, written to memory of its own (the weight is only read; a valid y overlaps
// nothing the product reads).
std::vector<std::uint8_t> oracle_y(const Case& c, const void* x, nf4_gemv_mode mode) {
  std::vector<std::uint8_t> y(static_cast<std::size_t>(c.y_need));
  nf4_gemv_desc g = c.g;
  g.mode = mode;
  g.x = x;
  g.y = y.data();
  g.workspace = nullptr;  // the oracle uses none (and its y is memory of its own)
  g.workspace_bytes = 0;
  g.y_bytes = c.y_need;
  nf4::cpu::oracle_gemv(g);
  return y;
}

std::vector<std::uint8_t> oracle_y(const Case& c, const void* x) { return oracle_y(c, x, static_cast<nf4_gemv_mode>(c.g.mode)); }

// With NF4_FUZZ_STATS set, prints at exit how many inputs took each path (to check that the
// fuzzer reaches the products and the prepared launches, not only the rejections).
struct Stats {
  long invalid = 0, aliasing = 0, valid_not_run = 0, ran = 0, ran_arena = 0, alias_launches = 0;
  ~Stats() {
    if (std::getenv("NF4_FUZZ_STATS"))
      std::fprintf(stderr,
                   "fuzz_gemv paths: invalid %ld (aliasing %ld), valid but too large to run %ld, ran %ld (arena %ld), "
                   "refused aliasing launches %ld\n",
                   invalid, aliasing, valid_not_run, ran, ran_arena, alias_launches);
  }
} g_stats;

// Prepares a copy of c's description and weight, then overwrites the copy: the object must keep
// its own.
nf4_status prepare(const Case& c, nf4_gemv_prepared** p) {
  nf4_context* ctx = target_context();
  nf4_tensor w = c.w;
  nf4_gemv_desc g = c.g;
  if (g.weight) g.weight = &w;
  *p = reinterpret_cast<nf4_gemv_prepared*>(&w);  // must be reset by the call
  const nf4_status s = nf4_gemv_prepare(ctx, &g, p);
  std::memset(static_cast<void*>(&w), 0xA7, sizeof w);
  std::memset(static_cast<void*>(&g), 0xA7, sizeof g);
  return s;
}

// After a product on another backend: every buffer as `expected` has it, y as
// same_but_nan_payloads allows (its bits compared only when `compare_y`).
bool same_as_oracle(const Case& c, const std::vector<std::vector<std::uint8_t>>& after,
                    const std::vector<std::vector<std::uint8_t>>& expected, bool compare_y) {
  if (after.size() != c.regions.size()) return false;
  for (std::size_t i = 0; i < c.regions.size(); ++i)
    if (!same_but_nan_payloads(c.regions[i].p, after[i], expected[i], c.g.y, static_cast<std::size_t>(c.y_need), c.g.y_dtype,
                               compare_y))
      return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  const auto flags = in.take<std::uint8_t>();
  Case c = make_case(in, flags & 1);
  nf4_context* ctx = target_context();

  // 1. nf4_gemv_validate against the model.
  const nf4_status sv = nf4_gemv_validate(&c.g);
  const auto& v = c.violations;
  if (v.empty()) {
    FUZZ_ASSERT(sv == NF4_OK, "validation failed (%d: %s) where the model finds nothing wrong", sv, nf4_last_error(nullptr));
  } else {
    FUZZ_ASSERT(sv != NF4_OK, "validation passed, the model says status %d (y overlaps: %s)", *v.begin(), c.alias ? c.alias : "nothing");
    FUZZ_ASSERT(v.count(sv), "status %d is not among the model's (first %d): %s", sv, *v.begin(), nf4_last_error(nullptr));
    FUZZ_ASSERT(nf4_last_error(nullptr)[0] != '\0', "empty message");
  }

  // 2. Refusals: the call and preparing give the validation status and write nothing.
  const auto before = snapshot(c);
  if (sv != NF4_OK) {
    const nf4_status s = (flags & 2) ? nf4_gemv(ctx, &c.g) : nf4_gemv_host(ctx, &c.g);
    FUZZ_ASSERT(s == sv, "gemv status %d, validation said %d: %s", s, sv, nf4_last_error(ctx));
    FUZZ_ASSERT(nf4_last_error(ctx)[0] != '\0', "empty message");
    nf4_gemv_prepared* p = nullptr;
    const nf4_status sp = prepare(c, &p);
    FUZZ_ASSERT(sp == sv, "prepare status %d, validation said %d: %s", sp, sv, nf4_last_error(ctx));
    FUZZ_ASSERT(p == nullptr, "a refused prepare returned an object");
    FUZZ_ASSERT(before == snapshot(c), "a refused call wrote to memory");
    ++g_stats.invalid;
    if (sv == NF4_ERR_ALIASING) ++g_stats.aliasing;
    return 0;
  }
  if (!target_is_cpu()) {
    if (!c.runnable) {
      ++g_stats.valid_not_run;
      return 0;
    }
    // A fast request runs the exact contract where the device has no fast path: the oracle of
    // the contract that ran.
    nf4_gemv_mode used = NF4_GEMV_FAST;
    FUZZ_ASSERT(nf4_gemv_mode_used(ctx, &c.g, &used) == NF4_OK, "gemv_mode_used failed: %s", nf4_last_error(ctx));
    const auto expected = with_y(c, before, c.g.y, oracle_y(c, c.g.x, NF4_GEMV_EXACT));
    const nf4_status s = nf4_gemv_host(ctx, &c.g);
    FUZZ_ASSERT(s == NF4_OK, "gemv failed on a valid description: %s", nf4_last_error(ctx));
    FUZZ_ASSERT(same_as_oracle(c, snapshot(c), expected, used == NF4_GEMV_EXACT),
                "gemv (%s contract) differs from the oracle, or wrote outside y", used == NF4_GEMV_EXACT ? "exact" : "fast");
    ++g_stats.ran;
    if (flags & 1) ++g_stats.ran_arena;
    return 0;
  }
  nf4_gemv_prepared* p = nullptr;
  FUZZ_ASSERT(prepare(c, &p) == NF4_OK && p, "prepare refused a valid description: %s", nf4_last_error(ctx));
  const std::unique_ptr<nf4_gemv_prepared, void (*)(nf4_gemv_prepared*)> prepared(p, nf4_gemv_prepared_destroy);
  if (!c.runnable) {
    ++g_stats.valid_not_run;
    return 0;
  }

  // 3. The call: y is the oracle's, nothing else changed.
  const auto y_bits = oracle_y(c, c.g.x);
  const auto expected = with_y(c, before, c.g.y, y_bits);
  const nf4_status s = (flags & 2) ? nf4_gemv(ctx, &c.g) : nf4_gemv_host(ctx, &c.g);
  FUZZ_ASSERT(s == NF4_OK, "gemv failed on a valid description: %s", nf4_last_error(ctx));
  FUZZ_ASSERT(snapshot(c) == expected, "gemv differs from the oracle, or wrote outside y");

  // 4. The prepared launch with its own pointers, on the memory as it was before the call.
  restore(c, before);
  FUZZ_ASSERT(nf4_gemv_prepared_launch(p, nullptr, nullptr, nullptr) == NF4_OK, "launch failed: %s", nf4_last_error(ctx));
  FUZZ_ASSERT(snapshot(c) == expected, "the prepared launch differs from gemv, or wrote outside y");

  // 5. New pointers: a fresh x with other values and / or a fresh y.
  const auto choice = in.take<std::uint8_t>();
  const bool new_x = choice % 3 != 1, new_y = choice % 3 != 0;
  const auto mask = static_cast<std::uint8_t>(in.take<std::uint8_t>() | 1);
  std::vector<std::uint8_t> x2(static_cast<const std::uint8_t*>(c.g.x), static_cast<const std::uint8_t*>(c.g.x) + c.x_need);
  for (auto& byte : x2) byte ^= mask;
  const auto x2_before = x2;
  const auto y2_bits = new_x ? oracle_y(c, x2.data()) : y_bits;
  std::vector<std::uint8_t> y2(static_cast<std::size_t>(c.y_need + 16), 0xA5);
  restore(c, before);
  FUZZ_ASSERT(nf4_gemv_prepared_launch(p, new_x ? x2.data() : nullptr, new_y ? y2.data() : nullptr, nullptr) == NF4_OK,
              "launch with new pointers (x %d, y %d) failed: %s", new_x, new_y, nf4_last_error(ctx));
  FUZZ_ASSERT(x2 == x2_before, "the launch wrote to x");
  if (new_y) {
    FUZZ_ASSERT(std::memcmp(y2.data(), y2_bits.data(), y2_bits.size()) == 0, "the launch into a new y differs from the oracle");
    FUZZ_ASSERT(std::all_of(y2.end() - 16, y2.end(), [](std::uint8_t u) { return u == 0xA5; }), "the launch wrote past the new y");
    FUZZ_ASSERT(snapshot(c) == before, "a launch into a new y wrote to the prepared buffers");
  } else {
    FUZZ_ASSERT(snapshot(c) == with_y(c, before, c.g.y, y2_bits), "the launch with a new x differs from the oracle");
  }

  // 6. Launches that must be refused, writing nothing: a y overlapping x (the prepared or the new
  // one) or an array of the weight, at its start, its last byte or ending on its first byte; an
  // x overlapping the prepared y; a stream on cpu.
  const auto pick = in.take<std::uint8_t>();
  std::vector<std::pair<const void*, std::int64_t>> targets = {{c.g.x, c.x_need}, {x2.data(), c.x_need}};
  for (const auto& a : c.inputs)
    if (a.first) targets.push_back(a);
  if (c.g.workspace && c.g.workspace_bytes > 0) targets.push_back({c.g.workspace, c.g.workspace_bytes});  // the prepared one
  const auto& [tp, tbytes] = targets[pick % targets.size()];
  const auto tu = reinterpret_cast<std::uintptr_t>(tp);
  const std::uintptr_t yu = (pick / 16) % 3 == 0 ? tu : (pick / 16) % 3 == 1 ? tu + tbytes - 1 : tu - c.y_need + 1;
  void* bad_y = reinterpret_cast<void*>(yu);
  const void* x_used = tp == x2.data() ? x2.data() : c.g.x;
  FUZZ_ASSERT(overlaps(bad_y, c.y_need, tp, tbytes), "the harness built no overlap");
  const auto restored = snapshot(c);
  const auto y2_now = y2;
  nf4_status sa = nf4_gemv_prepared_launch(p, x_used == c.g.x ? nullptr : x_used, bad_y, nullptr);
  FUZZ_ASSERT(sa == NF4_ERR_ALIASING, "a launch with y overlapping an input (%d of %zu) gave %d", pick % static_cast<int>(targets.size()),
              targets.size(), sa);
  FUZZ_ASSERT(nf4_last_error(ctx)[0] != '\0', "empty message");
  sa = nf4_gemv_prepared_launch(p, c.g.y, nullptr, nullptr);
  FUZZ_ASSERT(sa == NF4_ERR_ALIASING, "a launch with x = the prepared y gave %d", sa);
  static int stream;
  sa = nf4_gemv_prepared_launch(p, nullptr, nullptr, &stream);
  FUZZ_ASSERT(sa != NF4_OK, "the cpu backend accepted a stream");
  FUZZ_ASSERT(snapshot(c) == restored && y2 == y2_now && x2 == x2_before, "a refused launch wrote to memory");
  ++g_stats.alias_launches;
  ++g_stats.ran;
  if (flags & 1) ++g_stats.ran_arena;
  return 0;
}
