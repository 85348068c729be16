/* The plugin tables NCCL reads, laid out by NVIDIA's own declarations (../nccl/net_v8.h ..
 * net_v12.h): one wrapper per version and function, each adapting that version's signature to
 * the plugin's version-free functions in Rust (lib.rs, p2p.rs, coll.rs). Each table is built
 * here typed, so a wrapper whose signature differs from NCCL's field does not compile, and copied
 * at load time into the storage Rust exports under NCCL's symbol names (a Rust cdylib exports
 * only its own symbols). Properties are set here, every value named below. */
#pragma GCC diagnostic error "-Wincompatible-pointer-types"
#include <stdio.h>
#include <string.h>
#include "nccl_abi.h"

/* ---- the Rust side (version-free) ---- */
int inalab_nccl_init(void);
int inalab_nccl_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle);
int inalab_nccl_dereg_mr(void* comm, void* mhandle);
int inalab_nccl_listen(void* handle, void** listenComm);
int inalab_nccl_connect(const void* handle, void** sendComm);
int inalab_nccl_accept(void* listenComm, void** recvComm);
int inalab_nccl_isend(void* sendComm, const void* data, size_t size, int tag, void** request);
int inalab_nccl_irecv(void* recvComm, void* data, size_t size, void** request);
int inalab_nccl_test(void* request, int* done, int* size);
int inalab_nccl_close(void* comm);
int inalab_nccl_close_listen(void* listenComm);
int inalab_coll_listen(void* handle, void** listenComm);
int inalab_coll_connect(void* handles[], int nranks, int rank, void* listenComm, void** collComm);
int inalab_coll_reduce_support(int dataType, int redOp, int* supported);
int inalab_coll_iallreduce(void* collComm, void* sendData, void* recvData, size_t count, int dataType, int redOp, void** request);
int inalab_coll_test(void* request, int* done, int* size);
int inalab_coll_close(void* collComm);
int inalab_coll_close_listen(void* listenComm);

/* ---- properties (one device: the host's path to the switch) ---- */
static char NAME[] = "inalab";
#define SPEED_MBPS 100000    /* what NCCL's tuner assumes of the link: 100 Gbps */
#define MAX_COMMS 65536
#define MAX_RECVS 1          /* no grouped receives: irecv takes n == 1 */
#define GUID 0x696e616c6162ULL /* "inalab" */

#define FILL_COMMON(p)                            \
  do {                                            \
    memset((p), 0, sizeof *(p));                  \
    (p)->name = NAME;                             \
    (p)->pciPath = NULL; /* not a PCI device */   \
    (p)->guid = GUID;                             \
    (p)->ptrSupport = NCCL_PTR_HOST;              \
    (p)->regIsGlobal = 0;                         \
    (p)->speed = SPEED_MBPS;                      \
    (p)->port = 0;                                \
    (p)->latency = 0;                             \
    (p)->maxComms = MAX_COMMS;                    \
    (p)->maxRecvs = MAX_RECVS;                    \
    (p)->netDeviceType = NCCL_NET_DEVICE_HOST;    \
    (p)->netDeviceVersion = 0;                    \
  } while (0)
#define FILL_V9(p)                                \
  do {                                            \
    FILL_COMMON(p);                               \
    (p)->forceFlush = 0;                          \
    (p)->vProps.ndevs = 1;                        \
    (p)->vProps.devs[0] = 0;                      \
    (p)->maxP2pBytes = MAX_NET_SIZE;              \
    (p)->maxCollBytes = MAX_COLLNET_SIZE;         \
  } while (0)

static ncclResult_t props_v8(int dev, ncclNetProperties_v8_t* p) { if (dev != 0 || !p) return ncclInvalidArgument; FILL_COMMON(p); return ncclSuccess; }
static ncclResult_t props_v9(int dev, ncclNetProperties_v9_t* p) { if (dev != 0 || !p) return ncclInvalidArgument; FILL_V9(p); return ncclSuccess; }
static ncclResult_t props_v10(int dev, ncclNetProperties_v10_t* p) { if (dev != 0 || !p) return ncclInvalidArgument; FILL_V9(p); return ncclSuccess; }
static ncclResult_t props_v11(int dev, ncclNetProperties_v11_t* p) { if (dev != 0 || !p) return ncclInvalidArgument; FILL_V9(p); p->maxMultiRequestSize = 1; return ncclSuccess; }
static ncclResult_t props_v12(int dev, ncclNetProperties_v12_t* p) {
  if (dev != 0 || !p) return ncclInvalidArgument;
  FILL_V9(p);
  p->maxMultiRequestSize = 1;
  p->railId = -1; /* NCCL_NET_ID_UNDEF */
  p->planeId = -1;
  return ncclSuccess;
}

