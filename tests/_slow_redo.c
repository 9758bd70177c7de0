/* LD_PRELOAD shim for the private database servers of tests (see tests/_private_servers.py):
 * while the file named by $SLOW_REDO_FLAG exists, every write to a file whose path contains
 * $SLOW_REDO_MATCH (the server's log: "ib_logfile", "pg_wal/") waits first, as many
 * milliseconds as the file says. A commit then sits in memory, visible to
 * the other sessions, long enough for a test to kill the server before the commit reaches the
 * log file: what a crash at that instant would lose. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static int is_redo(int fd) {
    char link[64], path[1024];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    const char *match = getenv("SLOW_REDO_MATCH");
    return match != NULL && strstr(path, match) != NULL;
}

static void maybe_wait(int fd) {
    const char *flag = getenv("SLOW_REDO_FLAG");
    if (flag == NULL || !is_redo(fd)) return;
    FILE *f = fopen(flag, "r");
    if (f == NULL) return;
    long wait_ms = 0;
    if (fscanf(f, "%ld", &wait_ms) != 1) wait_ms = 0;
    fclose(f);
    struct timespec ts = {wait_ms / 1000, (wait_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

#define WRAP(name, ret, params, args)                                \
    ret name params {                                                \
        static ret(*real) params;                                    \
        if (!real) real = (ret(*) params)dlsym(RTLD_NEXT, #name);    \
        maybe_wait(fd);                                              \
        return real args;                                            \
    }

WRAP(write, ssize_t, (int fd, const void *buf, size_t n), (fd, buf, n))
WRAP(pwrite, ssize_t, (int fd, const void *buf, size_t n, off_t off), (fd, buf, n, off))
WRAP(pwrite64, ssize_t, (int fd, const void *buf, size_t n, off_t off), (fd, buf, n, off))
WRAP(pwritev, ssize_t, (int fd, const struct iovec *iov, int cnt, off_t off), (fd, iov, cnt, off))
