// ggmlref writes blocks of a ggml quantized type and ggml's own
// dequantization of them, for TestGGMLDequantize (tensor/ggml_test.go):
//
//	ggmlref LIBGGML_BASE TYPE NAME SEED NBLOCKS OUT
//
// LIBGGML_BASE is llama.cpp's libggml-base.so (node-llama-cpp's prebuilt
// package has one), TYPE the ggml type id, NAME its dequantize_row_<NAME>.
// The first half of the blocks are ggml's quantization of random normal
// values (ggml_quantize_chunk); the rest are random bytes with random finite
// f16 scales at the offsets given after OUT (byte offsets of the block's f16
// fields). OUT receives the blocks, then NBLOCKS·QK float32 values.
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef size_t (*quantize_fn)(int type, const float* src, void* dst, int64_t start, int64_t nrows, int64_t n_per_row, const float* imatrix);
typedef void (*dequant_fn)(const void* x, float* y, int64_t k);
typedef size_t (*size_fn)(int type);
typedef int64_t (*blck_fn)(int type);

static uint64_t rng;
static uint64_t next(void) {
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}
static double uniform(void) { return (next() >> 11) * (1.0 / 9007199254740992.0); }
static float normal(void) { return (float)(sqrt(-2 * log(uniform() + 1e-300)) * cos(6.283185307179586 * uniform())); }

int main(int argc, char** argv) {
	if (argc < 7) {
		fprintf(stderr, "usage: ggmlref LIB TYPE NAME SEED NBLOCKS OUT [F16 OFFSETS...]\n");
		return 2;
	}
	void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return 1;
	}
	int type = atoi(argv[2]);
	char sym[64];
	snprintf(sym, sizeof sym, "dequantize_row_%s", argv[3]);
	quantize_fn quantize = (quantize_fn)dlsym(h, "ggml_quantize_chunk");
	dequant_fn dequant = (dequant_fn)dlsym(h, sym);
	size_fn type_size = (size_fn)dlsym(h, "ggml_type_size");
	blck_fn blck_size = (blck_fn)dlsym(h, "ggml_blck_size");
	if (!quantize || !dequant || !type_size || !blck_size) {
		fprintf(stderr, "missing symbol (%s): %s\n", sym, dlerror());
		return 1;
	}
	rng = strtoull(argv[4], 0, 10) | 1;
	int nb = atoi(argv[5]);
	int64_t qk = blck_size(type);
	size_t bb = type_size(type);
	unsigned char* blocks = calloc(nb, bb);
	float* src = malloc(sizeof(float) * qk * nb);
	float* out = malloc(sizeof(float) * qk * nb);
	int nq = nb / 2;
	for (int64_t i = 0; i < qk * nq; i++) src[i] = normal() * (float)(0.5 + 2 * uniform());
	if (nq > 0) quantize(type, src, blocks, 0, nq, qk, NULL);
	for (size_t i = bb * nq; i < bb * nb; i++) blocks[i] = (unsigned char)next();
	for (int b = nq; b < nb; b++)
		for (int a = 7; a < argc; a++) {
			// A finite f16: sign, exponent 5..20 (about 2^-10 to 2^5), mantissa.
			uint16_t v = (uint16_t)(((next() & 1) << 15) | ((5 + next() % 16) << 10) | (next() & 0x3ff));
			memcpy(blocks + (size_t)b * bb + atoi(argv[a]), &v, 2);
		}
	dequant(blocks, out, qk * nb);
	FILE* f = fopen(argv[6], "wb");
	if (!f || fwrite(blocks, bb, nb, f) != (size_t)nb || fwrite(out, sizeof(float), qk * nb, f) != (size_t)(qk * nb) ||
	    fwrite(src, sizeof(float), qk * nq, f) != (size_t)(qk * nq) || fclose(f)) {
		fprintf(stderr, "writing %s failed\n", argv[6]);
		return 1;
	}
	return 0;
}
