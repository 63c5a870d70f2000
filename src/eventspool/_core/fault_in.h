/*
 * Faulting a shared file mapping in writable, its bytes unchanged, for the ring files
 * of the compiled core (ring.pxi, mapped_file.pxi).
 *
 * Once writeback cleaned a page, the kernel makes it read-only in every mapping again,
 * and the next write to it faults: a spare segment is faulted in off the writer's path.
 * MADV_POPULATE_WRITE (Linux 5.14) does it in one call; es_fault_in_writable falls back
 * to writing each page's first byte, which only a caller that no one else writes beside
 * may do. es_fault_in_start does it on a thread of its own, which never takes the
 * interpreter lock (only the madvise: no fallback, as appends may go on meanwhile); the
 * ring joins that thread before it lets go of the mapping.
 */
#ifndef EVENTSPOOL_FAULT_IN_H
#define EVENTSPOOL_FAULT_IN_H

#include <pthread.h>
#include <stddef.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* older kernels refuse it with EINVAL */
#endif

#define ES_FAULT_IN_PAGE 4096

static inline void es_fault_in_writable(char *data, size_t size) {
    if (madvise(data, size, MADV_POPULATE_WRITE) == 0)
        return;
    for (size_t offset = 0; offset < size; offset += ES_FAULT_IN_PAGE)
        ((volatile char *)data)[offset] = ((volatile char *)data)[offset];
}

typedef struct {
    pthread_t thread;
    char *data;
    size_t size;
    int started;
    int done;
} es_fault_in;

static void *es_fault_in_main(void *arg) {
    es_fault_in *job = (es_fault_in *)arg;
    madvise(job->data, job->size, MADV_POPULATE_WRITE);
    __atomic_store_n(&job->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static inline void es_fault_in_join(es_fault_in *job) {
    if (job->started) {
        pthread_join(job->thread, NULL);
        job->started = 0;
    }
}

/* 1 when a thread started; 0 when the last one still runs, or none could start. */
static inline int es_fault_in_start(es_fault_in *job, char *data, size_t size) {
    if (job->started && !__atomic_load_n(&job->done, __ATOMIC_ACQUIRE))
        return 0;
    es_fault_in_join(job);
    job->data = data;
    job->size = size;
    job->done = 0;
    job->started = pthread_create(&job->thread, NULL, es_fault_in_main, job) == 0;
    return job->started;
}

#endif
