// SPDX-License-Identifier: MIT
// The C API on the cuda backend: the caller's stream and graph capture (one kernel per call, the
// offset read on the device), back-to-back calls that depend on each other, prepared launches,
// host staging, and bad input refused with nothing written. Without a GPU every case reports a
// visible skip. Fixtures: tests/support/cuda.h.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/oracle.h"
#include "nf4/nf4.hpp"
#include "tests/support/common.h"
#include "tests/support/cuda.h"

using namespace nf4;
using namespace nf4::test;

TEST_CASE("cuda: the caller's stream, one kernel per call, the offset read on the device") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  const TestStream s;
  ctx.set_cuda_stream(s);
  DeviceArena arena(true);
  cpu::QuantizedWeight h = synthetic_weight(3 * 4096 * 64 + 5, NF4_QUANT_NF4, 64, true, 4242);
  float offset = h.nested_offset;
  nf4_tensor ht = h.describe(NF4_DTYPE_BF16);
  ht.nested_offset = 1234.0f;  // must be ignored: the device pointer wins
  ht.nested_offset_ptr = &offset;
  const cpu::QuantizedWeight h2 = synthetic_weight(5000, NF4_QUANT_FP4, 128, false, 4243);
  DeviceCase a(arena, ht, Shifts{}), b(arena, h2.describe(NF4_DTYPE_BF16), Shifts{});
  const nf4_tensor devs[] = {a.dev, b.dev};

  // Captured in global mode: an allocation, a synchronization or work on another stream inside
  // the call would fail the capture. The graph must hold exactly one kernel node.
  cu(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  const nf4_status st = nf4_dequantize_grouped(ctx.get(), devs, 2);
  cudaGraph_t graph = nullptr;
  cu(cudaStreamEndCapture(s, &graph));
  REQUIRE_MESSAGE(st == NF4_OK, std::string(nf4_last_error(ctx.get())));
  std::size_t nodes = 0;
  cu(cudaGraphGetNodes(graph, nullptr, &nodes));
  CHECK(nodes == 1);
  std::vector<cudaGraphNode_t> list(nodes);
  cu(cudaGraphGetNodes(graph, list.data(), &nodes));
  cudaGraphNodeType type{};
  cu(cudaGraphNodeGetType(list[0], &type));
  CHECK(type == cudaGraphNodeTypeKernel);
  cudaGraphExec_t exec = nullptr;
  cu(cudaGraphInstantiate(&exec, graph, 0));
  cu(cudaGraphLaunch(exec, s));
  cu(cudaStreamSynchronize(s));
  CHECK(a.compare() == 0);
  CHECK(b.compare() == 0);

  // A new offset written to the device after capture is what the replay uses.
  offset = offset + 0.03125f;
  cu(cudaMemcpy(const_cast<float*>(a.dev.nested_offset_ptr), &offset, 4, cudaMemcpyHostToDevice));
  cu(cudaGraphLaunch(exec, s));
  cu(cudaStreamSynchronize(s));
  CHECK(a.compare() == 0);  // the oracle reads the same (host) offset value

  cu(cudaGraphExecDestroy(exec));
  cu(cudaGraphDestroy(graph));
  ctx.set_cuda_stream(nullptr);
}

