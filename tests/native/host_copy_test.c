/* bridge/host_copy.h on its own (tests/test_native_copies.py builds and runs it, also under
 * ThreadSanitizer where the compiler has it): threads copying at once, sizes around the split
 * threshold and thread counts from 1 to past the helpers started, plain and streaming stores into
 * destinations of every alignment, every byte checked, and no byte outside the range written. Prints "ok <copies split> <parts by helpers> <helpers>". */
#include <stdio.h>
#include <stdlib.h>

#include "host_copy.h"

#define CALLERS 6
#define MAX_BYTES ((size_t)6 << 20)

static int failed;

static void *caller(void *arg) {
    long id = (long)arg;
    unsigned seed = (unsigned)id * 7919u + 1u;
    char *src = malloc(MAX_BYTES), *buf = malloc(MAX_BYTES + 17);
    if (src == NULL || buf == NULL) {
        failed = 1;
        return NULL;
    }
    for (size_t i = 0; i < MAX_BYTES; i++) src[i] = (char)rand_r(&seed);
    static const size_t edges[] = {0, 1, 2 * CB_COPY_MIN_PART - 1, 2 * CB_COPY_MIN_PART, 2 * CB_COPY_MIN_PART + 1,
                                   (size_t)1 << 20, MAX_BYTES};
    for (int it = 0; it < 60 && !failed; it++) {
        size_t n = it < 7 ? edges[it] : (size_t)rand_r(&seed) % MAX_BYTES;
        size_t off = (size_t)rand_r(&seed) % (MAX_BYTES - n + 1);   /* a different source each time */
        char *dst = buf + it % 17;   /* destinations of every alignment (streaming stores align first) */
        memset(buf, 0x5a, MAX_BYTES + 17);
        int threads = 1 + (int)((unsigned)rand_r(&seed) % 12);
        cb_host_copy(dst, src + off, n, threads, it % 2);   /* plain and streaming stores */
        if (memcmp(dst, src + off, n) != 0 || dst[n] != 0x5a || (it % 17 && dst[-1] != 0x5a)) {
            fprintf(stderr, "caller %ld: %zu bytes over %d threads differ\n", id, n, threads);
            failed = 1;
        }
    }
    free(src);
    free(buf);
    return NULL;
}

int main(void) {
    pthread_t t[CALLERS];
    for (long i = 0; i < CALLERS; i++) pthread_create(&t[i], NULL, caller, (void *)i);
    for (int i = 0; i < CALLERS; i++) pthread_join(t[i], NULL);
    if (failed) return 1;
    if (g_copy_helpers > 11) {
        fprintf(stderr, "%d helpers started for at most 12 threads\n", g_copy_helpers);
        return 1;
    }
    printf("ok %ld %ld %d\n", atomic_load(&g_copies_split), atomic_load(&g_copy_parts_by_helpers), g_copy_helpers);
    return 0;
}
