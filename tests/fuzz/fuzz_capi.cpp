// SPDX-License-Identifier: MIT
// Fuzz target: the C API's validation path against the oracle.
// Input: a flags byte, then up to three tensor descriptions. Every field is either the right
// value, a near miss, or raw fuzz bytes (invalid enums, negative or 2^63-sized counts, NULLs);
// input buffers are allocated with exactly the sizes the description claims (bounded), filled
// with fuzz bytes (NaN, Inf, subnormal absmax...). In "arena" mode all buffers of a tensor share
// one allocation at fuzz-chosen offsets, so the output can overlap its inputs.
// An independent model here decides which checks a description violates. Then:
//  - nf4_validate succeeds exactly when the model finds no violation; on failure its status is
//    one the model found, with a non-empty message;
//  - nf4_dequantize_host / _grouped_host on the cpu backend (or the one NF4_FUZZ_BACKEND names,
//    tests/fuzz/fuzz_backend.h): on success, every output equals
//    cpu::oracle_dequantize's bit for bit and nothing else in the buffers changed; on failure,
//    the same status as validation and no byte of any buffer changed.
#include <algorithm>
#include <cstring>
#include <memory>
#include <set>

#include "tests/fuzz/fuzz_backend.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using namespace nf4::fuzz;

constexpr std::int64_t kMaxBufferBytes = 1 << 19;  // per buffer (claimed larger: not allocated)
// Descriptions claim up to kMaxDescribedNumel elements (with buffers of exactly the claimed
// sizes, so validation sees real pointers and lengths); only those up to kMaxRunNumel are also
// dequantized and compared: 2^15 elements still span several nested blocks and reach every
// vector loop's tail, and larger runs would spend most of the fuzzer's time in the oracle, the
// backend and the comparisons rather than on new inputs.
constexpr std::int64_t kMaxDescribedNumel = 1 << 17;
constexpr std::int64_t kMaxRunNumel = 1 << 15;

// One described tensor with the memory behind it.
struct Case : Memory {
  nf4_tensor t{};
  bool runnable = true;         // every buffer is really as large as claimed
  std::set<int> violations;     // the model's verdict
  std::int64_t out_alloc = 0;
  const char* alias = nullptr;  // the input the output overlaps, if any
};