/* ---- logging ---- */
static ncclDebugLogger_t logger;

void inalab_nccl_log(int level, const char* msg) {
  if (logger) logger((ncclDebugLogLevel)level, 16 /* NCCL_NET */, __FILE__, __LINE__, "%s", msg);
  else if (level <= NCCL_LOG_WARN) fprintf(stderr, "NCCL inalab plugin: %s\n", msg);
}

static ncclResult_t init_with(ncclDebugLogger_t log) {
  if (log) logger = log;
  return (ncclResult_t)inalab_nccl_init();
}

/* ---- functions every version shares ---- */
static ncclResult_t devices(int* ndev) { if (!ndev) return ncclInvalidArgument; *ndev = 1; return ncclSuccess; }
static ncclResult_t reg_mr(void* comm, void* data, size_t size, int type, void** mh) { return (ncclResult_t)inalab_nccl_reg_mr(comm, data, size, type, mh); }
static ncclResult_t reg_mr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mh) {
  (void)comm; (void)data; (void)size; (void)type; (void)offset; (void)fd; (void)mh;
  return ncclInternalError; /* the properties do not offer NCCL_PTR_DMABUF */
}
static ncclResult_t dereg_mr(void* comm, void* mh) { return (ncclResult_t)inalab_nccl_dereg_mr(comm, mh); }
static ncclResult_t accept_(void* l, void** recvComm, ncclNetDeviceHandle_v8_t** devComm) { (void)devComm; return (ncclResult_t)inalab_nccl_accept(l, recvComm); }
/* Host memory needs no flush: a NULL request tells NCCL there is nothing to wait for. */
static ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mh, void** request) {
  (void)recvComm; (void)n; (void)data; (void)sizes; (void)mh; *request = NULL; return ncclSuccess;
}
static ncclResult_t test(void* request, int* done, int* size) { return (ncclResult_t)inalab_nccl_test(request, done, size); }
static ncclResult_t close_comm(void* comm) { return (ncclResult_t)inalab_nccl_close(comm); }
static ncclResult_t close_listen(void* l) { return (ncclResult_t)inalab_nccl_close_listen(l); }
static ncclResult_t finalize(void* ctx) { (void)ctx; return ncclSuccess; }
static int ctx_token;

/* ---- point-to-point wrappers by version ---- */
static ncclResult_t net_init_v8(ncclDebugLogger_t log) { return init_with(log); }
static ncclResult_t net_init_v10(ncclDebugLogger_t log, ncclProfilerCallback_t prof) { (void)prof; return init_with(log); }
static ncclResult_t net_init_v11(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config, ncclDebugLogger_t log, ncclProfilerCallback_t prof) {
  (void)commId; (void)config; (void)prof; if (ctx) *ctx = &ctx_token; return init_with(log);
}
static ncclResult_t net_init_v12(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config, ncclDebugLogger_t log, ncclProfilerCallback_t prof) {
  (void)commId; (void)config; (void)prof; if (ctx) *ctx = &ctx_token; return init_with(log);
}
static ncclResult_t net_listen(int dev, void* handle, void** l) { (void)dev; return (ncclResult_t)inalab_nccl_listen(handle, l); }
static ncclResult_t net_listen_ctx(void* ctx, int dev, void* handle, void** l) { (void)ctx; return net_listen(dev, handle, l); }
static ncclResult_t net_connect_v8(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v8_t** devComm) {
  (void)dev; (void)devComm; return (ncclResult_t)inalab_nccl_connect(handle, sendComm);
}
static ncclResult_t net_connect_v10(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm, ncclNetDeviceHandle_v10_t** devComm) {
  (void)config; return net_connect_v8(dev, handle, sendComm, devComm);
}
static ncclResult_t net_connect_ctx(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v11_t** devComm) {
  (void)ctx; return net_connect_v8(dev, handle, sendComm, devComm);
}
static ncclResult_t isend_v8(void* c, void* data, int size, int tag, void* mh, void** req) {
  (void)mh; if (size < 0) return ncclInvalidArgument; return (ncclResult_t)inalab_nccl_isend(c, data, (size_t)size, tag, req);
}
static ncclResult_t isend_v9(void* c, void* data, size_t size, int tag, void* mh, void** req) { (void)mh; return (ncclResult_t)inalab_nccl_isend(c, data, size, tag, req); }
static ncclResult_t isend_v10(void* c, void* data, size_t size, int tag, void* mh, void* ph, void** req) { (void)ph; return isend_v9(c, data, size, tag, mh, req); }
static ncclResult_t irecv_v8(void* c, int n, void** data, int* sizes, int* tags, void** mh, void** req) {
  (void)tags; (void)mh; if (n != 1 || sizes[0] < 0) return ncclInvalidArgument; return (ncclResult_t)inalab_nccl_irecv(c, data[0], (size_t)sizes[0], req);
}
static ncclResult_t irecv_v9(void* c, int n, void** data, size_t* sizes, int* tags, void** mh, void** req) {
  (void)tags; (void)mh; if (n != 1) return ncclInvalidArgument; return (ncclResult_t)inalab_nccl_irecv(c, data[0], sizes[0], req);
}
static ncclResult_t irecv_v10(void* c, int n, void** data, size_t* sizes, int* tags, void** mh, void** ph, void** req) { (void)ph; return irecv_v9(c, n, data, sizes, tags, mh, req); }

