/*
 * A clock shift for redis-server in tests, loaded with LD_PRELOAD: the wall
 * clock (CLOCK_REALTIME, gettimeofday, time) starts at $QW_FAKE_START_US
 * (microseconds since the epoch) when the process loads and runs on in real
 * time. Monotonic clocks are left alone, so Redis's timers behave.
 *
 * Why not libfaketime (Debian's `faketime`): Debian's redis-server links
 * jemalloc, which calls clock_gettime() while libfaketime is still
 * initialising; libfaketime detects the recursion and the server hangs at
 * start (wolfcw/libfaketime#130, #327). This shim reads the real clock with
 * the raw syscall and allocates nothing, so nothing can recurse.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long shift_ns;

static int real_clock(clockid_t id, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, id, ts);
}

__attribute__((constructor)) static void fakeclock_init(void) {
    const char *start = getenv("QW_FAKE_START_US");
    struct timespec now;
    if (start == NULL || real_clock(CLOCK_REALTIME, &now) != 0) {
        return;
    }
    shift_ns = atoll(start) * 1000LL - ((long long)now.tv_sec * 1000000000LL + now.tv_nsec);
}

static void shifted(struct timespec *ts) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + shift_ns;
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int r = real_clock(id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        shifted(ts);
    }
    return r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    (void)tz;
    if (real_clock(CLOCK_REALTIME, &ts) != 0) {
        return -1;
    }
    shifted(&ts);
    tv->tv_sec = ts.tv_sec; /* glibc declares tv nonnull */
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    real_clock(CLOCK_REALTIME, &ts);
    shifted(&ts);
    if (out != NULL) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
