/* An nbdkit filter for benchmarks: every FLUSH waits `flush-delay-us` microseconds before it
 * goes on (a drive whose volatile write cache takes time to flush). nbdkit's delay filter
 * delays reads, writes, zeroes and trims, not flushes. Built by scripts/bench_bitmap.py:
 *   cc -O2 -shared -fPIC -o flushdelay.so flushdelay.c   (needs nbdkit-plugin-dev)
 *   nbdkit --filter=./flushdelay.so file DISK flush-delay-us=2000
 */
#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long delay_us;

static int
flushdelay_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                   const char *key, const char *value)
{
  if (strcmp (key, "flush-delay-us") == 0) {
    delay_us = strtol (value, NULL, 10);
    return 0;
  }
  return next (nxdata, key, value);
}

static int
flushdelay_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  struct timespec ts = { delay_us / 1000000, (delay_us % 1000000) * 1000 };
  nanosleep (&ts, NULL);
  return next->flush (next, flags, err);
}

static struct nbdkit_filter filter = {
  .name = "flushdelay",
  .longname = "uraid benchmark flush delay filter",
  .config = flushdelay_config,
  .flush = flushdelay_flush,
};

NBDKIT_REGISTER_FILTER (filter)