TEST_CASE("cuda: a context on a chosen device takes its stream inside a graph capture (as the torch operator sets it per call)") {
  // The stream's device check must not run a call that invalidates the capture.
  if (!cuda_ready()) return;
  Context ctx = Context::on_device(NF4_BACKEND_CUDA, 0);
  const TestStream s;
  DeviceArena arena(true);
  const cpu::QuantizedWeight h = synthetic_weight(4096 * 64 + 3, NF4_QUANT_NF4, 64, true, 4250);
  DeviceCase a(arena, h.describe(NF4_DTYPE_BF16), Shifts{});
  cu(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  const nf4_status set = nf4_context_set_cuda_stream(ctx.get(), s);
  const nf4_status st = set == NF4_OK ? nf4_dequantize(ctx.get(), &a.dev) : set;
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  REQUIRE_MESSAGE(st == NF4_OK, std::string(nf4_last_error(ctx.get())));
  REQUIRE_MESSAGE(end == cudaSuccess, cudaGetErrorString(end));
  cudaGraphExec_t exec = nullptr;
  cu(cudaGraphInstantiate(&exec, graph, 0));
  cu(cudaGraphLaunch(exec, s));
  cu(cudaStreamSynchronize(s));
  CHECK(a.compare() == 0);
  cu(cudaGraphExecDestroy(exec));
  cu(cudaGraphDestroy(graph));
  ctx.set_cuda_stream(nullptr);
}

TEST_CASE("cuda: back-to-back calls see each other's writes (programmatic dependent launch)") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  const TestStream s;
  ctx.set_cuda_stream(s);
  DeviceArena arena(true);
  // Read after write: call A writes 4 Mi floats; call B reads the last 64 of them as its nested
  // absmax. On sm_90 both are programmatic dependent launches: B's CTAs may be resident while A
  // drains, and must not read before A's writes are visible.
  const std::int64_t na = std::int64_t{4} << 20, nb = 64 * 256 * 64;
  const cpu::QuantizedWeight a = synthetic_weight(na, NF4_QUANT_NF4, 64, false, 71);
  cpu::QuantizedWeight b = synthetic_weight(nb, NF4_QUANT_FP4, 64, true, 72);
  REQUIRE(b.nested_absmax.size() == 64);
  DeviceCase da(arena, a.describe(NF4_DTYPE_F32), Shifts{}), db(arena, b.describe(NF4_DTYPE_BF16), Shifts{});
  std::vector<float> a_out(static_cast<std::size_t>(na));
  cpu::oracle_dequantize(a.describe(NF4_DTYPE_F32, a_out.data(), na * 4));
  std::copy(a_out.end() - 64, a_out.end(), b.nested_absmax.begin());  // what B must see
  db.host = b.describe(NF4_DTYPE_BF16);
  db.dev.nested_absmax = static_cast<const float*>(da.dev.out) + (na - 64);
  // Write after read: call C reads 4 Mi codes; call D then writes its output over the last
  // 128 KiB of C's packed codes, which C's last CTAs read.
  const cpu::QuantizedWeight c = synthetic_weight(std::int64_t{8} << 20, NF4_QUANT_NF4, 64, true, 73);
  const cpu::QuantizedWeight d = synthetic_weight(64 << 10, NF4_QUANT_NF4, 64, true, 74);
  DeviceCase dc(arena, c.describe(NF4_DTYPE_F16), Shifts{}), dd(arena, d.describe(NF4_DTYPE_F16), Shifts{});
  nf4_tensor d_over = dd.dev;
  d_over.out = const_cast<std::uint8_t*>(dc.dev.packed) + c.packed.size() - (128 << 10);
  for (int round = 0; round < 3; ++round) {
    cu(cudaMemsetAsync(da.dev.out, 0xff, static_cast<std::size_t>(na) * 4, s));  // NaN until A writes
    cu(cudaMemcpyAsync(const_cast<std::uint8_t*>(dc.dev.packed), c.packed.data(), c.packed.size(), cudaMemcpyHostToDevice, s));
    ctx.dequantize(da.dev);
    ctx.dequantize(db.dev);
    ctx.dequantize(dc.dev);
    ctx.dequantize(d_over);
    cu(cudaStreamSynchronize(s));
    CHECK_MESSAGE(da.compare() == 0, "round " << round);
    CHECK_MESSAGE(db.compare() == 0, "round " << round << ": B read A's output too early");
    CHECK_MESSAGE(dc.compare() == 0, "round " << round << ": D overwrote C's input too early");
  }
  ctx.set_cuda_stream(nullptr);
}

