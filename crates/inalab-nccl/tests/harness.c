/* A stand-in for NCCL that loads the inalab network/CollNet plugin the way NCCL does (dlopen,
 * dlsym of ncclNetPlugin_vN / ncclCollNetPlugin_vN, newest first) and drives it through NCCL's
 * own tables (../nccl/net_v8.h .. net_v12.h), so argument types and struct layouts are NCCL's.
 *
 * Build:  gcc -O1 -Wall -Wextra -Werror -I crates/inalab-nccl/nccl harness.c -o harness -ldl
 *
 * Usage:  harness PLUGIN.so MODE VERSION [RANK NRANKS DIR [TYPE]]
 *
 *   VERSION  8..12 (the table version to use), or "all" (symbols mode only).
 *   MODE
 *   symbols    dlopen (RTLD_NOW|RTLD_LOCAL), dlsym all ten tables, check every name is "inalab"
 *              and the required entry points are set; for VERSION (or each with "all"): init,
 *              devices == 1, getProperties(0) of the net and the CollNet table (HOST pointers,
 *              maxRecvs >= 1, speed > 0, a HOST device; v9+ maxP2pBytes and maxCollBytes > 0;
 *              nothing written past NCCL's struct), v11+ finalize. One line per version.
 *   p2p        RANK 2 DIR. Rank 0 listens, publishes its handle in DIR, accepts, posts one
 *              irecv per message (each into a buffer of the largest size) and checks sizes
 *              and bytes; rank 1 connects and sends messages of 0, 1, 4095, 65536 and 1 MiB+3
 *              bytes, distinct patterns and tags, all in flight at once.
 *   allreduce  RANK NRANKS DIR [TYPE]. One CollNet head: reduceSupport over every type and
 *              op (sum of f32/f16/bf16 only), listen, handle exchange through DIR, connect,
 *              regMr of one send and one recv region, then for f32, f16 and bf16 (or TYPE
 *              alone: f32|f16|bf16) 16 chunks of 131072 elements, at most 8 in flight, and
 *              then 1001 elements and 1 element; every element checked against the exact sum.
 *              Then deregMr, closeColl, closeListen, v11+ finalize.
 *   fallback   0 1 DIR. INALAB_SWITCH must point at a closed port: CollNet connect must
 *              fail (not hang, not crash) within 30 s.
 *
 *   The handle exchange (NCCL's bootstrap allgather): DIR/handle.<rank> written atomically
 *   (a temporary name, then rename), polled for until all exist. Heads also meet at a file
 *   barrier (DIR/done.<rank>) before closing, as an application's last collective precedes
 *   ncclCommDestroy; p2p's sender writes DIR/sent.1 once its sends completed.
 *
 *   Environment: INALAB_SWITCH, INALAB_SCHEME (read by the plugin); HARNESS_WAIT_S (bound of
 *   every wait, default 60); HARNESS_ALARM_S (the whole run, default 110: past it the harness
 *   exits 3 saying where it was).
 *
 *   As NCCL does, isend/irecv of v10+ get pointers to (NULL) profiler handles, not NULL;
 *   init gets a logger that prints to stderr and no profiler callback (NULL).
 *
 *   Exit status: 0 success; 1 a check failed; 2 usage; 3 a timeout. Messages on stderr;
 *   the summary on stdout. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nccl_abi.h"

/* ------------------------------------------------------------------ diagnostics */

static int g_rank = -1;
static const char* g_where = "start";
static double g_wait_s = 60.0;

static void die(const char* fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "harness[rank %d] FAIL (%s): ", g_rank, g_where);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stderr);
  exit(1);
}

static void note(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "harness[rank %d] ", g_rank);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

static void on_alarm(int sig) {
  (void)sig;
  /* Only async-signal-safe calls here. */
  char buf[512];
  int n = snprintf(buf, sizeof buf, "harness[rank %d] TIMEOUT: the whole run took longer than HARNESS_ALARM_S (in: %s)\n",
                   g_rank, g_where);
  if (n > 0) {
    ssize_t w = write(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
    (void)w;
  }
  _exit(3);
}

static const char* level_name(ncclDebugLogLevel l) {
  switch (l) {
    case NCCL_LOG_NONE: return "NONE";
    case NCCL_LOG_VERSION: return "VERSION";
    case NCCL_LOG_WARN: return "WARN";
    case NCCL_LOG_INFO: return "INFO";
    case NCCL_LOG_ABORT: return "ABORT";
    case NCCL_LOG_TRACE: return "TRACE";
  }
  return "?";
}

/* NCCL's ncclDebugLog: what the plugin logs goes to stderr. */
static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt ? fmt : "(null)", ap);
  va_end(ap);
  size_t n = strlen(msg);
  fprintf(stderr, "plugin[rank %d] %s %s:%d (flags 0x%lx) %s%s", g_rank, level_name(level), file ? file : "?", line, flags,
          msg, (n && msg[n - 1] == '\n') ? "" : "\n");
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Polling without starving the plugin's threads or the other heads on a small machine. */
static void backoff(unsigned* spins) {
  if (++*spins < 16) {
    sched_yield();
  } else {
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
  }
}

static const char* res_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    case ncclTimeout: return "ncclTimeout";
    case ncclNumResults: break;
  }
  return "(not an ncclResult_t)";
}

#define CHECK(call)                                                                        \
  do {                                                                                     \
    ncclResult_t res_ = (call);                                                            \
    if (res_ != ncclSuccess) die("%s returned %d (%s)", #call, (int)res_, res_name(res_)); \
  } while (0)

/* ------------------------------------------------------------------ the plugin's tables */

typedef struct {
  int v;            /* 8..12 */
  const void* net;  /* const ncclNet_vN_t* */
  const void* coll; /* const ncclCollNet_vN_t* */
  void* netCtx;     /* v11+ */
  void* collCtx;    /* v11+ */
} plugin_t;

#define NET(n) ((const ncclNet_v##n##_t*)P->net)
#define COLL(n) ((const ncclCollNet_v##n##_t*)P->coll)

/* Calls whose signature is the same in every version. */
#define NET_SAME(call)                          \
  switch (P->v) {                               \
    case 8: return NET(8)->call;                \
    case 9: return NET(9)->call;                \
    case 10: return NET(10)->call;              \
    case 11: return NET(11)->call;              \
    case 12: return NET(12)->call;              \
  }                                             \
  return ncclInternalError
#define COLL_SAME(call)                         \
  switch (P->v) {                               \
    case 8: return COLL(8)->call;               \
    case 9: return COLL(9)->call;               \
    case 10: return COLL(10)->call;             \
    case 11: return COLL(11)->call;             \
    case 12: return COLL(12)->call;             \
  }                                             \
  return ncclInternalError

static void* load_library(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) die("dlopen(%s): %s", path, dlerror());
  return lib;
}

