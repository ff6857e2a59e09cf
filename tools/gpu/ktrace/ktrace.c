// ktrace: a CUDA injection library (CUDA_INJECTION64_PATH) that records
// every kernel's start and end on the GPU through CUPTI's activity API
// (concurrent kernels, so graph replays and programmatic dependent launches
// keep their overlap) and appends them to $KTRACE_OUT (default ktrace.csv)
// as "device,stream,start_ns,end_ns,name" lines. A thread flushes CUPTI's
// buffers every 100 ms, since a Go program's exit runs no atexit handler.
// Built on the GPU machine by tools/gpu/ktrace.sh (KREC names the kernel
// record struct of the installed CUPTI); read by tools/gpu/ktrace.py.
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#ifndef KREC
#error "build with -DKREC=CUpti_ActivityKernelN (tools/gpu/ktrace.sh)"
#endif

static FILE *out;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
enum { BUF = 16 << 20 };

static void CUPTIAPI requested(uint8_t **buf, size_t *size, size_t *max) {
	*buf = aligned_alloc(64, BUF);
	*size = *buf ? BUF : 0;
	*max = 0;
}

static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
	CUpti_Activity *r = NULL;
	(void)ctx, (void)stream, (void)size;
	pthread_mutex_lock(&mu);
	while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
		if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
		KREC *k = (KREC *)r;
		fprintf(out, "%u,%u,%llu,%llu,%s\n", k->deviceId, k->streamId, (unsigned long long)k->start,
		        (unsigned long long)k->end, k->name ? k->name : "?");
	}
	size_t dropped = 0;
	if (cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped) == CUPTI_SUCCESS && dropped) fprintf(out, "#dropped,%zu\n", dropped);
	fflush(out);
	pthread_mutex_unlock(&mu);
	free(buf);
}

static void *flusher(void *arg) {
	(void)arg;
	for (;;) {
		usleep(100000);
		cuptiActivityFlushAll(0);
	}
	return NULL;
}

int InitializeInjection(void) {
	const char *path = getenv("KTRACE_OUT");
	out = fopen(path ? path : "ktrace.csv", "w");
	if (!out) return 0;
	if (cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS ||
	    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
		fprintf(out, "#cupti setup failed\n");
		fflush(out);
		return 0;
	}
	pthread_t t;
	pthread_create(&t, NULL, flusher, NULL);
	return 1;
}