TEST_CASE("cuda: bad input returns its status and writes nothing") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  DeviceArena arena(true);
  const cpu::QuantizedWeight h = synthetic_weight(1000, NF4_QUANT_NF4, 64, true, 31);
  DeviceCase good(arena, h.describe(NF4_DTYPE_F16), Shifts{}), other(arena, h.describe(NF4_DTYPE_F16), Shifts{});
  const auto untouched = [&](const DeviceCase& c) {
    std::vector<std::uint8_t> got(c.out_bytes);
    cu(cudaMemcpy(got.data(), c.dev.out, got.size(), cudaMemcpyDeviceToHost));
    return std::all_of(got.begin(), got.end(), [](std::uint8_t v) { return v == 0xA5; });
  };
  nf4_tensor bad = other.dev;
  bad.blocksize = 48;
  nf4_tensor pair[] = {good.dev, bad};
  CHECK(nf4_dequantize_grouped(ctx.get(), pair, 2) == NF4_ERR_BLOCKSIZE);
  CHECK(std::string(nf4_last_error(ctx.get())).find("tensor 1") != std::string::npos);
  bad = other.dev;
  bad.out_bytes -= 1;
  CHECK(nf4_dequantize(ctx.get(), &bad) == NF4_ERR_OUTPUT_TOO_SMALL);
  bad = other.dev;
  bad.nested_absmax = reinterpret_cast<const float*>(reinterpret_cast<const std::uint8_t*>(bad.nested_absmax) + 1);
  CHECK(nf4_dequantize(ctx.get(), &bad) == NF4_ERR_INVALID_ARGUMENT);
  CHECK(std::string(nf4_last_error(ctx.get())).find("nested_absmax") != std::string::npos);
  bad = other.dev;
  bad.out = static_cast<std::uint8_t*>(bad.out) + 1;  // not 2-byte aligned for fp16
  CHECK(nf4_dequantize(ctx.get(), &bad) == NF4_ERR_INVALID_ARGUMENT);
  cu(cudaDeviceSynchronize());
  CHECK(untouched(good));
  CHECK(untouched(other));
}

// That the staging buffers are freed on every path is checked by compute-sanitizer's leak check
// (lab/gpu_check.sh, memcheck --leak-check full): free device memory is no measure while other
// test processes create contexts and allocate on the same GPU (ctest -j).
TEST_CASE("cuda: host staging honours out_bytes and writes nothing on failure") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  const cpu::QuantizedWeight h = synthetic_weight(100003, NF4_QUANT_NF4, 64, true, 5);
  std::vector<std::uint16_t> out(100003 + 32, 0x7777), expected(100003);
  cpu::oracle_dequantize(h.describe(NF4_DTYPE_F16, expected.data(), 100003 * 2));
  for (int i = 0; i < 5; ++i) ctx.dequantize_host(h.describe(NF4_DTYPE_F16, out.data(), static_cast<std::int64_t>(out.size() * 2)));
  CHECK(std::equal(expected.begin(), expected.end(), out.begin()));
  CHECK(std::all_of(out.begin() + 100003, out.end(), [](std::uint16_t v) { return v == 0x7777; }));
  // A failing call (bad blocksize) leaves out alone.
  nf4_tensor bad = h.describe(NF4_DTYPE_F16, out.data(), static_cast<std::int64_t>(out.size() * 2));
  bad.blocksize = 3;
  std::fill(out.begin(), out.end(), 0x7777);
  CHECK(nf4_dequantize_host(ctx.get(), &bad) == NF4_ERR_BLOCKSIZE);
  CHECK(std::all_of(out.begin(), out.end(), [](std::uint16_t v) { return v == 0x7777; }));
}

