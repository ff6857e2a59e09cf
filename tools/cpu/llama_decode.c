// llama.cpp's batch-1 decode on a GGUF file, without node: a peer for kiln's
// CPU decode speed (tools/cpu/llama-decode.sh builds and runs it).
//   llama_decode MODEL.gguf TOKENS THREADS
// decodes the BOS token, then greedy steps (argmax of the last logits) one
// token at a time: 8 of warm-up, then TOKENS timed ones, and prints
//   {"tokens": N, "seconds": S, "tokens_per_s": R, "threads": T, "first_ids": [...]}
// The ggml CPU variant loaded goes to stderr; LLAMA_DECODE_VERBOSE=1 passes
// llama.cpp's own log through to stderr as well.
//
// Built against node-llama-cpp's prebuilt shared libraries, which ship no
// headers (llama.cpp of @node-llama-cpp/linux-x64@3.22.1, whose source is
// node-llama-cpp/llama/gitRelease.bundle): the declarations below are copied
// by hand from that source's include/llama.h and ggml/include/ggml{,-backend}.h.
//   LIBDIR=/tmp/nlcjs/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
//   gcc -std=c11 -O2 -o llama_decode tools/cpu/llama_decode.c -L$LIBDIR
//       -l:libllama.v0.5.0.so -l:libggml.v0.5.0.so -Wl,-rpath,$LIBDIR
// (one line).
#define _GNU_SOURCE
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// --- llama.cpp / ggml C API, declared by hand ------------------------------

typedef int32_t llama_token;
typedef int32_t llama_pos;
typedef int32_t llama_seq_id;

struct llama_model;
struct llama_context;
struct llama_vocab;

// Opaque and larger than the real structs (a few hundred bytes): on x86-64
// SysV both are passed and returned in memory, so only the size matters to
// the caller, and a larger buffer is safe. No field is touched here.
struct llama_model_params { _Alignas(8) unsigned char b[2048]; };
struct llama_context_params { _Alignas(8) unsigned char b[2048]; };

// Exactly as in llama.h.
struct llama_batch {
	int32_t n_tokens;
	llama_token *token;
	float *embd;
	llama_pos *pos;
	int32_t *n_seq_id;
	llama_seq_id **seq_id;
	int8_t *logits;
};

enum ggml_log_level { GGML_LOG_LEVEL_NONE = 0 }; // values unused here
typedef void (*ggml_log_callback)(enum ggml_log_level level, const char *text, void *user_data);

// libggml
void ggml_backend_load_all(void);
void ggml_backend_load_all_from_path(const char *dir_path);

// libllama
void llama_log_set(ggml_log_callback log_callback, void *user_data);
void llama_backend_init(void);
void llama_backend_free(void);
struct llama_model_params llama_model_default_params(void);
struct llama_context_params llama_context_default_params(void);
struct llama_model *llama_model_load_from_file(const char *path_model, struct llama_model_params params);
void llama_model_free(struct llama_model *model);
struct llama_context *llama_init_from_model(struct llama_model *model, struct llama_context_params params);
void llama_free(struct llama_context *ctx);
uint32_t llama_n_ctx(const struct llama_context *ctx);
void llama_set_n_threads(struct llama_context *ctx, int32_t n_threads, int32_t n_threads_batch);
const struct llama_vocab *llama_model_get_vocab(const struct llama_model *model);
int32_t llama_vocab_n_tokens(const struct llama_vocab *vocab);
llama_token llama_vocab_bos(const struct llama_vocab *vocab);
struct llama_batch llama_batch_get_one(llama_token *tokens, int32_t n_tokens);
int32_t llama_decode(struct llama_context *ctx, struct llama_batch batch);
float *llama_get_logits_ith(struct llama_context *ctx, int32_t i);

// ---------------------------------------------------------------------------

enum { WARM = 8, FIRST = 8 };

static int verbose;
static char loaded[4096]; // ggml's "loaded CPU backend from PATH" lines

static void log_cb(enum ggml_log_level level, const char *text, void *user_data) {
	(void)level, (void)user_data;
	if (verbose)
		fputs(text, stderr);
	if (strstr(text, "loaded ") && strstr(text, " backend from ") &&
	    strlen(loaded) + strlen(text) < sizeof loaded)
		strcat(loaded, text);
}