Case make_case(Bytes& in, bool arena) {
  Case c;
  nf4_tensor& t = c.t;
  // Enums and sizes.
  const std::int32_t qt = set_enum(t.quant_type, in, 2);
  const std::int32_t dt = set_enum(t.out_dtype, in, 3);
  auto sel = in.take<std::uint8_t>() % 16;
  t.numel = sel < 11 ? in.range(1, 3000) : sel < 14 ? in.range(1, kMaxDescribedNumel) : sel < 15 ? in.range(-1, 2) : in.take<std::int64_t>();
  take_block_format(in, t);

  // The right sizes where they are defined (else something harmless, the model knows).
  const WeightSizes ws = weight_sizes(t);
  const bool dtype_ok = dt >= 0 && dt <= 2;
  const std::int64_t es = dt == NF4_DTYPE_F32 ? 4 : 2;
  const std::int64_t out_need = ws.numel_ok ? t.numel * es : 0;

  claim_weight_counts(in, t, ws);
  sel = in.take<std::uint8_t>() % 16;
  t.out_bytes = sel < 10 ? out_need : sel < 15 ? out_need + in.range(-3, 64) : in.take<std::int64_t>();

  // Buffers: packed, absmax, quant_map, nested_absmax, nested_code, offset, out.
  const bool nested_layout = t.nested == 1;
  const std::int64_t elem[7] = {1, nested_layout ? 1 : 4, 4, 4, 4, 4, 1};
  const std::int64_t count[7] = {t.packed_bytes, t.absmax_count, t.quant_map_count, t.nested_absmax_count, t.nested_code_count, 1,
                                 t.out_bytes};
  Buffer b[7];
  std::int64_t arena_bytes = 0;
  const auto ptr_sel = in.take<std::uint8_t>();   // which pointers are NULL (rarely)
  const auto null_sel = in.take<std::uint8_t>();
  for (int i = 0; i < 7; ++i) {
    const bool claimed_ok = count[i] >= 0 && count[i] <= kMaxBufferBytes / elem[i];
    if (!claimed_ok) c.runnable = false;
    b[i].bytes = claimed_ok ? count[i] * elem[i] : 4;
    b[i].null = ptr_sel >= 224 && null_sel % 7 == i;
    if (i == 5) b[i].null = (ptr_sel & 1) != 0;  // nested_offset_ptr is optional: half the time
    if (i == 2 && qt == NF4_QUANT_FP4 && (ptr_sel & 2)) b[i].null = true;  // FP4 may omit quant_map
    b[i].offset = arena ? (in.range(0, arena_bytes + 64) & ~std::int64_t{3}) : 0;
    if (arena) arena_bytes = std::max(arena_bytes, b[i].offset + std::max<std::int64_t>(b[i].bytes, 4));
  }
  const std::vector<std::uint8_t*> ptr = c.place(in, b, 7, arena, arena_bytes);
  c.out_alloc = b[6].bytes;
  set_weight_arrays(t, ptr);
  t.out = ptr[6];

  // The model: every check the description fails (each only where its inputs are defined).
  auto& v = c.violations;
  weight_violations(t, ws, v);
  if (!dtype_ok) v.insert(NF4_ERR_DTYPE);
  if (!t.out) v.insert(NF4_ERR_NULL_POINTER);
  if (ws.numel_ok && dtype_ok && t.out_bytes < out_need) v.insert(NF4_ERR_OUTPUT_TOO_SMALL);
  if (v.empty()) {
    // The output [out, out + numel * size) must not overlap anything the kernels read.
    c.alias = overlapped_weight_array(t.out, out_need, weight_inputs(t, ws));
    if (c.alias) v.insert(NF4_ERR_ALIASING);
  }
  if (!v.empty() || t.numel > kMaxRunNumel) c.runnable = false;
  return c;
}

// The snapshots after the call against the oracle's (same_but_nan_payloads, per buffer).
bool same_as_oracle(const std::vector<Case>& cases, const std::vector<std::vector<std::uint8_t>>& after,
                    const std::vector<std::vector<std::uint8_t>>& expected) {
  if (after.size() != expected.size()) return false;
  std::size_t r = 0;
  for (const auto& c : cases)
    for (const auto& reg : c.regions) {
      const std::size_t out_bytes = static_cast<std::size_t>(c.t.numel) * nf4_dtype_size(c.t.out_dtype);
      if (!same_but_nan_payloads(reg.p, after[r], expected[r], c.t.out, out_bytes, c.t.out_dtype)) return false;
      ++r;
    }
  return true;
}

std::vector<std::vector<std::uint8_t>> snapshot(const std::vector<Case>& cases) {
  std::vector<std::vector<std::uint8_t>> s;
  for (const auto& c : cases)
    for (const auto& r : c.regions) s.emplace_back(r.p, r.p + r.bytes);
  return s;
}

