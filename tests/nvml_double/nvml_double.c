/* A stand-in for libnvidia-ml.so.1: the NVML C functions the sidecar's probe calls, with GPU
 * memory scripted by the text file named in $NVML_DOUBLE_SCRIPT, re-read on every call so a test
 * can change the GPU between reads. Lines (anything else is ignored):
 *   init_rc <code>                       nvmlInitWithFlags returns <code>
 *   rc <code>                            every device call returns <code> (15: the GPU is lost)
 *   gpu <total> <used> <free> <reserved> <has_v2> <mig> <uuid> <name, rest of line>
 *   proc <gpu index> <pid> <used bytes>
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } mem_v2_t;
typedef struct { unsigned long long total, free, used; } mem_v1_t;
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } proc_t;
typedef void *device_t;

#define MAX_GPUS 8
#define MAX_PROCS 32
static struct { unsigned long long total, used, free, reserved; int v2, mig; char uuid[96], name[96]; } gpus[MAX_GPUS];
static struct { int gpu; unsigned int pid; unsigned long long used; } procs[MAX_PROCS];
static int n_gpus, n_procs, rc, init_rc, initialised;

static void load(void) {
    char line[512];
    const char *path = getenv("NVML_DOUBLE_SCRIPT");
    FILE *f = path ? fopen(path, "r") : NULL;
    n_gpus = n_procs = rc = init_rc = 0;
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (sscanf(line, "init_rc %d", &init_rc) == 1 || sscanf(line, "rc %d", &rc) == 1) continue;
        if (n_gpus < MAX_GPUS && sscanf(line, "gpu %llu %llu %llu %llu %d %d %95s %95[^\n]",
                   &gpus[n_gpus].total, &gpus[n_gpus].used, &gpus[n_gpus].free, &gpus[n_gpus].reserved,
                   &gpus[n_gpus].v2, &gpus[n_gpus].mig, gpus[n_gpus].uuid, gpus[n_gpus].name) == 8) {
            n_gpus++;
        } else if (n_procs < MAX_PROCS && sscanf(line, "proc %d %u %llu", &procs[n_procs].gpu,
                   &procs[n_procs].pid, &procs[n_procs].used) == 3) {
            n_procs++;
        }
    }
    fclose(f);
}

/* A handle is its index + 1, so a null handle never names a GPU. */
static int check(device_t device, int *index) {
    load();
    if (!initialised) return 1;           /* NVML_ERROR_UNINITIALIZED */
    if (rc) return rc;
    *index = (int)(long)device - 1;
    return (*index < 0 || *index >= n_gpus) ? 2 : 0;  /* NVML_ERROR_INVALID_ARGUMENT */
}

int nvmlInitWithFlags(unsigned int flags) { (void)flags; load(); if (init_rc) return init_rc; initialised = 1; return 0; }
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { initialised = 0; return 0; }
const char *nvmlErrorString(int result) { (void)result; return "NVML double error"; }

int nvmlDeviceGetCount_v2(unsigned int *count) {
    load();
    if (!initialised) return 1;
    if (rc) return rc;
    *count = (unsigned int)n_gpus;
    return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, device_t *device) {
    int i;
    int r = check((device_t)(long)(index + 1), &i);
    if (r) return r;
    *device = (device_t)(long)(index + 1);
    return 0;
}

int nvmlDeviceGetHandleByUUID(const char *uuid, device_t *device) {
    int i;
    load();
    if (!initialised) return 1;
    if (rc) return rc;
    for (i = 0; i < n_gpus; i++)
        if (strcmp(gpus[i].uuid, uuid) == 0) { *device = (device_t)(long)(i + 1); return 0; }
    return 6; /* NVML_ERROR_NOT_FOUND */
}

static int copy_text(const char *text, char *out, unsigned int length) {
    if (strlen(text) + 1 > length) return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
    strcpy(out, text);
    return 0;
}

int nvmlDeviceGetName(device_t d, char *name, unsigned int length) {
    int i, r = check(d, &i);
    return r ? r : copy_text(gpus[i].name, name, length);
}

int nvmlDeviceGetUUID(device_t d, char *uuid, unsigned int length) {
    int i, r = check(d, &i);
    return r ? r : copy_text(gpus[i].uuid, uuid, length);
}

int nvmlDeviceGetMemoryInfo(device_t d, mem_v1_t *m) {
    int i, r = check(d, &i);
    if (r) return r;
    m->total = gpus[i].total; m->used = gpus[i].used; m->free = gpus[i].free;
    return 0;
}

int nvmlDeviceGetMemoryInfo_v2(device_t d, mem_v2_t *m) {
    int i, r = check(d, &i);
    if (r) return r;
    if (!gpus[i].v2) return 13; /* NVML_ERROR_FUNCTION_NOT_FOUND, as an older driver */
    if (m->version != 0x02000028) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    m->total = gpus[i].total; m->used = gpus[i].used; m->free = gpus[i].free;
    m->reserved = gpus[i].reserved;
    return 0;
}

int nvmlDeviceGetComputeRunningProcesses_v3(device_t d, unsigned int *count, proc_t *infos) {
    int i, k, n = 0, r = check(d, &i);
    if (r) return r;
    for (k = 0; k < n_procs; k++) if (procs[k].gpu == i) n++;
    if (n == 0) { *count = 0; return 0; }
    if (infos == NULL || *count < (unsigned int)n) { *count = (unsigned int)n; return 7; }
    n = 0;
    for (k = 0; k < n_procs; k++) {
        if (procs[k].gpu != i) continue;
        infos[n].pid = procs[k].pid; infos[n].used = procs[k].used;
        infos[n].gi = infos[n].ci = 0xFFFFFFFF;
        n++;
    }
    *count = (unsigned int)n;
    return 0;
}

int nvmlDeviceGetMigMode(device_t d, unsigned int *current, unsigned int *pending) {
    int i, r = check(d, &i);
    if (r) return r;
    if (gpus[i].mig < 0) return 3; /* NVML_ERROR_NOT_SUPPORTED: no MIG on this GPU */
    *current = *pending = (unsigned int)gpus[i].mig;
    return 0;
}
