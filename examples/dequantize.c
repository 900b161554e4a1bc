/* SPDX-License-Identifier: MIT */
/*
 * The C API from plain C99: list the backends, create a context, dequantize a small NF4 weight
 * (flat fp32 absmax) from host memory to fp32, print a few values and check them, and show how a
 * wrong description is reported (its own status code and a message naming the field; nothing is
 * written).
 *
 *   nf4_dequantize_example [cpu|cuda|vulkan|auto]      (default: cpu)
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <nf4/nf4.h>

#define NUMEL 200
#define BLOCKSIZE 64
#define BLOCKS ((NUMEL + BLOCKSIZE - 1) / BLOCKSIZE)

/* The standard NF4 table (bitsandbytes' get_4bit_type("nf4")). */
static const float nf4_map[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                                  -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                                  0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f,
                                  0.33791524171829224f, 0.44070982251167297f, 0.5626170039176941f,
                                  0.7229568362236023f, 1.0f};

static int fail(const char* what, nf4_status status, const nf4_context* ctx) {
  fprintf(stderr, "%s: %s (%d): %s\n", what, nf4_status_string(status), (int)status, nf4_last_error(ctx));
  return 1;
}

int main(int argc, char** argv) {
  uint8_t packed[(NUMEL + 1) / 2];
  float absmax[BLOCKS];
  float out[NUMEL];
  nf4_backend_kind kind = NF4_BACKEND_CPU;
  nf4_context* ctx = NULL;
  nf4_tensor t;
  nf4_status s;
  size_t i;
  int64_t e, wrong = 0;

  if (argc > 1 && (s = nf4_backend_parse(argv[1], &kind)) != NF4_OK) return fail("nf4_backend_parse", s, NULL);
  printf("nf4 %s (header %d.%d.%d)\n", nf4_version(), NF4_VERSION_MAJOR, NF4_VERSION_MINOR, NF4_VERSION_PATCH);
  for (i = 0; i < nf4_backend_count(); ++i) {
    nf4_backend_info info;
    if (nf4_backend_get_info(i, &info) == NF4_OK)
      printf("  backend %-6s %s: %s\n", info.name, info.available ? "available  " : "unavailable", info.device_name);
  }

  /* Synthetic codes: element e has code e % 16, its block's absmax is 0.5 * (block + 1). */
  memset(packed, 0, sizeof packed);
  for (e = 0; e < NUMEL; ++e) packed[e / 2] |= (uint8_t)(e % 2 ? e % 16 : (e % 16) << 4);
  for (i = 0; i < BLOCKS; ++i) absmax[i] = 0.5f * (float)(i + 1);

  memset(&t, 0, sizeof t);
  t.quant_type = NF4_QUANT_NF4;
  t.out_dtype = NF4_DTYPE_F32;
  t.numel = NUMEL;
  t.blocksize = BLOCKSIZE;
  t.nested = 0;
  t.packed = packed;
  t.packed_bytes = sizeof packed;
  t.absmax = absmax;
  t.absmax_count = BLOCKS;
  t.quant_map = nf4_map;
  t.quant_map_count = 16;
  t.out = out;
  t.out_bytes = sizeof out;

  if ((s = nf4_context_create(kind, &ctx)) != NF4_OK) return fail("nf4_context_create", s, NULL);
  printf("context on: %s\n", nf4_context_device_name(ctx));
  if ((s = nf4_dequantize_host(ctx, &t)) != NF4_OK) {
    fail("nf4_dequantize_host", s, ctx);
    nf4_context_destroy(ctx);
    return 1;
  }
  /* Each output is fl32(table value * absmax): the same single float multiplication as here. */
  for (e = 0; e < NUMEL; ++e) wrong += out[e] != nf4_map[e % 16] * absmax[e / BLOCKSIZE];
  for (e = 0; e < NUMEL; e += 37)
    printf("  out[%3d] = % .9g   (code %2d, absmax %.1f)\n", (int)e, out[e], (int)(e % 16), absmax[e / BLOCKSIZE]);
  printf("%d elements dequantized, %d differ from the table\n", NUMEL, (int)wrong);

  /* A description with one byte too few: rejected before any work, with its own status. */
  t.packed_bytes -= 1;
  s = nf4_dequantize_host(ctx, &t);
  printf("packed_bytes one short: %s (%d): %s\n", nf4_status_string(s), (int)s, nf4_last_error(ctx));
  nf4_context_destroy(ctx);
  if (s != NF4_ERR_PACKED_SIZE) {
    fprintf(stderr, "expected NF4_ERR_PACKED_SIZE\n");
    return 1;
  }
  return wrong == 0 ? 0 : 1;
}
