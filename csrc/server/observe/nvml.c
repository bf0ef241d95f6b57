#include "server/observe/nvml.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The few NVML declarations used, from its stable C ABI (nvml.h is not needed to build). */
typedef int nvml_return_t; /* NVML_SUCCESS is 0 */
typedef struct nvml_device_s *nvml_device_t;
typedef struct {
    unsigned int gpu, memory; /* percent */
} nvml_utilization_t;
typedef struct {
    unsigned long long total, free, used; /* bytes */
} nvml_memory_t;

#define OI_MAX_GPUS 64

struct oi_nvml_s {
    void *lib;
    nvml_return_t (*shutdown)(void);
    nvml_return_t (*uuid)(nvml_device_t, char *, unsigned int);
    nvml_return_t (*utilization)(nvml_device_t, nvml_utilization_t *);
    nvml_return_t (*memory)(nvml_device_t, nvml_memory_t *);
    nvml_return_t (*power)(nvml_device_t, unsigned int *);        /* milliwatts */
    nvml_return_t (*power_limit)(nvml_device_t, unsigned int *);  /* milliwatts */
    nvml_return_t (*energy)(nvml_device_t, unsigned long long *); /* millijoules */
    int n;
    nvml_device_t dev[OI_MAX_GPUS];
    char uuids[OI_MAX_GPUS][96];
    unsigned long long energy_start[OI_MAX_GPUS]; /* 0: not read yet */
};

/* Whether NVML device `index` with `uuid` is among CUDA_VISIBLE_DEVICES (every device when it
 * is unset). Entries are indices (NVML's order, which is CUDA's with
 * CUDA_DEVICE_ORDER=PCI_BUS_ID) or UUIDs, also abbreviated ("GPU-8932f937"). */
static int visible(unsigned int index, const char *uuid)
{
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    if (env == NULL)
        return 1;
    char list[512];
    snprintf(list, sizeof(list), "%s", env);
    char *save = NULL;
    for (char *tok = strtok_r(list, ", ", &save); tok != NULL; tok = strtok_r(NULL, ", ", &save)) {
        char *end;
        unsigned long v = strtoul(tok, &end, 10);
        if (*end == '\0' && end != tok) {
            if (v == index)
                return 1;
        } else if (strncmp(tok, "GPU-", 4) == 0 && strncmp(uuid, tok, strlen(tok)) == 0) {
            return 1;
        }
    }
    return 0;
}

#define SYM(field, name) ((*(void **)&nv->field = dlsym(nv->lib, name)) != NULL)

oi_nvml_t *oi_nvml_open(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        return NULL;
    oi_nvml_t *nv = calloc(1, sizeof(*nv));
    if (nv == NULL) {
        dlclose(lib);
        return NULL;
    }
    nv->lib = lib;
    nvml_return_t (*init)(void) = NULL;
    nvml_return_t (*count)(unsigned int *) = NULL;
    nvml_return_t (*by_index)(unsigned int, nvml_device_t *) = NULL;
    *(void **)&init = dlsym(lib, "nvmlInit_v2");
    *(void **)&count = dlsym(lib, "nvmlDeviceGetCount_v2");
    *(void **)&by_index = dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    if (init == NULL || count == NULL || by_index == NULL || !SYM(shutdown, "nvmlShutdown") ||
        !SYM(uuid, "nvmlDeviceGetUUID") || !SYM(utilization, "nvmlDeviceGetUtilizationRates") ||
        !SYM(memory, "nvmlDeviceGetMemoryInfo") || !SYM(power, "nvmlDeviceGetPowerUsage") ||
        !SYM(power_limit, "nvmlDeviceGetPowerManagementLimit") ||
        !SYM(energy, "nvmlDeviceGetTotalEnergyConsumption") || init() != 0) {
        dlclose(lib);
        free(nv);
        return NULL;
    }
    unsigned int total = 0;
    if (count(&total) != 0)
        total = 0;
    for (unsigned int i = 0; i < total && nv->n < OI_MAX_GPUS; i++) {
        nvml_device_t d;
        char uuid[96] = "";
        if (by_index(i, &d) != 0 || nv->uuid(d, uuid, sizeof(uuid)) != 0 || !visible(i, uuid))
            continue;
        nv->dev[nv->n] = d;
        memcpy(nv->uuids[nv->n], uuid, sizeof(uuid));
        unsigned long long mj;
        if (nv->energy(d, &mj) == 0)
            nv->energy_start[nv->n] = mj;
        nv->n++;
    }
    if (nv->n == 0) {
        oi_nvml_close(nv);
        return NULL;
    }
    return nv;
}

int oi_nvml_count(const oi_nvml_t *nv) { return nv ? nv->n : 0; }

void oi_nvml_read(oi_nvml_t *nv, int i, oi_gpu_sample_t *out)
{
    nvml_device_t d = nv->dev[i];
    memcpy(out->uuid, nv->uuids[i], sizeof(out->uuid));
    nvml_utilization_t u;
    out->utilization = nv->utilization(d, &u) == 0 ? u.gpu * 0.01 : -1;
    nvml_memory_t m;
    int mem_ok = nv->memory(d, &m) == 0;
    out->memory_total = mem_ok ? (double)m.total : -1;
    out->memory_used = mem_ok ? (double)m.used : -1;
    unsigned int mw;
    out->power_usage = nv->power(d, &mw) == 0 ? mw * 0.001 : -1;
    out->power_limit = nv->power_limit(d, &mw) == 0 ? mw * 0.001 : -1;
    unsigned long long mj;
    out->energy_joules = -1;
    if (nv->energy(d, &mj) == 0) {
        if (nv->energy_start[i] == 0)
            nv->energy_start[i] = mj;
        out->energy_joules = (double)(mj - nv->energy_start[i]) * 0.001;
    }
}

void oi_nvml_close(oi_nvml_t *nv)
{
    if (nv == NULL)
        return;
    nv->shutdown();
    dlclose(nv->lib);
    free(nv);
}