// The directory of the loaded libggml: ggml_backend_load_all() looks for the
// backend libraries (libggml-cpu-*.so) only next to the executable and in the
// working directory, so they are loaded from libggml's own directory instead.
static int ggml_dir_cb(struct dl_phdr_info *info, size_t size, void *data) {
	(void)size;
	const char *name = info->dlpi_name, *slash = strrchr(name, '/');
	if (slash && strncmp(slash + 1, "libggml.", 8) == 0) {
		size_t n = (size_t)(slash - name);
		if (n >= 4096)
			return 0;
		memcpy(data, name, n);
		((char *)data)[n] = 0;
		return 1;
	}
	return 0;
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static llama_token argmax(const float *v, int32_t n) {
	llama_token best = 0;
	for (int32_t i = 1; i < n; i++)
		if (v[i] > v[best])
			best = i;
	return best;
}

int main(int argc, char **argv) {
	if (argc != 4) {
		fprintf(stderr, "usage: %s MODEL.gguf TOKENS THREADS\n", argv[0]);
		return 2;
	}
	const char *path = argv[1];
	int tokens = atoi(argv[2]), threads = atoi(argv[3]);
	if (tokens <= 0 || threads <= 0) {
		fprintf(stderr, "llama_decode: TOKENS and THREADS must be positive\n");
		return 2;
	}
	const char *v = getenv("LLAMA_DECODE_VERBOSE");
	verbose = v && *v && strcmp(v, "0") != 0;

	llama_log_set(log_cb, NULL); // also sets ggml's logger
	char dir[4096] = "";
	if (dl_iterate_phdr(ggml_dir_cb, dir))
		ggml_backend_load_all_from_path(dir);
	else
		ggml_backend_load_all();
	llama_backend_init();
	if (loaded[0])
		fprintf(stderr, "llama_decode: %s", loaded);
	else
		fprintf(stderr, "llama_decode: no ggml backend library was loaded (from %s)\n", dir[0] ? dir : "default paths");

	// The build has only CPU backends, so the default n_gpu_layers offloads nothing.
	struct llama_model *model = llama_model_load_from_file(path, llama_model_default_params());
	if (!model) {
		fprintf(stderr, "llama_decode: cannot load %s\n", path);
		return 1;
	}
	struct llama_context *ctx = llama_init_from_model(model, llama_context_default_params());
	if (!ctx) {
		fprintf(stderr, "llama_decode: cannot create a context\n");
		llama_model_free(model);
		return 1;
	}
	uint32_t n_ctx = llama_n_ctx(ctx); // 512 by default
	if ((uint64_t)1 + WARM + tokens > n_ctx) {
		fprintf(stderr, "llama_decode: 1 + %d + %d positions exceed the context of %u\n", WARM, tokens, n_ctx);
		return 1;
	}
	llama_set_n_threads(ctx, threads, threads);

	const struct llama_vocab *vocab = llama_model_get_vocab(model);
	int32_t n_vocab = llama_vocab_n_tokens(vocab);
	llama_token tok = llama_vocab_bos(vocab);
	if (tok < 0)
		tok = 0;
	if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) {
		fprintf(stderr, "llama_decode: decoding the BOS token failed\n");
		return 1;
	}
	llama_token first[FIRST];
	double t0 = 0;
	for (int step = 0; step < WARM + tokens; step++) {
		if (step == WARM)
			t0 = now();
		const float *logits = llama_get_logits_ith(ctx, -1);
		if (!logits) {
			fprintf(stderr, "llama_decode: no logits at step %d\n", step);
			return 1;
		}
		tok = argmax(logits, n_vocab);
		if (step < FIRST)
			first[step] = tok;
		int32_t rc = llama_decode(ctx, llama_batch_get_one(&tok, 1));
		if (rc != 0) {
			fprintf(stderr, "llama_decode: llama_decode returned %d at step %d\n", rc, step);
			return 1;
		}
	}
	double s = now() - t0;

	printf("{\"tokens\": %d, \"seconds\": %.6f, \"tokens_per_s\": %.3f, \"threads\": %d, \"first_ids\": [",
	       tokens, s, tokens / s, threads);
	for (int i = 0; i < FIRST; i++)
		printf(i ? ", %d" : "%d", first[i]);
	printf("]}\n");

	llama_free(ctx);
	llama_model_free(model);
	llama_backend_free();
	return 0;
}