static const void* sym(void* lib, const char* kind, int v, int required) {
  char name[64];
  snprintf(name, sizeof name, "%sPlugin_v%d", kind, v);
  dlerror();
  const void* p = dlsym(lib, name);
  const char* err = dlerror();
  if ((err || !p) && required) die("dlsym(%s): %s", name, err ? err : "NULL");
  return err ? NULL : p;
}

/* Required entry points NCCL calls without checking for NULL. */
#define REQ(T, f) \
  if (!(T)->f) die("%s: entry point %s is NULL", tname, #f)
#define REQ_NET(n)                                          \
  do {                                                      \
    const ncclNet_v##n##_t* t_ = NET(n);                    \
    REQ(t_, init); REQ(t_, devices); REQ(t_, getProperties); \
    REQ(t_, listen); REQ(t_, connect); REQ(t_, accept);     \
    REQ(t_, regMr); REQ(t_, deregMr); REQ(t_, isend);       \
    REQ(t_, irecv); REQ(t_, iflush); REQ(t_, test);         \
    REQ(t_, closeSend); REQ(t_, closeRecv); REQ(t_, closeListen); \
    name = t_->name;                                        \
  } while (0)
#define REQ_COLL(n)                                             \
  do {                                                          \
    const ncclCollNet_v##n##_t* t_ = COLL(n);                   \
    REQ(t_, init); REQ(t_, devices); REQ(t_, getProperties);     \
    REQ(t_, listen); REQ(t_, connect); REQ(t_, reduceSupport);  \
    REQ(t_, regMr); REQ(t_, deregMr); REQ(t_, iallreduce);      \
    REQ(t_, iflush); REQ(t_, test); REQ(t_, closeColl);         \
    REQ(t_, closeListen);                                       \
    name = t_->name;                                            \
  } while (0)

static void check_tables(const plugin_t* P) {
  char tname[64];
  const char* name = NULL;
  snprintf(tname, sizeof tname, "ncclNetPlugin_v%d", P->v);
  switch (P->v) {
    case 8: REQ_NET(8); break;
    case 9: REQ_NET(9); break;
    case 10: REQ_NET(10); break;
    case 11: REQ_NET(11); REQ(NET(11), finalize); break;
    case 12: REQ_NET(12); REQ(NET(12), finalize); break;
  }
  if (!name || strcmp(name, "inalab") != 0) die("%s.name is \"%s\", not \"inalab\"", tname, name ? name : "(null)");
  snprintf(tname, sizeof tname, "ncclCollNetPlugin_v%d", P->v);
  name = NULL;
  switch (P->v) {
    case 8: REQ_COLL(8); break;
    case 9: REQ_COLL(9); break;
    case 10: REQ_COLL(10); break;
    case 11: REQ_COLL(11); REQ(COLL(11), finalize); break;
    case 12: REQ_COLL(12); REQ(COLL(12), finalize); break;
  }
  if (!name || strcmp(name, "inalab") != 0) die("%s.name is \"%s\", not \"inalab\"", tname, name ? name : "(null)");
}

/* Like NCCL's src/plugin/net.cc: the newest table first, down to the one asked for; here every
 * version must be there, and VERSION picks the one driven. */
static plugin_t load_plugin(void* lib, int v) {
  plugin_t p;
  memset(&p, 0, sizeof p);
  p.v = v;
  for (int k = 12; k >= 8; k--) {
    const void* n = sym(lib, "ncclNet", k, 1);
    const void* c = sym(lib, "ncclCollNet", k, 1);
    if (k == v) {
      p.net = n;
      p.coll = c;
    }
  }
  check_tables(&p);
  return p;
}

/* ---- properties, copied out of the version's struct */

typedef struct {
  const char* name;
  int ptrSupport, regIsGlobal, speed, port, maxComms, maxRecvs, netDeviceVersion;
  ncclNetDeviceType netDeviceType;
  float latency;
  int hasMax; /* v9+ */
  size_t maxP2pBytes, maxCollBytes;
} props_t;

#define GUARD_BYTES 64
#define GET_PROPS(T, fn, hasMaxSizes)                                                            \
  do {                                                                                           \
    struct {                                                                                     \
      T p;                                                                                       \
      unsigned char guard[GUARD_BYTES];                                                          \
    } b;                                                                                         \
    memset(&b, 0, sizeof b);                                                                     \
    memset(b.guard, 0xEE, sizeof b.guard);                                                       \
    r = fn(0, &b.p);                                                                             \
    for (int g_ = 0; g_ < GUARD_BYTES; g_++)                                                     \
      if (b.guard[g_] != 0xEE)                                                                   \
        die("getProperties wrote past %s (%zu bytes): byte %d after it changed", #T, sizeof(T), g_); \
    out->name = b.p.name;                                                                        \
    out->ptrSupport = b.p.ptrSupport;                                                            \
    out->regIsGlobal = b.p.regIsGlobal;                                                          \
    out->speed = b.p.speed;                                                                      \
    out->port = b.p.port;                                                                        \
    out->latency = b.p.latency;                                                                  \
    out->maxComms = b.p.maxComms;                                                                \
    out->maxRecvs = b.p.maxRecvs;                                                                \
    out->netDeviceType = b.p.netDeviceType;                                                      \
    out->netDeviceVersion = b.p.netDeviceVersion;                                                \
    hasMaxSizes;                                                                                 \
  } while (0)
#define MAX_SIZES out->hasMax = 1, out->maxP2pBytes = b.p.maxP2pBytes, out->maxCollBytes = b.p.maxCollBytes
#define NO_MAX_SIZES out->hasMax = 0

static ncclResult_t net_props(const plugin_t* P, props_t* out) {
  ncclResult_t r = ncclInternalError;
  memset(out, 0, sizeof *out);
  switch (P->v) {
    case 8: GET_PROPS(ncclNetProperties_v8_t, NET(8)->getProperties, NO_MAX_SIZES); break;
    case 9: GET_PROPS(ncclNetProperties_v9_t, NET(9)->getProperties, MAX_SIZES); break;
    case 10: GET_PROPS(ncclNetProperties_v10_t, NET(10)->getProperties, MAX_SIZES); break;
    case 11: GET_PROPS(ncclNetProperties_v11_t, NET(11)->getProperties, MAX_SIZES); break;
    case 12: GET_PROPS(ncclNetProperties_v12_t, NET(12)->getProperties, MAX_SIZES); break;
  }
  return r;
}

static ncclResult_t coll_props(const plugin_t* P, props_t* out) {
  ncclResult_t r = ncclInternalError;
  memset(out, 0, sizeof *out);
  switch (P->v) {
    case 8: GET_PROPS(ncclNetProperties_v8_t, COLL(8)->getProperties, NO_MAX_SIZES); break;
    case 9: GET_PROPS(ncclNetProperties_v9_t, COLL(9)->getProperties, MAX_SIZES); break;
    case 10: GET_PROPS(ncclNetProperties_v10_t, COLL(10)->getProperties, MAX_SIZES); break;
    case 11: GET_PROPS(ncclNetProperties_v11_t, COLL(11)->getProperties, MAX_SIZES); break;
    case 12: GET_PROPS(ncclNetProperties_v12_t, COLL(12)->getProperties, MAX_SIZES); break;
  }
  return r;
}

static void check_props(const char* what, int v, const props_t* p) {
  if (!(p->ptrSupport & NCCL_PTR_HOST)) die("%s v%d: ptrSupport 0x%x lacks NCCL_PTR_HOST", what, v, p->ptrSupport);
  if (p->ptrSupport != NCCL_PTR_HOST) die("%s v%d: ptrSupport 0x%x is not NCCL_PTR_HOST alone", what, v, p->ptrSupport);
  if (p->maxRecvs < 1) die("%s v%d: maxRecvs %d < 1", what, v, p->maxRecvs);
  if (p->speed <= 0) die("%s v%d: speed %d <= 0", what, v, p->speed);
  if (p->netDeviceType != NCCL_NET_DEVICE_HOST) die("%s v%d: netDeviceType %d is not NCCL_NET_DEVICE_HOST", what, v, (int)p->netDeviceType);
  if (p->hasMax && p->maxP2pBytes == 0) die("%s v%d: maxP2pBytes is 0", what, v);
  if (p->hasMax && p->maxCollBytes == 0) die("%s v%d: maxCollBytes is 0", what, v);
}

/* ---- net (point to point) */

static ncclResult_t net_init(plugin_t* P) {
  switch (P->v) {
    case 8: return NET(8)->init(logger);
    case 9: return NET(9)->init(logger);
    case 10: return NET(10)->init(logger, NULL);
    case 11: {
      ncclNetCommConfig_v11_t cfg = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
      return NET(11)->init(&P->netCtx, 1, &cfg, logger, NULL);
    }
    case 12: {
      ncclNetCommConfig_v12_t cfg = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
      return NET(12)->init(&P->netCtx, 1, &cfg, logger, NULL);
    }
  }
  return ncclInternalError;
}

static ncclResult_t net_devices(const plugin_t* P, int* n) { NET_SAME(devices(n)); }

static ncclResult_t net_listen(const plugin_t* P, void* handle, void** lc) {
  switch (P->v) {
    case 8: return NET(8)->listen(0, handle, lc);
    case 9: return NET(9)->listen(0, handle, lc);
    case 10: return NET(10)->listen(0, handle, lc);
    case 11: return NET(11)->listen(P->netCtx, 0, handle, lc);
    case 12: return NET(12)->listen(P->netCtx, 0, handle, lc);
  }
  return ncclInternalError;
}

static ncclResult_t net_connect(const plugin_t* P, void* handle, void** sc) {
  ncclNetDeviceHandle_v8_t* devh = NULL; /* host: NCCL asks for no device offload */
  switch (P->v) {
    case 8: return NET(8)->connect(0, handle, sc, &devh);
    case 9: return NET(9)->connect(0, handle, sc, &devh);
    case 10: {
      ncclNetCommConfig_v10_t cfg = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
      return NET(10)->connect(0, &cfg, handle, sc, &devh);
    }
    case 11: return NET(11)->connect(P->netCtx, 0, handle, sc, &devh);
    case 12: return NET(12)->connect(P->netCtx, 0, handle, sc, &devh);
  }
  return ncclInternalError;
}

static ncclResult_t net_accept(const plugin_t* P, void* lc, void** rc) {
  ncclNetDeviceHandle_v8_t* devh = NULL;
  NET_SAME(accept(lc, rc, &devh));
}

static ncclResult_t net_regmr(const plugin_t* P, void* comm, void* data, size_t size, void** mh) {
  NET_SAME(regMr(comm, data, size, NCCL_PTR_HOST, mh));
}
static ncclResult_t net_deregmr(const plugin_t* P, void* comm, void* mh) { NET_SAME(deregMr(comm, mh)); }

static ncclResult_t net_isend(const plugin_t* P, void* comm, void* data, size_t size, int tag, void* mh, void** phandle,
                              void** req) {
  switch (P->v) {
    case 8: return NET(8)->isend(comm, data, (int)size, tag, mh, req);
    case 9: return NET(9)->isend(comm, data, size, tag, mh, req);
    case 10: return NET(10)->isend(comm, data, size, tag, mh, phandle, req);
    case 11: return NET(11)->isend(comm, data, size, tag, mh, phandle, req);
    case 12: return NET(12)->isend(comm, data, size, tag, mh, phandle, req);
  }
  return ncclInternalError;
}

/* One receive (n = 1) of at most `size` bytes; the arrays are the caller's stack, as NCCL's. */
static ncclResult_t net_irecv(const plugin_t* P, void* comm, void* data, size_t size, int tag, void* mh, void** phandle,
                              void** req) {
  void* datas[1] = {data};
  int tags[1] = {tag};
  void* mhs[1] = {mh};
  void* phs[1] = {phandle};
  if (P->v == 8) {
    int sizes[1] = {(int)size};
    return NET(8)->irecv(comm, 1, datas, sizes, tags, mhs, req);
  }
  size_t sizes[1] = {size};
  switch (P->v) {
    case 9: return NET(9)->irecv(comm, 1, datas, sizes, tags, mhs, req);
    case 10: return NET(10)->irecv(comm, 1, datas, sizes, tags, mhs, phs, req);
    case 11: return NET(11)->irecv(comm, 1, datas, sizes, tags, mhs, phs, req);
    case 12: return NET(12)->irecv(comm, 1, datas, sizes, tags, mhs, phs, req);
  }
  return ncclInternalError;
}

static ncclResult_t net_iflush(const plugin_t* P, void* comm, void* data, int size, void* mh, void** req) {
  void* datas[1] = {data};
  int sizes[1] = {size};
  void* mhs[1] = {mh};
  NET_SAME(iflush(comm, 1, datas, sizes, mhs, req));
}

static ncclResult_t net_test(const plugin_t* P, void* req, int* done, int* size) { NET_SAME(test(req, done, size)); }
static ncclResult_t net_close_send(const plugin_t* P, void* c) { NET_SAME(closeSend(c)); }
static ncclResult_t net_close_recv(const plugin_t* P, void* c) { NET_SAME(closeRecv(c)); }
static ncclResult_t net_close_listen(const plugin_t* P, void* c) { NET_SAME(closeListen(c)); }

static ncclResult_t net_finalize(const plugin_t* P) {
  switch (P->v) {
    case 11: return NET(11)->finalize(P->netCtx);
    case 12: return NET(12)->finalize(P->netCtx);
  }
  return ncclSuccess;
}

/* ---- CollNet */

static ncclResult_t coll_init(plugin_t* P) {
  switch (P->v) {
    case 8: return COLL(8)->init(logger);
    case 9: return COLL(9)->init(logger);
    case 10: return COLL(10)->init(logger);
    case 11: return COLL(11)->init(&P->collCtx, 1, logger);
    case 12: return COLL(12)->init(&P->collCtx, 1, logger);
  }
  return ncclInternalError;
}

static ncclResult_t coll_devices(const plugin_t* P, int* n) { COLL_SAME(devices(n)); }

static ncclResult_t coll_listen(const plugin_t* P, void* handle, void** lc) {
  switch (P->v) {
    case 8: return COLL(8)->listen(0, handle, lc);
    case 9: return COLL(9)->listen(0, handle, lc);
    case 10: return COLL(10)->listen(0, handle, lc);
    case 11: return COLL(11)->listen(P->collCtx, 0, handle, lc);
    case 12: return COLL(12)->listen(P->collCtx, 0, handle, lc);
  }
  return ncclInternalError;
}

static ncclResult_t coll_connect(const plugin_t* P, void** handles, int nranks, int rank, void* lc, void** cc) {
  COLL_SAME(connect(handles, nranks, rank, lc, cc));
}
static ncclResult_t coll_reduce_support(const plugin_t* P, ncclDataType_t t, ncclRedOp_t op, int* supported) {
  COLL_SAME(reduceSupport(t, op, supported));
}
static ncclResult_t coll_regmr(const plugin_t* P, void* cc, void* data, size_t size, void** mh) {
  COLL_SAME(regMr(cc, data, size, NCCL_PTR_HOST, mh));
}
static ncclResult_t coll_deregmr(const plugin_t* P, void* cc, void* mh) { COLL_SAME(deregMr(cc, mh)); }

static ncclResult_t coll_iallreduce(const plugin_t* P, void* cc, void* send, void* recv, size_t count, ncclDataType_t t,
                                    void* smh, void* rmh, void** req) {
  switch (P->v) {
    case 8: return COLL(8)->iallreduce(cc, send, recv, (int)count, t, ncclSum, smh, rmh, req);
    case 9: return COLL(9)->iallreduce(cc, send, recv, count, t, ncclSum, smh, rmh, req);
    case 10: return COLL(10)->iallreduce(cc, send, recv, count, t, ncclSum, smh, rmh, req);
    case 11: return COLL(11)->iallreduce(cc, send, recv, count, t, ncclSum, smh, rmh, req);
    case 12: return COLL(12)->iallreduce(cc, send, recv, count, t, ncclSum, smh, rmh, req);
  }
  return ncclInternalError;
}

static ncclResult_t coll_test(const plugin_t* P, void* req, int* done, int* size) { COLL_SAME(test(req, done, size)); }
static ncclResult_t coll_close(const plugin_t* P, void* cc) { COLL_SAME(closeColl(cc)); }
static ncclResult_t coll_close_listen(const plugin_t* P, void* lc) { COLL_SAME(closeListen(lc)); }

static ncclResult_t coll_finalize(const plugin_t* P) {
  switch (P->v) {
    case 11: return COLL(11)->finalize(P->collCtx);
    case 12: return COLL(12)->finalize(P->collCtx);
  }
  return ncclSuccess;
}

/* ------------------------------------------------------------------ files in DIR */

static void publish(const char* dir, const char* stem, int rank, const void* data, size_t n) {
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/%s.%d", dir, stem, rank);
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE* f = fopen(tmp, "wb");
  if (!f) die("open %s: %s", tmp, strerror(errno));
  if (n && fwrite(data, 1, n, f) != n) die("write %s: %s", tmp, strerror(errno));
  if (fclose(f) != 0) die("close %s: %s", tmp, strerror(errno));
  if (rename(tmp, path) != 0) die("rename %s -> %s: %s", tmp, path, strerror(errno));
}

/* Waits (bounded) until DIR/stem.<rank> exists, with n bytes; reads them into out. */
static void await_file(const char* dir, const char* stem, int rank, void* out, size_t n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.%d", dir, stem, rank);
  double deadline = now_s() + g_wait_s;
  for (;;) {
    struct stat st;
    if (stat(path, &st) == 0) {
      if ((size_t)st.st_size != n) die("%s has %lld bytes, expected %zu", path, (long long)st.st_size, n);
      if (n) {
        FILE* f = fopen(path, "rb");
        if (!f) die("open %s: %s", path, strerror(errno));
        if (fread(out, 1, n, f) != n) die("read %s: short", path);
        fclose(f);
      }
      return;
    }
    if (now_s() > deadline) die("no %s after %.0f s (did that process start, or die? see its stderr)", path, g_wait_s);
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

static void barrier(const char* dir, const char* stem, int rank, int nranks) {
  publish(dir, stem, rank, "", 0);
  for (int r = 0; r < nranks; r++) await_file(dir, stem, r, NULL, 0);
}

/* ------------------------------------------------------------------ symbols */

static int parse_version(const char* s) {
  char* end;
  long v = strtol(s, &end, 10);
  if (*end || v < 8 || v > 12) return -1;
  return (int)v;
}

static void print_props(const char* what, const props_t* p) {
  printf(" %s{name=%s ptrSupport=0x%x speed=%d maxRecvs=%d maxComms=%d latency=%g devType=%d", what,
         p->name ? p->name : "(null)", p->ptrSupport, p->speed, p->maxRecvs, p->maxComms, (double)p->latency,
         (int)p->netDeviceType);
  if (p->hasMax) printf(" maxP2pBytes=%zu maxCollBytes=%zu", p->maxP2pBytes, p->maxCollBytes);
  printf("}");
}

static int mode_symbols(void* lib, int v) {
  plugin_t P = load_plugin(lib, v);
  int n = -1;
  props_t p;
  g_where = "net init";
  CHECK(net_init(&P));
  CHECK(net_devices(&P, &n));
  if (n != 1) die("ncclNetPlugin_v%d.devices gave %d, expected 1", v, n);
  g_where = "net getProperties";
  CHECK(net_props(&P, &p));
  check_props("net", v, &p);
  printf("v%d: ncclNetPlugin_v%d name=inalab devices=%d", v, v, n);
  print_props("net", &p);
  g_where = "collnet init";
  CHECK(coll_init(&P));
  n = -1;
  CHECK(coll_devices(&P, &n));
  if (n != 1) die("ncclCollNetPlugin_v%d.devices gave %d, expected 1", v, n);
  g_where = "collnet getProperties";
  CHECK(coll_props(&P, &p));
  check_props("collnet", v, &p);
  print_props("collnet", &p);
  printf("\n");
  fflush(stdout);
  g_where = "finalize";
  CHECK(coll_finalize(&P));
  CHECK(net_finalize(&P));
  return 0;
}

/* ------------------------------------------------------------------ p2p */

#define P2P_MSGS 5
static const size_t p2p_sizes[P2P_MSGS] = {0, 1, 4095, 65536, (1u << 20) + 3};
#define P2P_MAX ((size_t)(1u << 20) + 3)

static unsigned char pattern(int msg, size_t j) { return (unsigned char)(j * 131u + (j >> 9) * 7u + (unsigned)msg * 53u + 1u); }
static int p2p_tag(int msg) { return 1000 + 17 * msg; }

static void open_common(plugin_t* P) {
  int n = -1;
  props_t p;
  g_where = "net init";
  CHECK(net_init(P));
  CHECK(net_devices(P, &n));
  if (n != 1) die("devices gave %d, expected 1", n);
  CHECK(net_props(P, &p));
  check_props("net", P->v, &p);
}

static int mode_p2p(void* lib, int v, int rank, int nranks, const char* dir) {
  if (nranks != 2) die("p2p takes NRANKS 2, not %d", nranks);
  plugin_t P = load_plugin(lib, v);
  open_common(&P);
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  void* phandles[P2P_MSGS] = {NULL}; /* NCCL's per-step profiler handles: pointers to NULL */
  unsigned spins = 0;

  if (rank == 0) {
    void* lc = NULL;
    void* rc = NULL;
    memset(handle, 0, sizeof handle);
    g_where = "listen";
    CHECK(net_listen(&P, handle, &lc));
    if (!lc) die("listen gave a NULL listenComm");
    publish(dir, "handle", 0, handle, sizeof handle);
    g_where = "accept";
    double deadline = now_s() + g_wait_s;
    while (!rc) {
      CHECK(net_accept(&P, lc, &rc));
      if (!rc) {
        if (now_s() > deadline) die("accept gave no recvComm within %.0f s", g_wait_s);
        backoff(&spins);
      }
    }
    unsigned char* bufs[P2P_MSGS];
    void* mhs[P2P_MSGS];
    void* reqs[P2P_MSGS] = {NULL};
    int done[P2P_MSGS] = {0};
    int got[P2P_MSGS];
    g_where = "regMr";
    for (int k = 0; k < P2P_MSGS; k++) {
      bufs[k] = malloc(P2P_MAX);
      if (!bufs[k]) die("out of memory");
      memset(bufs[k], 0xCD, P2P_MAX);
      mhs[k] = NULL;
      CHECK(net_regmr(&P, rc, bufs[k], P2P_MAX, &mhs[k]));
      if (!mhs[k]) die("regMr gave a NULL mhandle");
    }
    g_where = "irecv/test";
    int posted = 0, completed = 0;
    deadline = now_s() + g_wait_s;
    spins = 0;
    while (completed < P2P_MSGS) {
      int progress = 0;
      if (posted < P2P_MSGS) {
        void* req = NULL;
        CHECK(net_irecv(&P, rc, bufs[posted], P2P_MAX, p2p_tag(posted), mhs[posted], &phandles[posted], &req));
        if (req) {
          reqs[posted++] = req;
          progress = 1;
        }
      }
      for (int k = 0; k < posted; k++) {
        if (done[k]) continue;
        int d = 0, sz = -1;
        CHECK(net_test(&P, reqs[k], &d, &sz));
        if (d) {
          done[k] = 1;
          got[k] = sz;
          completed++;
          progress = 1;
        }
      }
      if (progress) {
        spins = 0;
      } else {
        if (now_s() > deadline)
          die("%d of %d receives posted, %d complete after %.0f s", posted, P2P_MSGS, completed, g_wait_s);
        backoff(&spins);
      }
    }
    g_where = "check received";
    for (int k = 0; k < P2P_MSGS; k++) {
      if (got[k] < 0 || (size_t)got[k] != p2p_sizes[k])
        die("message %d (tag %d): test gave size %d, sent %zu", k, p2p_tag(k), got[k], p2p_sizes[k]);
      for (size_t j = 0; j < p2p_sizes[k]; j++)
        if (bufs[k][j] != pattern(k, j))
          die("message %d (%zu bytes, tag %d): byte %zu is 0x%02x, sent 0x%02x", k, p2p_sizes[k], p2p_tag(k), j,
              bufs[k][j], pattern(k, j));
      for (size_t j = p2p_sizes[k]; j < P2P_MAX && j < p2p_sizes[k] + 4096; j++)
        if (bufs[k][j] != 0xCD) die("message %d (%zu bytes): the receive wrote byte %zu, past the message", k, p2p_sizes[k], j);
    }
    g_where = "iflush";
    for (int k = 0; k < P2P_MSGS; k++) {
      void* req = NULL;
      CHECK(net_iflush(&P, rc, bufs[k], (int)p2p_sizes[k], mhs[k], &req));
      deadline = now_s() + g_wait_s;
      spins = 0;
      while (req) {
        int d = 0, sz = 0;
        CHECK(net_test(&P, req, &d, &sz));
        if (d) break;
        if (now_s() > deadline) die("iflush did not complete within %.0f s", g_wait_s);
        backoff(&spins);
      }
    }
    g_where = "wait for the sender";
    await_file(dir, "sent", 1, NULL, 0);
    g_where = "close";
    for (int k = 0; k < P2P_MSGS; k++) {
      CHECK(net_deregmr(&P, rc, mhs[k]));
      free(bufs[k]);
    }
    CHECK(net_close_recv(&P, rc));
    CHECK(net_close_listen(&P, lc));
    CHECK(net_finalize(&P));
    size_t total = 0;
    for (int k = 0; k < P2P_MSGS; k++) total += p2p_sizes[k];
    printf("p2p v%d rank 0: received %d messages, %zu bytes, all checked\n", v, P2P_MSGS, total);
  } else if (rank == 1) {
    void* sc = NULL;
    g_where = "await handle.0";
    await_file(dir, "handle", 0, handle, sizeof handle);
    g_where = "connect";
    double deadline = now_s() + g_wait_s;
    while (!sc) {
      CHECK(net_connect(&P, handle, &sc));
      if (!sc) {
        if (now_s() > deadline) die("connect gave no sendComm within %.0f s", g_wait_s);
        backoff(&spins);
      }
    }
    unsigned char* bufs[P2P_MSGS];
    void* mhs[P2P_MSGS];
    void* reqs[P2P_MSGS] = {NULL};
    int done[P2P_MSGS] = {0};
    g_where = "regMr";
    for (int k = 0; k < P2P_MSGS; k++) {
      size_t n = p2p_sizes[k] ? p2p_sizes[k] : 1; /* a real address even for 0 bytes */
      bufs[k] = malloc(n);
      if (!bufs[k]) die("out of memory");
      for (size_t j = 0; j < n; j++) bufs[k][j] = pattern(k, j);
      mhs[k] = NULL;
      CHECK(net_regmr(&P, sc, bufs[k], n, &mhs[k]));
      if (!mhs[k]) die("regMr gave a NULL mhandle");
    }
    g_where = "isend/test";
    int posted = 0, completed = 0;
    deadline = now_s() + g_wait_s;
    spins = 0;
    while (completed < P2P_MSGS) {
      int progress = 0;
      if (posted < P2P_MSGS) {
        void* req = NULL;
        CHECK(net_isend(&P, sc, bufs[posted], p2p_sizes[posted], p2p_tag(posted), mhs[posted], &phandles[posted], &req));
        if (req) {
          reqs[posted++] = req;
          progress = 1;
        }
      }
      for (int k = 0; k < posted; k++) {
        if (done[k]) continue;
        int d = 0, sz = -1;
        CHECK(net_test(&P, reqs[k], &d, &sz));
        if (d) {
          done[k] = 1;
          completed++;
          progress = 1;
        }
      }
      if (progress) {
        spins = 0;
      } else {
        if (now_s() > deadline) die("%d of %d sends posted, %d complete after %.0f s", posted, P2P_MSGS, completed, g_wait_s);
        backoff(&spins);
      }
    }
    publish(dir, "sent", 1, "", 0);
    g_where = "close";
    for (int k = 0; k < P2P_MSGS; k++) {
      CHECK(net_deregmr(&P, sc, mhs[k]));
      free(bufs[k]);
    }
    CHECK(net_close_send(&P, sc));
    CHECK(net_finalize(&P));
    printf("p2p v%d rank 1: sent %d messages\n", v, P2P_MSGS);
  } else {
    die("p2p: RANK must be 0 or 1, not %d", rank);
  }
  return 0;
}

/* ------------------------------------------------------------------ fp16 / bf16 */

static uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to infinity (or is) */
  if (a >= 0x38800000u) { /* a normal half */
    uint32_t h = (a >> 13) - ((uint32_t)(127 - 15) << 10);
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t e = a >> 23;
  if (e < 102) return sign; /* below half the smallest subnormal: zero */
  uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  uint32_t s = 126 - e; /* 14..24 */
  uint32_t h = mant >> s;
  uint32_t rem = mant & ((1u << s) - 1u);
  uint32_t half = 1u << (s - 1);
  if (rem > half || (rem == half && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  uint32_t x;
  if (e == 0) {
    if (m == 0) {
      x = sign;
    } else {
      e = 127 - 15 + 1;
      while (!(m & 0x400u)) {
        m <<= 1;
        e--;
      }
      x = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (e == 31) {
    x = sign | 0x7f800000u | (m << 13);
  } else {
    x = sign | ((e + 127 - 15) << 23) | (m << 13);
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* NaN stays NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

static float bf16_to_f32(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

/* The converters against values whose conversions are known (cheap; run by allreduce). */
static void selftest_converters(void) {
  static const struct { float f; uint16_t h, b; } cases[] = {
      {0.0f, 0x0000, 0x0000},        {-0.0f, 0x8000, 0x8000},     {1.0f, 0x3c00, 0x3f80},
      {-2.25f, 0xc080, 0xc010},      {5.25f, 0x4540, 0x40a8},     {65504.0f, 0x7bff, 0x4780},
      {65520.0f, 0x7c00, 0x4780},    {5.9604645e-08f, 0x0001, 0x3380}, {1.0009765625f, 0x3c01, 0x3f80},
      {1.00048828125f, 0x3c00, 0x3f80}, /* a tie: to even */
      {1.00146484375f, 0x3c02, 0x3f80}, /* a tie: to even, up */
      {3.0517578e-05f, 0x0200, 0x3800},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    if (f32_to_f16(cases[k].f) != cases[k].h)
      die("converter self-test: f32_to_f16(%g) = 0x%04x, expected 0x%04x", (double)cases[k].f, f32_to_f16(cases[k].f), cases[k].h);
    if (f32_to_bf16(cases[k].f) != cases[k].b)
      die("converter self-test: f32_to_bf16(%g) = 0x%04x, expected 0x%04x", (double)cases[k].f, f32_to_bf16(cases[k].f), cases[k].b);
  }
  for (uint32_t h = 0; h < 0x10000u; h++) { /* every finite half round-trips */
    if (((h >> 10) & 0x1fu) == 31) continue;
    if (f32_to_f16(f16_to_f32((uint16_t)h)) != h) die("converter self-test: half 0x%04x does not round-trip", h);
    if (f32_to_bf16(bf16_to_f32((uint16_t)h)) != h && ((h >> 7) & 0xffu) != 0xff)
      die("converter self-test: bf16 0x%04x does not round-trip", h);
  }
}

/* ------------------------------------------------------------------ allreduce */

/* No libm: the build line links libdl alone. */
static double dabs(double x) { return x < 0 ? -x : x; }
static double dmax(double a, double b) { return a > b ? a : b; }

typedef struct {
  const char* name;
  ncclDataType_t type;
  size_t size;
  double rel; /* tolerance: rel * |want| + abs, or rel * max(1, |want|) when abs is 0 */
  double abs;
} dtype_t;

static const dtype_t dtypes[] = {
    {"f32", ncclFloat32, 4, 1e-3, 0.0},
    {"f16", ncclFloat16, 2, 1.0 / 1024.0, 1e-3},
    {"bf16", ncclBfloat16, 2, 1.0 / 128.0, 1e-3},
};

#define CHUNKS 16
#define CHUNK_ELEMS 131072
#define WINDOW 8
#define ODD_COUNT 1001

/* Rank r's value at element i of chunk c: exact in f32, f16 and bf16, and so is the sum. */
static double value(int r, size_t i, int c) { return (double)(((long)((i * 7 + (size_t)c * 3) % 19) - 9)) * 0.25 + r; }

static void store(const dtype_t* t, void* base, size_t idx, double v) {
  float f = (float)v;
  if (t->type == ncclFloat32) {
    memcpy((char*)base + idx * 4, &f, 4);
  } else {
    uint16_t h = t->type == ncclFloat16 ? f32_to_f16(f) : f32_to_bf16(f);
    memcpy((char*)base + idx * 2, &h, 2);
  }
}

static double load(const dtype_t* t, const void* base, size_t idx) {
  if (t->type == ncclFloat32) {
    float f;
    memcpy(&f, (const char*)base + idx * 4, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, (const char*)base + idx * 2, 2);
  return t->type == ncclFloat16 ? f16_to_f32(h) : bf16_to_f32(h);
}

typedef struct {
  size_t offset; /* elements from the start of the registered regions */
  size_t count;
  int c; /* the chunk index in value() */
} op_t;

static const char* type_name(int t) {
  static const char* names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16"};
  return t >= 0 && t < 10 ? names[t] : "?";
}
static const char* op_name(int op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return op >= 0 && op < 5 ? names[op] : "?";
}

/* Issues ops in order, at most WINDOW in flight; checks each one's size when it completes. */
static void run_ops(const plugin_t* P, void* cc, const dtype_t* t, char* send, char* recv, void* smh, void* rmh,
                    const op_t* ops, int nops) {
  void* reqs[WINDOW];
  int slot_op[WINDOW];
  int inflight = 0, next = 0, completed = 0;
  unsigned spins = 0;
  double deadline = now_s() + g_wait_s;
  while (completed < nops) {
    int progress = 0;
    if (inflight < WINDOW && next < nops) {
      const op_t* o = &ops[next];
      void* req = NULL;
      CHECK(coll_iallreduce(P, cc, send + o->offset * t->size, recv + o->offset * t->size, o->count, t->type, smh, rmh, &req));
      if (req) {
        reqs[inflight] = req;
        slot_op[inflight] = next;
        inflight++;
        next++;
        progress = 1;
      }
    }
    for (int s = 0; s < inflight;) {
      int d = 0, sz = -1;
      CHECK(coll_test(P, reqs[s], &d, &sz));
      if (d) {
        const op_t* o = &ops[slot_op[s]];
        if (sz < 0 || (size_t)sz != o->count * t->size)
          die("%s allreduce %d (%zu elements): test gave size %d, expected %zu bytes", t->name, slot_op[s], o->count, sz,
              o->count * t->size);
        reqs[s] = reqs[inflight - 1];
        slot_op[s] = slot_op[inflight - 1];
        inflight--;
        completed++;
        progress = 1;
      } else {
        s++;
      }
    }
    if (progress) {
      spins = 0;
      deadline = now_s() + g_wait_s;
    } else {
      if (now_s() > deadline)
        die("%s: no allreduce completed for %.0f s (%d issued, %d complete, %d in flight)", t->name, g_wait_s, next,
            completed, inflight);
      backoff(&spins);
    }
  }
}

static int mode_allreduce(void* lib, int v, int rank, int nranks, const char* dir, const char* only) {
  if (nranks < 1 || rank < 0 || rank >= nranks) die("RANK %d NRANKS %d", rank, nranks);
  selftest_converters();
  plugin_t P = load_plugin(lib, v);
  int n = -1;
  props_t p;
  g_where = "collnet init";
  CHECK(coll_init(&P));
  CHECK(coll_devices(&P, &n));
  if (n != 1) die("devices gave %d, expected 1", n);
  CHECK(coll_props(&P, &p));
  check_props("collnet", v, &p);

  g_where = "reduceSupport";
  for (int t = 0; t <= 9; t++) {
    for (int op = 0; op < ncclNumOps; op++) {
      int supported = -1;
      CHECK(coll_reduce_support(&P, (ncclDataType_t)t, (ncclRedOp_t)op, &supported));
      int want = op == ncclSum && (t == ncclFloat32 || t == ncclFloat16 || t == ncclBfloat16);
      if (supported != want)
        die("reduceSupport(%s, %s) gave %d, expected %d", type_name(t), op_name(op), supported, want);
    }
  }

  g_where = "listen";
  char* handles = calloc((size_t)nranks, NCCL_NET_HANDLE_MAXSIZE);
  void** hptrs = calloc((size_t)nranks, sizeof(void*));
  if (!handles || !hptrs) die("out of memory");
  void* lc = NULL;
  CHECK(coll_listen(&P, handles + (size_t)rank * NCCL_NET_HANDLE_MAXSIZE, &lc));
  publish(dir, "handle", rank, handles + (size_t)rank * NCCL_NET_HANDLE_MAXSIZE, NCCL_NET_HANDLE_MAXSIZE);
  g_where = "handle exchange";
  for (int r = 0; r < nranks; r++) {
    await_file(dir, "handle", r, handles + (size_t)r * NCCL_NET_HANDLE_MAXSIZE, NCCL_NET_HANDLE_MAXSIZE);
    hptrs[r] = handles + (size_t)r * NCCL_NET_HANDLE_MAXSIZE;
  }
  g_where = "connect";
  void* cc = NULL;
  double t0 = now_s();
  CHECK(coll_connect(&P, hptrs, nranks, rank, lc, &cc));
  if (!cc) die("connect returned ncclSuccess and a NULL collComm");
  note("connected in %.3f s", now_s() - t0);

  g_where = "regMr";
  size_t region = (size_t)CHUNKS * CHUNK_ELEMS * 4; /* the largest type's: f32 */
  char* send = malloc(region);
  char* recv = malloc(region);
  if (!send || !recv) die("out of memory");
  memset(send, 0, region);
  void *smh = NULL, *rmh = NULL;
  CHECK(coll_regmr(&P, cc, send, region, &smh));
  CHECK(coll_regmr(&P, cc, recv, region, &rmh));
  if (!smh || !rmh) die("regMr gave a NULL mhandle");

  op_t ops[CHUNKS + 2];
  for (int c = 0; c < CHUNKS; c++) ops[c] = (op_t){(size_t)c * CHUNK_ELEMS, CHUNK_ELEMS, c};
  ops[CHUNKS] = (op_t){0, ODD_COUNT, CHUNKS};              /* a count that is a multiple of nothing */
  ops[CHUNKS + 1] = (op_t){ODD_COUNT, 1, CHUNKS + 1};      /* one element, at an odd offset */
  const int nops = CHUNKS + 2;

  long long checked_total = 0;
  int ran = 0;
  for (size_t ti = 0; ti < sizeof dtypes / sizeof dtypes[0]; ti++) {
    const dtype_t* t = &dtypes[ti];
    if (only && strcmp(only, t->name) != 0) continue;
    ran++;
    char where[64];
    snprintf(where, sizeof where, "allreduce %s", t->name);
    g_where = where;
    double t1 = now_s();
    /* Phase 1: the 16 chunks. Phase 2: the odd counts (they overlap chunk 0's elements). */
    double max_err = 0.0;
    long long checked = 0;
    for (int phase = 0; phase < 2; phase++) {
      const op_t* list = phase == 0 ? ops : ops + CHUNKS;
      int nlist = phase == 0 ? CHUNKS : 2;
      memset(recv, 0xFF, region); /* NaN in every type: an element never written fails */
      for (int k = 0; k < nlist; k++)
        for (size_t i = 0; i < list[k].count; i++) store(t, send, list[k].offset + i, value(rank, i, list[k].c));
      run_ops(&P, cc, t, send, recv, smh, rmh, list, nlist);
      for (int k = 0; k < nlist; k++) {
        for (size_t i = 0; i < list[k].count; i++) {
          double want = (double)nranks * (value(0, i, list[k].c)) + (double)nranks * (nranks - 1) / 2.0;
          double got = load(t, recv, list[k].offset + i);
          double err = dabs(got - want);
          double tol = t->abs == 0.0 ? t->rel * dmax(1.0, dabs(want)) : t->rel * dabs(want) + t->abs;
          if (!(err <= tol))
            die("%s allreduce of %zu elements (chunk %d), element %zu: got %.9g, expected %.9g (error %.3g > %.3g)", t->name,
                list[k].count, list[k].c, i, got, want, err, tol);
          if (err > max_err) max_err = err;
          checked++;
        }
      }
      if (phase == 1) { /* nothing written past the one-element op */
        double after = load(t, recv, ODD_COUNT + 1);
        if (after == after) /* not NaN */ die("%s: the 1-element allreduce wrote past its element (%.9g)", t->name, after);
      }
    }
    double dt = now_s() - t1;
    printf("allreduce v%d rank %d/%d %s: %d allreduces, %lld elements checked, max error %.3g, %.3f s (%.1f MB/s)\n", v,
           rank, nranks, t->name, nops, checked, max_err, dt, (double)checked * (double)t->size / dt / 1e6);
    fflush(stdout);
    checked_total += checked;
  }
  if (!ran) die("TYPE %s is none of f32, f16, bf16", only);

  g_where = "barrier before close";
  barrier(dir, "done", rank, nranks);
  g_where = "close";
  CHECK(coll_deregmr(&P, cc, smh));
  CHECK(coll_deregmr(&P, cc, rmh));
  CHECK(coll_close(&P, cc));
  CHECK(coll_close_listen(&P, lc));
  CHECK(coll_finalize(&P));
  free(send);
  free(recv);
  free(handles);
  free(hptrs);
  printf("allreduce v%d rank %d/%d: OK, %lld elements checked\n", v, rank, nranks, checked_total);
  return 0;
}

/* ------------------------------------------------------------------ fallback */

static int mode_fallback(void* lib, int v, int rank, int nranks, const char* dir) {
  if (rank != 0 || nranks != 1) die("fallback takes RANK 0 NRANKS 1");
  const char* sw = getenv("INALAB_SWITCH");
  note("fallback: INALAB_SWITCH=%s (expected to be unreachable)", sw ? sw : "(unset)");
  plugin_t P = load_plugin(lib, v);
  int n = -1;
  g_where = "collnet init";
  CHECK(coll_init(&P));
  CHECK(coll_devices(&P, &n));
  g_where = "listen";
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  memset(handle, 0, sizeof handle);
  void* lc = NULL;
  double t0 = now_s();
  CHECK(coll_listen(&P, handle, &lc));
  if (now_s() - t0 > 5.0) die("listen took %.1f s: it must not block", now_s() - t0);
  publish(dir, "handle", 0, handle, sizeof handle);
  void* hptrs[1] = {handle};
  g_where = "connect (expected to fail)";
  void* cc = NULL;
  t0 = now_s();
  ncclResult_t r = coll_connect(&P, hptrs, 1, 0, lc, &cc);
  double dt = now_s() - t0;
  if (r == ncclSuccess) die("connect to an unreachable switch returned ncclSuccess (collComm %p) after %.1f s", cc, dt);
  if (dt > 30.0) die("connect failed (%s) but only after %.1f s (more than 30 s)", res_name(r), dt);
  g_where = "closeListen";
  CHECK(coll_close_listen(&P, lc));
  CHECK(coll_finalize(&P));
  printf("fallback v%d: connect returned %d (%s) after %.3f s\n", v, (int)r, res_name(r), dt);
  return 0;
}

/* ------------------------------------------------------------------ main */

static void usage(void) {
  fprintf(stderr,
          "usage: harness PLUGIN.so symbols VERSION|all\n"
          "       harness PLUGIN.so p2p VERSION RANK 2 DIR\n"
          "       harness PLUGIN.so allreduce VERSION RANK NRANKS DIR [f32|f16|bf16]\n"
          "       harness PLUGIN.so fallback VERSION 0 1 DIR\n"
          "VERSION: 8..12\n");
  exit(2);
}

int main(int argc, char** argv) {
  setvbuf(stderr, NULL, _IOLBF, 0);
  if (argc < 4) usage();
  const char* lib_path = argv[1];
  const char* mode = argv[2];
  const char* e = getenv("HARNESS_WAIT_S");
  if (e && atof(e) > 0) g_wait_s = atof(e);
  int alarm_s = 110;
  e = getenv("HARNESS_ALARM_S");
  if (e && atoi(e) > 0) alarm_s = atoi(e);
  if (strcmp(mode, "fallback") == 0 && alarm_s > 45) alarm_s = 45;
  signal(SIGALRM, on_alarm);
  alarm((unsigned)alarm_s);

  if (strcmp(mode, "symbols") == 0) {
    if (argc != 4) usage();
    void* lib = load_library(lib_path);
    if (strcmp(argv[3], "all") == 0) {
      for (int v = 12; v >= 8; v--) mode_symbols(lib, v);
      return 0;
    }
    int v = parse_version(argv[3]);
    if (v < 0) usage();
    return mode_symbols(lib, v);
  }

  if (argc < 7 || argc > 8) usage();
  int v = parse_version(argv[3]);
  if (v < 0) usage();
  char* end;
  long rank = strtol(argv[4], &end, 10);
  if (*end) usage();
  long nranks = strtol(argv[5], &end, 10);
  if (*end || nranks < 1 || nranks > 4096 || rank < 0 || rank >= nranks) usage();
  g_rank = (int)rank;
  const char* dir = argv[6];
  const char* type = argc == 8 ? argv[7] : NULL;
  if (type && strcmp(mode, "allreduce") != 0) usage();
  void* lib = load_library(lib_path);
  if (strcmp(mode, "p2p") == 0) return mode_p2p(lib, v, (int)rank, (int)nranks, dir);
  if (strcmp(mode, "allreduce") == 0) return mode_allreduce(lib, v, (int)rank, (int)nranks, dir, type);
  if (strcmp(mode, "fallback") == 0) return mode_fallback(lib, v, (int)rank, (int)nranks, dir);
  usage();
  return 2;
}