#define NET_COMMON(ver)                                                                                            \
  .name = NAME, .devices = devices, .getProperties = props_##ver, .accept = accept_, .regMr = reg_mr,              \
  .regMrDmaBuf = reg_mr_dmabuf, .deregMr = dereg_mr, .iflush = iflush, .test = test, .closeSend = close_comm,     \
  .closeRecv = close_comm, .closeListen = close_listen, .getDeviceMr = NULL, .irecvConsumed = NULL

static const ncclNet_v8_t net_v8 = {NET_COMMON(v8), .init = net_init_v8, .listen = net_listen, .connect = net_connect_v8, .isend = isend_v8, .irecv = irecv_v8};
static const ncclNet_v9_t net_v9 = {NET_COMMON(v9), .init = net_init_v8, .listen = net_listen, .connect = net_connect_v8, .isend = isend_v9, .irecv = irecv_v9,
                                    .makeVDevice = NULL};
static const ncclNet_v10_t net_v10 = {NET_COMMON(v10), .init = net_init_v10, .listen = net_listen, .connect = net_connect_v10, .isend = isend_v10,
                                      .irecv = irecv_v10, .makeVDevice = NULL};
static const ncclNet_v11_t net_v11 = {NET_COMMON(v11), .init = net_init_v11, .listen = net_listen_ctx, .connect = net_connect_ctx, .isend = isend_v10,
                                      .irecv = irecv_v10, .makeVDevice = NULL, .finalize = finalize, .setNetAttr = NULL};
static const ncclNet_v12_t net_v12 = {NET_COMMON(v12), .init = net_init_v12, .listen = net_listen_ctx, .connect = net_connect_ctx, .isend = isend_v10,
                                      .irecv = irecv_v10, .makeVDevice = NULL, .finalize = finalize, .setNetAttr = NULL};

/* ---- CollNet wrappers by version ---- */
static ncclResult_t coll_init_v8(ncclDebugLogger_t log) { return init_with(log); }
static ncclResult_t coll_init_v11(void** ctx, uint64_t commId, ncclDebugLogger_t log) { (void)commId; if (ctx) *ctx = &ctx_token; return init_with(log); }
static ncclResult_t coll_listen(int dev, void* handle, void** l) { (void)dev; return (ncclResult_t)inalab_coll_listen(handle, l); }
static ncclResult_t coll_listen_ctx(void* ctx, int dev, void* handle, void** l) { (void)ctx; return coll_listen(dev, handle, l); }
static ncclResult_t coll_connect(void* handles[], int nranks, int rank, void* l, void** collComm) {
  return (ncclResult_t)inalab_coll_connect(handles, nranks, rank, l, collComm);
}
static ncclResult_t coll_reduce_support(ncclDataType_t t, ncclRedOp_t op, int* supported) { return (ncclResult_t)inalab_coll_reduce_support((int)t, (int)op, supported); }
static ncclResult_t iallreduce_v8(void* c, void* s, void* r, int count, ncclDataType_t t, ncclRedOp_t op, void* smh, void* rmh, void** req) {
  (void)smh; (void)rmh; if (count < 0) return ncclInvalidArgument; return (ncclResult_t)inalab_coll_iallreduce(c, s, r, (size_t)count, (int)t, (int)op, req);
}
static ncclResult_t iallreduce_v9(void* c, void* s, void* r, size_t count, ncclDataType_t t, ncclRedOp_t op, void* smh, void* rmh, void** req) {
  (void)smh; (void)rmh; return (ncclResult_t)inalab_coll_iallreduce(c, s, r, count, (int)t, (int)op, req);
}
static ncclResult_t coll_iflush(void* c, void* data, int size, void* mh, void** request) { (void)c; (void)data; (void)size; (void)mh; *request = NULL; return ncclSuccess; }
static ncclResult_t coll_test(void* request, int* done, int* size) { return (ncclResult_t)inalab_coll_test(request, done, size); }
static ncclResult_t coll_close(void* c) { return (ncclResult_t)inalab_coll_close(c); }
static ncclResult_t coll_close_listen(void* l) { return (ncclResult_t)inalab_coll_close_listen(l); }