// With NF4_FUZZ_STATS set, prints at exit how many inputs took each path (to check that the
// fuzzer reaches the dequantization and not only the rejections).
struct Stats {
  long invalid = 0, valid_not_run = 0, ran = 0, ran_arena = 0;
  ~Stats() {
    if (std::getenv("NF4_FUZZ_STATS"))
      std::fprintf(stderr, "fuzz_capi paths: invalid %ld, valid but too large to run %ld, ran %ld (arena %ld)\n", invalid,
                   valid_not_run, ran, ran_arena);
  }
} g_stats;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  const auto flags = in.take<std::uint8_t>();
  const std::size_t count = 1 + flags % 3;
  const bool grouped = count > 1 || (flags & 8);
  std::vector<Case> cases;
  for (std::size_t i = 0; i < count; ++i) cases.push_back(make_case(in, (flags >> (4 + i)) & 1));

  // 1. nf4_validate against the model.
  int first_bad = -1;
  nf4_status first_status = NF4_OK;
  for (std::size_t i = 0; i < count; ++i) {
    const nf4_status s = nf4_validate(&cases[i].t);
    const auto& v = cases[i].violations;
    if (v.empty()) {
      FUZZ_ASSERT(s == NF4_OK, "tensor %zu: validation failed (%d: %s) where the model finds nothing wrong", i, s, nf4_last_error(nullptr));
    } else {
      FUZZ_ASSERT(s != NF4_OK, "tensor %zu: validation passed, the model says status %d (overlap: %s)", i, *v.begin(),
                  cases[i].alias ? cases[i].alias : "none");
      FUZZ_ASSERT(v.count(s), "tensor %zu: status %d is not among the model's (first %d): %s", i, s, *v.begin(), nf4_last_error(nullptr));
      FUZZ_ASSERT(nf4_last_error(nullptr)[0] != '\0', "empty message");
      if (first_bad < 0) {
        first_bad = static_cast<int>(i);
        first_status = s;
      }
    }
  }
  if (first_bad < 0 && !std::all_of(cases.begin(), cases.end(), [](const Case& c) { return c.runnable; })) {
    ++g_stats.valid_not_run;
    return 0;
  }

  // 2. The expected outputs: the oracle on a copy of each case's memory.
  std::vector<std::vector<std::uint8_t>> expected;
  const auto before = snapshot(cases);
  if (first_bad < 0) {
    for (auto& c : cases) {
      for (auto& reg : c.regions) {
        std::vector<std::uint8_t> copy(reg.p, reg.p + reg.bytes);
        // Rebase the description's pointers that fall in this region onto the copy.
        nf4_tensor t = c.t;
        const auto rebase = [&](auto* p) -> decltype(p) {
          const auto* b = reinterpret_cast<const std::uint8_t*>(p);
          if (b >= reg.p && b < reg.p + std::max<std::int64_t>(reg.bytes, 1))
            return reinterpret_cast<decltype(p)>(const_cast<std::uint8_t*>(copy.data() + (b - reg.p)));
          return p;
        };
        t.packed = rebase(t.packed);
        t.absmax = rebase(t.absmax);
        t.quant_map = rebase(t.quant_map);
        t.nested_absmax = rebase(t.nested_absmax);
        t.nested_code = rebase(t.nested_code);
        t.nested_offset_ptr = rebase(t.nested_offset_ptr);
        t.out = rebase(t.out);
        if (t.out != c.t.out) nf4::cpu::oracle_dequantize(t);
        expected.push_back(std::move(copy));
      }
    }
  }
  // 3. The C API.
  std::vector<nf4_tensor> ts;
  for (const auto& c : cases) ts.push_back(c.t);
  const nf4_status s = grouped ? nf4_dequantize_grouped_host(target_context(), ts.data(), ts.size())
                               : nf4_dequantize_host(target_context(), ts.data());
  const auto after = snapshot(cases);
  if (first_bad >= 0) {
    FUZZ_ASSERT(s == first_status, "dequantize status %d, validation said %d: %s", s, first_status, nf4_last_error(target_context()));
    FUZZ_ASSERT(nf4_last_error(target_context())[0] != '\0', "empty message");
    FUZZ_ASSERT(before == after, "a failed call wrote to memory");
    ++g_stats.invalid;
    return 0;
  }
  FUZZ_ASSERT(s == NF4_OK, "dequantize failed on a valid description: %s", nf4_last_error(target_context()));
  FUZZ_ASSERT(same_as_oracle(cases, after, expected), "the cpu backend differs from the oracle, or wrote outside the output");
  ++g_stats.ran;
  if (std::any_of(cases.begin(), cases.end(), [](const Case& c) { return c.regions.size() == 1; })) ++g_stats.ran_arena;
  return 0;
}
