/* A stub CUDA driver for counting the crate's own host instructions per node without a GPU
 * (scripts/count-instructions.sh). Every entry point the counted paths call returns success;
 * out-handles get fresh fake non-null values. It runs no device work and checks nothing: only
 * for instruction counts, never for correctness.
 *
 * STUB_TOUCH_KB=N makes each kernel node and kernel launch read and write N KiB of the stub's
 * own memory, as a real driver's work does, evicting what the crate touched from the nearest
 * caches: with it, timing the crate beside raw calls shows what the crate's memory accesses cost
 * after driver work (off by default: instruction counts stay comparable). */
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
static unsigned char* touch_buf;
static size_t touch_len = (size_t)-1;
static void touch(void){
  if (touch_len == (size_t)-1) {
    const char* e = getenv("STUB_TOUCH_KB");
    touch_len = e ? (size_t)atoi(e) * 1024 : 0;
    if (touch_len) touch_buf = calloc(touch_len, 1);
    if (!touch_buf) touch_len = 0;
  }
  for (size_t i = 0; i < touch_len; i += 64) touch_buf[i]++;
}
static uintptr_t next = 0x1000;
static void* fresh(void){ next += 0x40; return (void*)next; }
static __thread void* current = 0;
int cuCtxGetCurrent(void** c){ *c = current; return 0; }
int cuCtxSetCurrent(void* c){ current = c; return 0; }
int cuCtxSynchronize(void){ return 0; }
int cuDeviceGet(int* d, int o){ *d = o; return 0; }
int cuDeviceGetAttribute(int* v, int a, int d){ *v = (a==75)?9:((a==76)?0:1); return 0; }
int cuDeviceGetCount(int* c){ *c = 1; return 0; }
int cuDeviceGetName(char* n, int len, int d){ const char* s="stub"; int i=0; for(;s[i]&&i<len-1;i++) n[i]=s[i]; n[i]=0; return 0; }
int cuDevicePrimaryCtxRelease_v2(void){ return 0; }
int cuDevicePrimaryCtxRetain(void** c, int d){ *c = (void*)0xC0; return 0; }
int cuDriverGetVersion(int* v){ *v = 13000; return 0; }
int cuGetErrorName(int e, const char** s){ *s = "CUDA_ERROR_STUB"; return 0; }
int cuGetErrorString(int e, const char** s){ *s = "stub"; return 0; }
int cuGraphAddKernelNode_v2(void** n, void* g, void* d, size_t k, void* p){ touch(); *n = fresh(); return 0; }
int cuGraphCreate(void** g, unsigned f){ *g = fresh(); return 0; }
int cuGraphDestroy(void){ return 0; }
int cuGraphDestroyNode(void){ return 0; }
int cuInit(void){ return 0; }
int cuModuleGetFunction(void** f, void* m, const char* n){ *f = fresh(); return 0; }
int cuModuleLoadData(void** m, const void* i){ *m = fresh(); return 0; }
int cuModuleUnload(void){ return 0; }
int cuStreamCreate(void** s, unsigned f){ *s = fresh(); return 0; }
int cuStreamDestroy_v2(void){ return 0; }
int cuStreamSynchronize(void){ return 0; }
int cuMemAlloc_v2(uint64_t* p, size_t b){ *p = (uint64_t)fresh(); return 0; }
int cuMemFree_v2(void){ return 0; }
int cuMemsetD8Async(void){ return 0; }
int cuGraphInstantiateWithParams(void** e, void* g, uint64_t* p){ *e = fresh(); ((int*)p)[6] = 0; return 0; }
int cuGraphExecDestroy(void){ return 0; }
int cuGraphLaunch(void){ return 0; }
int cuLaunchHostFunc(void){ return 0; }
int cuStreamQuery(void){ return 0; }
int cuLaunchKernel(void){ touch(); return 0; }
int cuStreamIsCapturing(void* s, int* st){ *st = 0; return 0; }
int cuGraphNodeGetType(void* n, int* t){ *t = 0; return 0; }
int cuStreamBeginCapture_v2(void){ return 0; }
int cuStreamEndCapture(void* s, void** g){ *g = fresh(); return 0; }
/* The driver refuses a null status pointer (CUDA_ERROR_INVALID_VALUE): so does the stub. */
int cuStreamGetCaptureInfo_v3(void* s, int* st, unsigned long long* id, void** g, const void** deps, const void** ed, size_t* nd){ if(!st) return 1; *st=1; if(id)*id=(unsigned long long)fresh(); if(g)*g=fresh(); if(deps)*deps=0; if(ed)*ed=0; if(nd)*nd=0; return 0; }
int cuGraphAddMemsetNode(void** n, void* g, void* d, size_t k, void* p, void* c){ *n = fresh(); return 0; }
int cuGraphExecUpdate_v2(void){ return 0; }
int cuEventCreate(void** e, unsigned f){ *e = fresh(); return 0; }
int cuEventDestroy_v2(void){ return 0; }
int cuEventRecord(void){ return 0; }
int cuStreamWaitEvent(void){ return 0; }
int cuThreadExchangeStreamCaptureMode(int* m){ return 0; }
int cuGraphGetNodes(void* g, void** n, size_t* c){ *c = 0; return 0; }
int cuStreamBeginCaptureToGraph(void){ return 0; }
int cuStreamUpdateCaptureDependencies_v2(void){ return 0; }
int cuGraphAddNode_v2(void){ return 0; }
int cuStreamGetCaptureInfo_v2(void){ return 0; }
int cuMemsetD8_v2(void){ return 0; }
int cuMemGetInfo_v2(size_t* f, size_t* t){ *f = 1u << 30; *t = 1u << 31; return 0; }