/* iallgather and ireducescatter stay NULL: NCCL then runs those collectives itself. */
#define COLL_COMMON(ver)                                                                                              \
  .name = NAME, .devices = devices, .getProperties = props_##ver, .connect = coll_connect,                           \
  .reduceSupport = coll_reduce_support, .regMr = reg_mr, .regMrDmaBuf = reg_mr_dmabuf, .deregMr = dereg_mr,         \
  .iallgather = NULL, .ireducescatter = NULL, .iflush = coll_iflush, .test = coll_test, .closeColl = coll_close,     \
  .closeListen = coll_close_listen

static const ncclCollNet_v8_t coll_v8 = {COLL_COMMON(v8), .init = coll_init_v8, .listen = coll_listen, .iallreduce = iallreduce_v8};
static const ncclCollNet_v9_t coll_v9 = {COLL_COMMON(v9), .init = coll_init_v8, .listen = coll_listen, .iallreduce = iallreduce_v9, .makeVDevice = NULL};
static const ncclCollNet_v10_t coll_v10 = {COLL_COMMON(v10), .init = coll_init_v8, .listen = coll_listen, .iallreduce = iallreduce_v9, .makeVDevice = NULL};
static const ncclCollNet_v11_t coll_v11 = {COLL_COMMON(v11), .init = coll_init_v11, .listen = coll_listen_ctx, .iallreduce = iallreduce_v9,
                                           .makeVDevice = NULL, .finalize = finalize};
static const ncclCollNet_v12_t coll_v12 = {COLL_COMMON(v12), .init = coll_init_v11, .listen = coll_listen_ctx, .iallreduce = iallreduce_v9,
                                           .makeVDevice = NULL, .finalize = finalize};

/* ---- the exported storage (lib.rs: 32 pointers each), filled at load ---- */
#define STORAGE 32
extern void* ncclNetPlugin_v8[STORAGE];
extern void* ncclNetPlugin_v9[STORAGE];
extern void* ncclNetPlugin_v10[STORAGE];
extern void* ncclNetPlugin_v11[STORAGE];
extern void* ncclNetPlugin_v12[STORAGE];
extern void* ncclCollNetPlugin_v8[STORAGE];
extern void* ncclCollNetPlugin_v9[STORAGE];
extern void* ncclCollNetPlugin_v10[STORAGE];
extern void* ncclCollNetPlugin_v11[STORAGE];
extern void* ncclCollNetPlugin_v12[STORAGE];

#define FILL(storage, table)                                                          \
  do {                                                                                \
    _Static_assert(sizeof(table) <= sizeof(void*) * STORAGE, "a table over lib.rs's storage"); \
    memcpy(storage, &(table), sizeof(table));                                         \
  } while (0)

static int filled;

__attribute__((constructor)) static void fill_tables(void) {
  FILL(ncclNetPlugin_v8, net_v8);
  FILL(ncclNetPlugin_v9, net_v9);
  FILL(ncclNetPlugin_v10, net_v10);
  FILL(ncclNetPlugin_v11, net_v11);
  FILL(ncclNetPlugin_v12, net_v12);
  FILL(ncclCollNetPlugin_v8, coll_v8);
  FILL(ncclCollNetPlugin_v9, coll_v9);
  FILL(ncclCollNetPlugin_v10, coll_v10);
  FILL(ncclCollNetPlugin_v11, coll_v11);
  FILL(ncclCollNetPlugin_v12, coll_v12);
  filled = 1;
}

int inalab_nccl_tables_filled(void) { return filled; }