TEST_CASE("cuda: prepared launches on a caller stream, into other outputs, from other inputs; bad addresses refused") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  const TestStream s;
  DeviceArena arena(true);
  const cpu::QuantizedWeight a = synthetic_weight(3 * 4096 * 64 + 77, NF4_QUANT_NF4, 64, true, 81);
  const cpu::QuantizedWeight b = synthetic_weight(3 * 4096 * 64 + 77, NF4_QUANT_NF4, 64, true, 82);
  const cpu::QuantizedWeight c = synthetic_weight(12345, NF4_QUANT_FP4, 128, false, 83);
  for (nf4_dtype d : test::kDTypes) {
    DeviceCase da(arena, a.describe(d), Shifts{}), da2(arena, a.describe(d), Shifts{}), db(arena, b.describe(d), Shifts{});
    DeviceCase dc(arena, c.describe(NF4_DTYPE_F32), Shifts{}), dc2(arena, c.describe(NF4_DTYPE_F32), Shifts{});
    // One tensor.
    nf4_prepared* p = nullptr;
    REQUIRE(nf4_prepare(ctx.get(), &da.dev, 1, &p) == NF4_OK);
    REQUIRE(nf4_prepared_launch(p, nullptr, s) == NF4_OK);
    void* other = da2.dev.out;
    REQUIRE(nf4_prepared_launch(p, &other, s) == NF4_OK);
    nf4_buffers bb{db.dev.packed, db.dev.absmax, db.dev.quant_map, db.dev.nested_absmax, db.dev.nested_code, db.dev.nested_offset_ptr,
                   db.dev.nested_offset, db.dev.out};
    REQUIRE(nf4_prepared_launch_buffers(p, &bb, s) == NF4_OK);
    // Refused before anything is enqueued: an output over the codes, a misaligned output.
    void* over = const_cast<std::uint8_t*>(da.dev.packed);
    CHECK(nf4_prepared_launch(p, &over, s) == NF4_ERR_ALIASING);
    void* misaligned = static_cast<std::uint8_t*>(da2.dev.out) + 1;
    CHECK(nf4_prepared_launch(p, &misaligned, s) == NF4_ERR_INVALID_ARGUMENT);
    cu(cudaStreamSynchronize(s));
    CHECK(da.compare() == 0);
    CHECK(da2.compare() == 0);
    CHECK(db.compare() == 0);
    nf4_prepared_destroy(p);
    // A group of two dtypes (two launches), relaunched into other outputs.
    const nf4_tensor group[2] = {da.dev, dc.dev};
    REQUIRE(nf4_prepare(ctx.get(), group, 2, &p) == NF4_OK);
    void* outs[2] = {da2.dev.out, dc2.dev.out};
    cu(cudaMemsetAsync(da2.dev.out, 0, da2.out_bytes, s));
    REQUIRE(nf4_prepared_launch(p, outs, s) == NF4_OK);
    cu(cudaStreamSynchronize(s));
    CHECK(da2.compare() == 0);
    CHECK(dc2.compare() == 0);
    nf4_prepared_destroy(p);
  }
}

TEST_CASE("cuda: a grouped call refuses an output over another tensor's input of another dtype") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  DeviceArena arena(true);
  const cpu::QuantizedWeight a = synthetic_weight(4096, NF4_QUANT_NF4, 64, false, 91);
  const cpu::QuantizedWeight b = synthetic_weight(4096, NF4_QUANT_NF4, 64, false, 92);
  DeviceCase da(arena, a.describe(NF4_DTYPE_F32), Shifts{}), db(arena, b.describe(NF4_DTYPE_BF16), Shifts{});
  nf4_tensor group[2] = {da.dev, db.dev};
  group[0].out = const_cast<void*>(db.dev.absmax);  // fp32 output over the bf16 tensor's absmax
  CHECK(nf4_dequantize_grouped(ctx.get(), group, 2) == NF4_ERR_ALIASING);
  CHECK(std::string(nf4_last_error(ctx.get())).find("tensor 0: out overlaps tensor 1's absmax") != std::string::npos);
}
